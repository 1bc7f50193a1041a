"""The mesh model indexed for translation: services, rules, gateways.

Built once per MeshConfig and shared by every proxy translated from it.
Host names resolve as istiod resolves them: a short name in a rule is
`name.<rule namespace>.svc.cluster.local` when such a service exists;
otherwise the host is taken as written.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mcp26.mesh.resources import MeshConfig, Resource

DOMAIN_SUFFIX = "svc.cluster.local"
MESH_GATEWAY = "mesh"          # the reserved gateway name: sidecars and proxyless clients
ROOT_NAMESPACE = "istio-system"   # MeshConfig.rootNamespace: mesh-wide defaults live here

# Istio port protocols Envoy speaks HTTP to (the others are TCP-level).
HTTP_PROTOCOLS = {"HTTP", "HTTP2", "GRPC", "GRPC-WEB", ""}
H2_PROTOCOLS = {"HTTP2", "GRPC", "GRPC-WEB"}
TCP_PROTOCOLS = {"TCP", "TLS", "MONGO", "MYSQL", "REDIS"}    # Envoy proxies these as bytes


@dataclass(frozen=True)
class ServicePort:
    number: int
    name: str
    protocol: str           # upper case, "" when unspecified
    target_port: int | None


@dataclass
class Endpoint:
    address: str
    ports: dict             # port name -> port
    labels: dict
    weight: int = 0
    locality: str = ""
    service_account: str = ""   # WorkloadEntry / endpoint `serviceAccount` (the SAN mTLS checks)
    namespace: str = ""         # the WorkloadEntry's, else the ServiceEntry's

    def port_for(self, port: ServicePort) -> int:
        return int(self.ports.get(port.name) or port.target_port or port.number)


@dataclass
class Service:
    host: str
    namespace: str
    ports: list[ServicePort]
    resolution: str         # STATIC | DNS | DNS_ROUND_ROBIN | NONE
    endpoints: list[Endpoint]
    source: Resource
    addresses: list[str] = field(default_factory=list)   # VIPs (single addresses, not CIDRs)

    def port(self, number: int) -> ServicePort | None:
        return next((p for p in self.ports if p.number == number), None)


@dataclass
class GatewayServer:
    gateway: Resource
    index: int
    port: int
    protocol: str
    hosts: list[tuple[str, str]]   # (namespace or "*", host)
    port_name: str = ""
    tls: dict = field(default_factory=dict)
    bind: str = ""                  # listener address; "" = TranslateOptions.bind_address

    @property
    def terminates_tls(self) -> bool:
        """HTTPS (SIMPLE or MUTUAL) whose certificate comes from files or from a
        Secret named by credentialName (served over SDS: xds.sds)."""
        mode = str(self.tls.get("mode") or "SIMPLE").upper()
        return (self.protocol == "HTTPS" and mode in ("SIMPLE", "MUTUAL")
                and (bool(self.tls.get("credentialName"))
                     or (bool(self.tls.get("serverCertificate")) and bool(self.tls.get("privateKey")))))


@dataclass
class MeshIndex:
    config: MeshConfig
    services: dict[str, Service] = field(default_factory=dict)
    # host -> DestinationRules naming it (config order); wildcard hosts apart.
    destination_rules: dict[str, list[Resource]] = field(default_factory=dict)
    dr_wildcards: list[tuple[str, list[Resource]]] = field(default_factory=list)
    proxy_namespace: str | None = None      # set for a per-namespace view (DR precedence)
    gateways: list[Resource] = field(default_factory=list)
    virtual_services: list[Resource] = field(default_factory=list)
    uses_source_labels: bool = False
    memo: dict = field(default_factory=dict)      # per-config memo of derived values
    vs_by_ref: dict[str, Resource] = field(default_factory=dict)   # 'ns/name' -> VirtualService
    # VirtualServices for `mesh` by resolved host, and the wildcard ones.
    mesh_vs_exact: dict[str, list[Resource]] = field(default_factory=dict)
    mesh_vs_wildcard: list[tuple[str, Resource]] = field(default_factory=list)

    # -- hosts -----------------------------------------------------------
    def resolve(self, host: str, namespace: str) -> str:
        host = str(host)
        if host in self.services or "." in host or host == "*":
            return host
        fqdn = f"{host}.{namespace}.{DOMAIN_SUFFIX}"
        return fqdn if fqdn in self.services else host

    def destination_rule(self, host: str) -> Resource | None:
        """The rule for `host`, as istiod picks it: in the proxy's namespace,
        else the service's, else the root namespace, else any -- and within
        each, an exact host before the most specific wildcard."""
        memo = self.memo.setdefault("destination_rule", {})
        if host not in memo:
            svc = self.services.get(host)
            memo[host] = None
            for ns in (self.proxy_namespace, svc.namespace if svc else None, ROOT_NAMESPACE, None):
                found = self._most_specific(host, ns)
                if found is not None:
                    memo[host] = found
                    break
        return memo[host]

    def _most_specific(self, host: str, namespace: str | None) -> Resource | None:
        def mine(rules):
            return next((dr for dr in rules if namespace is None or dr.namespace == namespace), None)
        exact = mine(self.destination_rules.get(host, ()))
        if exact is not None:
            return exact
        best = None
        for pattern, rules in self.dr_wildcards:
            dr = mine(rules) if host_matches(host, pattern) else None
            if dr is not None and (best is None or len(pattern) > len(best[0])):
                best = (pattern, dr)
        return best[1] if best else None

    @property
    def destination_rules_by_namespace(self) -> bool:
        """Whether some host has rules in several namespaces (then what a
        proxy gets depends on its own namespace)."""
        groups = list(self.destination_rules.values()) + [c for _, c in self.dr_wildcards]
        return any(len({dr.namespace for dr in c}) > 1 for c in groups)

    def virtual_service(self, namespace: str, name: str) -> Resource | None:
        return self.vs_by_ref.get(f"{namespace}/{name}")

    # -- gateways --------------------------------------------------------
    def gateway_ref(self, name: str, namespace: str) -> str:
        """`gw` or `ns/gw` as a VirtualService names it -> 'ns/gw' (or 'mesh')."""
        if name == MESH_GATEWAY:
            return MESH_GATEWAY
        return name if "/" in name else f"{namespace}/{name}"

    def selected_gateways(self, labels: dict) -> list[Resource]:
        out = []
        for gw in self.gateways:
            selector = gw.spec.get("selector") or {}
            if all(labels.get(k) == str(v) for k, v in selector.items()):
                out.append(gw)
        return out

    def servers(self, gateways: list[Resource]) -> list[GatewayServer]:
        out = []
        for gw in gateways:
            for i, srv in enumerate(gw.spec.get("servers") or []):
                port = srv.get("port") or {}
                hosts = []
                for h in srv.get("hosts") or []:
                    ns, _, host = str(h).rpartition("/")
                    ns = gw.namespace if ns == "." else (ns or "*")
                    hosts.append((ns, host))
                out.append(GatewayServer(gw, i, int(port.get("number") or 0),
                                         str(port.get("protocol") or "").upper(), hosts,
                                         str(port.get("name") or ""), dict(srv.get("tls") or {}),
                                         "" if str(srv.get("bind") or "").startswith("unix:") else str(srv.get("bind") or "")))
        return out

    def vs_gateways(self, vs: Resource) -> set[str]:
        names = vs.spec.get("gateways") or [MESH_GATEWAY]
        return {self.gateway_ref(str(n), vs.namespace) for n in names}


def host_matches(host: str, pattern: str) -> bool:
    """Istio host wildcard semantics: '*' matches all, '*.a.com' any 'x.a.com'."""
    if pattern == "*" or host == pattern:
        return True
    if pattern.startswith("*"):
        return host.endswith(pattern[1:])
    return False


def host_intersection(a: str, b: str) -> str | None:
    """The more specific of two hosts when they overlap (gateway ∩ VirtualService)."""
    if host_matches(a, b):
        return a
    if host_matches(b, a):
        return b
    return None


EXPORTABLE = ("ServiceEntry", "VirtualService", "DestinationRule")


def exported_to(res: Resource, namespace: str) -> bool:
    """Istio's exportTo: '*' every namespace (the default), '.' the resource's
    own, a name that namespace, '~' none."""
    export = res.spec.get("exportTo") if res.kind in EXPORTABLE else None
    if export is None:
        return True
    return any(str(e) == "*" or str(e) == namespace or (str(e) == "." and res.namespace == namespace)
               for e in export)


def labels_match(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == str(v) for k, v in (selector or {}).items())


def _ports(spec: dict) -> list[ServicePort]:
    out = []
    for p in spec.get("ports") or []:
        if not isinstance(p, dict) or p.get("number") is None:
            continue
        target = p.get("targetPort")
        out.append(ServicePort(int(p["number"]), str(p.get("name") or ""),
                               str(p.get("protocol") or "").upper(), int(target) if target else None))
    return out


def _endpoint(spec: dict) -> Endpoint:
    return Endpoint(address=str(spec.get("address") or ""),
                    ports={str(k): int(v) for k, v in (spec.get("ports") or {}).items()},
                    labels={str(k): str(v) for k, v in (spec.get("labels") or {}).items()},
                    weight=int(spec.get("weight") or 0), locality=str(spec.get("locality") or ""),
                    service_account=str(spec.get("serviceAccount") or ""))


def build_index(config: MeshConfig, proxy_namespace: str | None = None) -> MeshIndex:
    idx = MeshIndex(config, proxy_namespace=proxy_namespace)
    workload_entries = config.of_kind("WorkloadEntry")
    for se in config.of_kind("ServiceEntry"):
        spec = se.spec
        endpoints = [_endpoint(e) for e in spec.get("endpoints") or [] if isinstance(e, dict)]
        for ep in endpoints:
            ep.namespace = se.namespace
        selector = (spec.get("workloadSelector") or {}).get("labels")
        if selector:
            # WorkloadEntries in the ServiceEntry's namespace whose labels match.
            for we in workload_entries:
                ep = _endpoint(we.spec)
                ep.namespace = we.namespace
                ep.labels = {**{str(k): str(v) for k, v in we.labels.items()}, **ep.labels}
                if we.namespace == se.namespace and labels_match(selector, ep.labels):
                    endpoints.append(ep)
        resolution = str(spec.get("resolution") or "NONE").upper()
        for host in spec.get("hosts") or []:
            host = str(host)
            if host in idx.services:
                # istiod merges ServiceEntries of one host; the first keeps its
                # ports and resolution, endpoints add up.
                idx.services[host].endpoints.extend(endpoints)
                continue
            vips = [str(a).removesuffix("/32") for a in spec.get("addresses") or []
                    if "/" not in str(a).removesuffix("/32")]
            idx.services[host] = Service(host, se.namespace, _ports(spec), resolution, list(endpoints), se, vips)
    for dr in config.of_kind("DestinationRule"):
        host = idx.resolve(str(dr.spec.get("host") or ""), dr.namespace)
        if host.startswith("*"):
            group = next((c for p, c in idx.dr_wildcards if p == host), None)
            if group is None:
                group = []
                idx.dr_wildcards.append((host, group))
            group.append(dr)
        else:
            idx.destination_rules.setdefault(host, []).append(dr)
    idx.gateways = config.of_kind("Gateway")
    idx.virtual_services = config.of_kind("VirtualService")
    idx.vs_by_ref = {f"{vs.namespace}/{vs.name}": vs for vs in idx.virtual_services}
    for vs in idx.virtual_services:
        if MESH_GATEWAY not in idx.vs_gateways(vs):
            continue
        for h in vs.spec.get("hosts") or []:
            resolved = idx.resolve(str(h), vs.namespace)
            if resolved.startswith("*"):
                idx.mesh_vs_wildcard.append((resolved, vs))
            else:
                idx.mesh_vs_exact.setdefault(resolved, [])
                if vs not in idx.mesh_vs_exact[resolved]:
                    idx.mesh_vs_exact[resolved].append(vs)
    idx.uses_source_labels = any(
        isinstance(m, dict) and m.get("sourceLabels")
        for vs in idx.virtual_services for h in vs.spec.get("http") or [] if isinstance(h, dict)
        for m in h.get("match") or [])
    return idx
