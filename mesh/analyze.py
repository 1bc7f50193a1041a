"""Cross-resource analyzers, after `istioctl analyze` (its codes and wording).

Each analyzer takes a MeshConfig whose resources each passed validation and
yields Diagnostics. Severity decides what a finding does to a config push:

  error    blocks the push: the control plane rejects the whole change set
           (IST0101 gateway / subset not found, IST0109 duplicate hosts,
           IST0145 conflicting gateways)
  warning  reported and kept on MeshConfig.warnings (IST0101 host not in the
  info     registry, IST0132, IST0173, IST0130/IST0131 from validation)

The service registry is what the config itself declares: ServiceEntries
(their hosts, STATIC endpoints and the WorkloadEntries their
workloadSelector picks). There is no Kubernetes Service registry here.
"""
from __future__ import annotations

import difflib

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from mcp26.mesh import hosts, kube
from mcp26.mesh.inference_pool import POOL_KIND, pool_endpoints, pool_from, workload_entry_labels
from mcp26.mesh.resources import MeshConfig, Resource, same_except_endpoints, same_resource
from mcp26.mesh.diagnostics import Diagnostic

Analyzer = Callable[["Index"], Iterable[Diagnostic]]
ANALYZERS: list[Analyzer] = []

# istioctl's message codes used here.
REFERENCED_RESOURCE_NOT_FOUND = "IST0101"
VS_DESTINATION_PORT_SELECTOR_REQUIRED = "IST0112"
CONFLICTING_MESH_GATEWAY_VS_HOSTS = "IST0109"
VS_HOST_NOT_FOUND_IN_GATEWAY = "IST0132"
CONFLICTING_GATEWAYS = "IST0145"
DR_SUBSET_NOT_SELECT_PODS = "IST0173"


# Analyzers that read endpoint data (ServiceEntry spec.endpoints, WorkloadEntries):
# the others find the same in two configs equal but for it (AnalysisCache).
READS_ENDPOINTS: set = set()


# Analyzers that look at one VirtualService at a time and, besides it, read only
# resources of other kinds: after a change to VirtualServices alone, the findings
# of those left as they were are kept (AnalysisCache). Not those that compare
# VirtualServices with each other (delegates_exist, conflicting_hosts).
PER_VIRTUAL_SERVICE: set = set()


def analyzer(fn: Analyzer) -> Analyzer:
    ANALYZERS.append(fn)
    return fn


def reads_endpoints(fn: Analyzer) -> Analyzer:
    READS_ENDPOINTS.add(fn)
    return fn


def per_virtual_service(one: Callable[["Index", Resource], Iterable[Diagnostic]]) -> Analyzer:
    """An analyzer from `one(index, vs)`, which must read no other VirtualService
    and no endpoint data: it runs over every VirtualService, and `.one` lets the
    cache run it on the changed ones only."""
    def run(index: "Index") -> Iterator[Diagnostic]:
        for vs in index.virtual_services:
            yield from one(index, vs)
    run.__name__, run.__qualname__, run.__doc__ = one.__name__, one.__qualname__, one.__doc__
    run.one = one
    PER_VIRTUAL_SERVICE.add(run)
    return analyzer(run)


@dataclass
class Service:
    """One host of the registry: the ServiceEntries declaring it, its ports, its endpoints' labels."""
    host: str
    entries: list = field(default_factory=list)
    ports: set = field(default_factory=set)
    endpoint_labels: list = field(default_factory=list)
    # True when every endpoint is known (STATIC endpoints / workloadSelector):
    # only then can "a subset selects no endpoint" be said.
    endpoints_known: bool = False

    def visible_from(self, namespace: str | None) -> bool:
        """Whether any of its ServiceEntries is exported to `namespace` (exportTo:
        none or "*" everywhere, "." its own namespace, "~" nowhere, else the list)."""
        return namespace is None or any(_exported_to(se, namespace) for se in self.entries)


def _exported_to(se: Resource, namespace: str) -> bool:
    export_to = se.spec.get("exportTo") or ["*"]
    return "*" in export_to or namespace in export_to or ("." in export_to and se.namespace == namespace)


class Index:
    """Lookups every analyzer needs, built once per config."""

    def __init__(self, config: MeshConfig):
        self.config = config
        self.gateways = {f"{g.namespace}/{g.name}": g for g in config.of_kind("Gateway")}
        self.virtual_services = config.of_kind("VirtualService")
        self.destination_rules: dict[str, list[Resource]] = defaultdict(list)
        self.wildcard_rules: list[tuple[str, Resource]] = []
        for dr in config.of_kind("DestinationRule"):
            host = hosts.resolve_short_name(str(dr.spec.get("host", "")), dr.namespace)
            if host.startswith("*"):
                self.wildcard_rules.append((host, dr))
            else:
                self.destination_rules[host].append(dr)
        self.services: dict[str, Service] = {}
        self.wildcard_services: list[str] = []
        workload_entries = config.of_kind("WorkloadEntry")
        for se in config.of_kind("ServiceEntry"):
            labels, known = self._endpoints(se, workload_entries)
            for h in se.spec.get("hosts") or []:
                host = hosts.resolve_short_name(h, se.namespace)
                svc = self.services.setdefault(host, Service(host))
                svc.entries.append(se)
                svc.ports.update(p.get("number") for p in se.spec.get("ports") or [])
                svc.endpoint_labels.extend(labels)
                svc.endpoints_known = svc.endpoints_known or known
                if host.startswith("*"):
                    self.wildcard_services.append(host)

    @staticmethod
    def _endpoints(se: Resource, workload_entries: list[Resource]) -> tuple[list[dict], bool]:
        selector = (se.spec.get("workloadSelector") or {}).get("labels")
        if selector:
            picked = [we.spec.get("labels") or {} for we in workload_entries
                      if we.namespace == se.namespace and _selects(selector, we.spec.get("labels") or {})]
            return picked, True
        endpoints = se.spec.get("endpoints")
        if endpoints is None:
            return [], False
        return [ep.get("labels") or {} for ep in endpoints], se.spec.get("resolution") in ("STATIC", "DNS", "DNS_ROUND_ROBIN")

    def rules_for(self, host: str) -> list[Resource]:
        """The DestinationRule that applies to a host, as the translator picks it:
        the first for the exact host, else the most specific wildcard."""
        exact = self.destination_rules.get(host)
        if exact:
            return exact[:1]
        covering = [(p, dr) for p, dr in self.wildcard_rules if hosts.host_matches(p, host)]
        return [max(covering, key=lambda c: len(c[0]))[1]] if covering else []

    def similar_host(self, host: str, namespace: str | None = None) -> str:
        """' (did you mean "X"?)' for the registry's closest host (a typo, another namespace)."""
        known = [h for h, s in self.services.items() if not h.startswith("*") and s.visible_from(namespace)]
        short = {h.split(".")[0]: h for h in known}
        close = difflib.get_close_matches(host, known, n=1, cutoff=0.8) or [
            short[m] for m in difflib.get_close_matches(host.split(".")[0], list(short), n=1, cutoff=0.75)]
        return f' (did you mean "{close[0]}"?)' if close and close[0] != host else ""

    def service_for(self, host: str, namespace: str | None = None) -> Service | None:
        """The registry's service for `host`, as seen from `namespace` (None: from
        anywhere): Istio's GetDestinationHost honours the ServiceEntry's exportTo."""
        svc = self.services.get(host)
        if svc is not None and svc.visible_from(namespace):
            return svc
        for pattern in self.wildcard_services:
            if hosts.host_matches(pattern, host) and self.services[pattern].visible_from(namespace):
                return self.services[pattern]
        return None


def _selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


class AnalysisCache:
    """The last analysis, for the next (the control plane's loader keeps one).

    Endpoint churn is most change sets, and analysing 1,000 services took
    ~0.35 s of each: a config equal to the last one but for endpoint data
    keeps the findings of every analyzer not in READS_ENDPOINTS. Equal means
    every resource in the same order with the same kind, name, namespace,
    metadata, file and field lines (findings name them), and the same spec
    but for a ServiceEntry's `endpoints` and a WorkloadEntry's whole spec.

    Route edits are most of the rest, and the analyzers that walk every
    VirtualService's destinations took ~0.1 s of each at 1,000 services: when
    nothing but VirtualServices changed (every other resource equal in content,
    in order), a PER_VIRTUAL_SERVICE analyzer runs only on the VirtualServices
    it has not seen (a parsed resource is the same object until its file
    changes) and keeps its findings on the others.
    """

    def __init__(self):
        self.config: MeshConfig | None = None
        self.findings: dict = {}          # analyzer -> its findings on `config`
        self.reused = 0                   # analyzers whose findings the last analyze kept
        # PER_VIRTUAL_SERVICE analyzer -> id(vs) -> (vs, its findings); vs is held so its id stays its own
        self.per_vs: dict = {}
        self.reused_vs = 0                # (analyzer, VirtualService) findings the last analyze kept


def _same_but_endpoints(old: MeshConfig, new: MeshConfig) -> bool:
    """Every resource equal in order, file and lines, and but for endpoint data."""
    return len(old) == len(new) and all(
        a is b or ((a.file, a.line, a.lines) == (b.file, b.line, b.lines)
                   and same_except_endpoints(a, b, workload_entries=True))
        for a, b in zip(old, new))


def _others(config: MeshConfig) -> list[Resource]:
    return [r for r in config.resources if r.kind != "VirtualService"]


def _same_but_virtual_services(old: MeshConfig, new: MeshConfig) -> bool:
    """Every resource but the VirtualServices equal in content and order (the
    PER_VIRTUAL_SERVICE analyzers name only the VirtualService in a finding)."""
    a, b = _others(old), _others(new)
    return len(a) == len(b) and all(x is y or same_resource(x, y) for x, y in zip(a, b))


def _per_virtual_service(fn: Analyzer, index: Index, known: dict) -> tuple[list[Diagnostic], dict, int]:
    """fn's findings, its per-VirtualService entries, and how many of them `known` gave."""
    out, entries, kept = [], {}, 0
    for vs in index.virtual_services:
        hit = known.get(id(vs))      # the entry holds its vs: no other object can have that id
        if hit is not None:
            found = hit[1]
            kept += 1
        else:
            found = list(fn.one(index, vs))
        entries[id(vs)] = (vs, found)
        out.extend(found)
    return out, entries, kept


def analyze(config: MeshConfig, cache: AnalysisCache | None = None) -> list[Diagnostic]:
    index = Index(config)
    last = cache.config if cache is not None else None
    keep = last is not None and _same_but_endpoints(last, config)
    # Entries found on an older config stay good while only VirtualServices change,
    # and (these analyzers read no endpoints) across endpoint-only changes.
    known = cache.per_vs if last is not None and (keep or _same_but_virtual_services(last, config)) else {}
    findings, per_vs, reused, reused_vs = {}, {}, 0, 0
    for fn in ANALYZERS:
        if keep and fn not in READS_ENDPOINTS and fn in cache.findings:
            findings[fn] = cache.findings[fn]
            reused += 1
            if fn in known:
                per_vs[fn] = known[fn]
        elif fn in PER_VIRTUAL_SERVICE and cache is not None:
            findings[fn], per_vs[fn], kept = _per_virtual_service(fn, index, known.get(fn, {}))
            reused_vs += kept
        else:
            findings[fn] = list(fn(index))
    if cache is not None:
        cache.config, cache.findings, cache.reused = config, findings, reused
        cache.per_vs, cache.reused_vs = per_vs, reused_vs
    return [d for fn in ANALYZERS for d in findings[fn]]


def _destinations(vs: Resource) -> Iterator[tuple[str, dict]]:
    """(field path, destination) of every route, mirror and mirrors entry."""
    for proto in ("http", "tcp", "tls"):
        for i, route in enumerate(vs.spec.get(proto) or []):
            for j, rd in enumerate(route.get("route") or []):
                if rd.get("destination"):
                    yield f"spec.{proto}[{i}].route[{j}].destination", rd["destination"]
            if proto == "http":
                if route.get("mirror"):
                    yield f"spec.http[{i}].mirror", route["mirror"]
                for j, m in enumerate(route.get("mirrors") or []):
                    if m.get("destination"):
                        yield f"spec.http[{i}].mirrors[{j}].destination", m["destination"]


def _gateway_refs(vs: Resource) -> Iterator[tuple[str, str]]:
    for i, g in enumerate(vs.spec.get("gateways") or []):
        yield f"spec.gateways[{i}]", g
    for i, route in enumerate(vs.spec.get("http") or []):
        for j, m in enumerate(route.get("match") or []):
            for k, g in enumerate(m.get("gateways") or []):
                yield f"spec.http[{i}].match[{j}].gateways[{k}]", g


@analyzer
def unique_names(index: Index) -> Iterator[Diagnostic]:
    """Two resources of one kind with one namespace/name: which one is meant?

    Kubernetes cannot hold both (a later apply replaces the first); a config
    directory can, so the change set is rejected rather than guessed at.
    """
    first: dict[str, Resource] = {}
    for res in index.config:
        seen = first.setdefault(res.ref, res)
        if seen is not res:
            yield res.diagnostic("metadata.name", f"duplicate {res.kind} {res.namespace}/{res.name}: "
                                 f"also defined at {seen.file}:{seen.line}")


@analyzer
def one_destination_rule_per_host(index: Index) -> Iterator[Diagnostic]:
    """A second DestinationRule for a host does not apply: the first one wins.

    (istiod merges the subsets of rules for one host; mcp-mesh's translator
    uses the first rule, so a subset only the second defines is not found.)
    """
    for host, rules in index.destination_rules.items():
        for dr in rules[1:]:
            first = rules[0]
            yield dr.diagnostic("spec.host", f"DestinationRule {first.namespace}/{first.name} ({first.file}:{first.line}) "
                                f"already applies to host {host}; this one is ignored", severity="warning")


@per_virtual_service
def gateways_exist(index: Index, vs: Resource) -> Iterator[Diagnostic]:
    """IST0101: a VirtualService names a gateway no Gateway resource defines."""
    for path, g in _gateway_refs(vs):
        ref = hosts.gateway_ref(g, vs.namespace)
        if ref != hosts.MESH_GATEWAY and ref not in index.gateways:
            yield vs.diagnostic(path, f'Referenced gateway not found: "{g}"', code=REFERENCED_RESOURCE_NOT_FOUND)


@analyzer
def delegates_exist(index: Index) -> Iterator[Diagnostic]:
    """IST0101: a root route delegates to a VirtualService that does not exist
    (istiod, and the translator, drop the route: requests would match nothing)."""
    names = {(vs.namespace, vs.name) for vs in index.virtual_services}
    for vs in index.virtual_services:
        for i, route in enumerate(vs.spec.get("http") or []):
            ref = route.get("delegate")
            if not ref:
                continue
            target = (ref.get("namespace") or vs.namespace, ref.get("name") or "")
            if target not in names:
                yield vs.diagnostic(f"spec.http[{i}].delegate", "Referenced virtualservice not found: "
                                    f'"{target[0]}/{target[1]}"', code=REFERENCED_RESOURCE_NOT_FOUND)


@per_virtual_service
def destination_subsets(index: Index, vs: Resource) -> Iterator[Diagnostic]:
    """IST0101: a destination subset that no DestinationRule for its host defines."""
    for path, d in _destinations(vs):
        subset = d.get("subset")
        if not subset:
            continue
        host = hosts.resolve_short_name(str(d.get("host", "")), vs.namespace)
        defined = {s.get("name") for dr in index.rules_for(host) for s in dr.spec.get("subsets") or []}
        if subset not in defined:
            yield vs.diagnostic(f"{path}.subset", "Referenced host+subset in destinationrule not found: "
                                f"\"{d.get('host')}+{subset}\"", code=REFERENCED_RESOURCE_NOT_FOUND)


@per_virtual_service
def destination_hosts(index: Index, vs: Resource) -> Iterator[Diagnostic]:
    """IST0101 (a warning here): a destination host no ServiceEntry declares.

    istioctl says error because it also sees the Kubernetes Services; here
    the registry is the config's ServiceEntries, and a host outside it still
    gets a cluster (Envoy answers 503 until it has endpoints), so it does not
    block a push.
    """
    for path, d in _destinations(vs):
        host = hosts.resolve_short_name(str(d.get("host", "")), vs.namespace)
        if index.service_for(host, vs.namespace) is None:
            yield vs.diagnostic(f"{path}.host", f'Referenced host not found: "{d.get("host")}"'
                                + index.similar_host(host, vs.namespace),
                                code=REFERENCED_RESOURCE_NOT_FOUND, severity="warning")


@per_virtual_service
def destination_ports(index: Index, vs: Resource) -> Iterator[Diagnostic]:
    """IST0101 host:port not found (error); IST0112 a gateway route to a
    service with several ports names none (error, as istioctl says)."""
    on_gateway = bool(vs.spec.get("gateways")) and hosts.MESH_GATEWAY not in vs.spec["gateways"]
    for path, d in _destinations(vs):
        svc = index.service_for(hosts.resolve_short_name(str(d.get("host", "")), vs.namespace), vs.namespace)
        if svc is None or not svc.ports:
            continue
        port = (d.get("port") or {}).get("number")
        if port is not None and port not in svc.ports:
            yield vs.diagnostic(f"{path}.port.number", f'Referenced host:port not found: "{d.get("host")}:{port}"',
                                code=REFERENCED_RESOURCE_NOT_FOUND)
        elif port is None and on_gateway and len(svc.ports) > 1:
            yield vs.diagnostic(path, "This VirtualService routes to a service with more than one port exposed, "
                                "but does not specify which to use.", code=VS_DESTINATION_PORT_SELECTOR_REQUIRED)


def _bound_gateways(vs: Resource) -> list[str]:
    return [hosts.gateway_ref(g, vs.namespace) for g in vs.spec.get("gateways") or [hosts.MESH_GATEWAY]]


@analyzer
def conflicting_hosts(index: Index) -> Iterator[Diagnostic]:
    """IST0109: two VirtualServices define the same host on the same gateway.

    On the mesh gateway, as istioctl's ConflictingMeshGatewayHostsAnalyzer:
    hosts are scoped by the VirtualService's exportTo (none or "*": every
    namespace; "." its own), and a host exported to one namespace conflicts
    with every host exported to all that it overlaps (`*.productpage.d` with
    `*.d`, host.Name.Matches). istiod merges VirtualServices on named
    gateways in creation order, which a directory does not have, so mcp-mesh
    also rejects the same host twice on one named gateway.
    """
    mesh: dict[tuple[str, str], list[tuple[Resource, int]]] = defaultdict(list)
    named: dict[tuple[str, str], list[tuple[Resource, int]]] = defaultdict(list)
    for vs in index.virtual_services:
        export_to = vs.spec.get("exportTo") or []
        scopes = ["*"] if not export_to or "*" in export_to else \
            sorted({vs.namespace if e == "." else e for e in export_to})
        for gw in dict.fromkeys(_bound_gateways(vs)):
            for i, h in enumerate(vs.spec.get("hosts") or []):
                fqdn = _analyzer_fqdn(str(h), vs.namespace)
                if gw == hosts.MESH_GATEWAY:
                    for scope in scopes:
                        mesh[(scope, fqdn)].append((vs, i))
                else:
                    named[(gw, fqdn)].append((vs, i))
    groups = []
    for (scope, fqdn), found in mesh.items():
        if scope != "*":   # getExportToAllNamespacesVSListForScopedHost
            found = found + [f for (sc, other), fs in mesh.items() if sc == "*" and hosts.hosts_overlap(fqdn, other)
                             for f in fs]
        groups.append(("mesh gateway", fqdn, found))
    groups.extend((f"gateway {gw}", fqdn, found) for (gw, fqdn), found in named.items())
    reported: set[tuple[str, str, int]] = set()
    for where, fqdn, found in groups:
        if len({(v.namespace, v.name) for v, _ in found}) < 2:
            continue
        names = ",".join(sorted({f"{v.namespace}/{v.name}" for v, _ in found}))
        for vs, i in found:
            if (where, vs.ref, i) in reported:
                continue
            reported.add((where, vs.ref, i))
            yield vs.diagnostic(f"spec.hosts[{i}]", f"The VirtualServices {names} associated with {where} define the "
                                f"same host {fqdn} which can lead to undefined behavior. This can be fixed by merging "
                                "the conflicting VirtualServices into a single resource.",
                                code=CONFLICTING_MESH_GATEWAY_VS_HOSTS)


def _analyzer_fqdn(host: str, namespace: str) -> str:
    """istioctl's ConvertHostToFQDN: a name without a dot is NAME.NS.svc.cluster.local."""
    return host if host.startswith("*") or "." in host else hosts.resolve_short_name(host, namespace)


def _server_host(h: str) -> str:
    return h.partition("/")[2] if "/" in h else h


@per_virtual_service
def virtual_service_hosts_on_gateway(index: Index, vs: Resource) -> Iterator[Diagnostic]:
    """IST0132, as istioctl's GatewayAnalyzer: for each Gateway in spec.gateways,
    a warning when none of the VirtualService's hosts is served by it. Gateway
    hosts `ns/host` apply only to VirtualServices in `ns` (`./host`: the
    Gateway's namespace, `*/host`: any), host.NamesForNamespace."""
    vs_hosts = [str(h) for h in vs.spec.get("hosts") or []]
    for i, g in enumerate(vs.spec.get("gateways") or []):
        ref = hosts.gateway_ref(g, vs.namespace)
        gw = index.gateways.get(ref)
        if ref == hosts.MESH_GATEWAY or gw is None:   # a missing gateway is IST0101's
            continue
        served = [h for s in gw.spec.get("servers") or [] for h in _hosts_for_namespace(
            [str(x) for x in s.get("hosts") or []], gw.namespace, vs.namespace)]
        if not any(hosts.hosts_overlap(gh.lower(), vh.lower()) for gh in served for vh in vs_hosts):
            yield vs.diagnostic(f"spec.gateways[{i}]", f"one or more host [{' '.join(vs_hosts)}] defined in "
                                f"VirtualService {vs.namespace}/{vs.name} not found in Gateway {ref}.",
                                code=VS_HOST_NOT_FOUND_IN_GATEWAY, severity="warning")


def _hosts_for_namespace(server_hosts: list[str], gateway_ns: str, vs_ns: str) -> list[str]:
    """sanitizeServerHostNamespace then host.NamesForNamespace."""
    out = []
    for h in server_hosts:
        ns, slash, name = h.partition("/")
        if not slash:
            out.append(h)
        elif (gateway_ns if ns == "." else ns) in (vs_ns, "*"):
            out.append(name)
    return out


@analyzer
def conflicting_gateways(index: Index) -> Iterator[Diagnostic]:
    """IST0145, as istioctl's ConflictingGatewayAnalyzer: servers of two Gateways
    on one port and bind whose selectors pick the same workload, with a host in
    common. The same selector, or one selector a subset of the other (istioctl
    then looks for a Pod carrying both; with no Pod registry here, the workload
    the larger selector names is taken to exist). mcp-mesh counts overlapping
    hosts (`*.example.com` and `shop.example.com`), not only equal ones: both
    would be one listener's filter chain."""
    servers = []
    for gw in index.gateways.values():
        selector = {str(k): str(v) for k, v in (gw.spec.get("selector") or {}).items()}
        for i, s in enumerate(gw.spec.get("servers") or []):
            servers.append((gw, i, selector, (s.get("port") or {}).get("number"), s.get("bind") or "",
                            [str(h) for h in s.get("hosts") or []]))
    for gw, i, selector, port, bind, own in servers:
        others = sorted({f"{o.namespace}/{o.name}" for o, _, sel, p, b, hs in servers
                         if o is not gw and p == port and b == bind and _same_workload(selector, sel)
                         and any(hosts.hosts_overlap(_server_host(x).lower(), _server_host(y).lower())
                                 for x in own for y in hs)})
        if others:
            sel = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
            yield gw.diagnostic(f"spec.servers[{i}]", f"Conflict with gateways {','.join(others)} (workload selector "
                                f"{sel}, port {port}, hosts {','.join(own)}).", code=CONFLICTING_GATEWAYS)


def _same_workload(a: dict, b: dict) -> bool:
    small, large = (a, b) if len(a) <= len(b) else (b, a)
    return all(large.get(k) == v for k, v in small.items())


@analyzer
@reads_endpoints
def subsets_select_endpoints(index: Index) -> Iterator[Diagnostic]:
    """IST0173: a subset whose labels select none of the host's known endpoints."""
    for hostname, rules in index.destination_rules.items():
        svc = index.service_for(hostname)
        if svc is None or not svc.endpoints_known:
            continue
        for dr in rules:
            for i, subset in enumerate(dr.spec.get("subsets") or []):
                labels = subset.get("labels") or {}
                if labels and not any(_selects(labels, ep) for ep in svc.endpoint_labels):
                    yield dr.diagnostic(f"spec.subsets[{i}].labels", f"The Subset {subset.get('name')} defined in the "
                                        "DestinationRule does not select any endpoints (ServiceEntry endpoints or "
                                        "WorkloadEntries).", code=DR_SUBSET_NOT_SELECT_PODS, severity="warning")


@analyzer
@reads_endpoints
def inference_pools(index: Index) -> Iterator[Diagnostic]:
    """InferencePools and the routes to them, where Istio writes status
    conditions (warnings: the change set still applies):

    - IST0101: an HTTPRoute backendRef names an InferencePool that does not
      exist (ResolvedRefs=False): that backend's share of the rule answers 500;
    - a pool whose selector matches no workload of its namespace (WorkloadEntry,
      Pod, Deployment ...), or only workloads without an address: its cluster
      has no endpoint and the picker nothing to pick (503);
    - IST0101: its endpointPickerRef Service does not exist (ResolvedRefs=False
      InvalidExtensionRef): every request fails (FailClose) or goes unpicked
      (FailOpen); the Service lacks the port, or the port is not HTTP/2
      (ext_proc is gRPC: `appProtocol: http2` or a `grpc-` port name); a kind
      other than Service is not supported.
    """
    group = "inference.networking.k8s.io"
    config = index.config
    pools = {(r.namespace, r.name): r for r in config.of_kind(POOL_KIND) if r.group == group}
    for route in config.of_kind("HTTPRoute"):
        if route.group != "gateway.networking.k8s.io":
            continue
        for i, rule in enumerate(route.spec.get("rules") or []):
            for j, ref in enumerate(rule.get("backendRefs") or []):
                if (ref.get("group"), ref.get("kind")) != (group, POOL_KIND):
                    continue
                key = (str(ref.get("namespace") or route.namespace), str(ref.get("name") or ""))
                if key not in pools:
                    yield route.diagnostic(f"spec.rules[{i}].backendRefs[{j}].name",
                                           f'Referenced InferencePool not found: "{key[0]}/{key[1]}" (this '
                                           "backend's share of the rule answers 500)",
                                           code=REFERENCED_RESOURCE_NOT_FOUND, severity="warning")
    labels_by_ns: dict[str, list[dict]] = defaultdict(list)
    for we in config.of_kind("WorkloadEntry"):
        labels_by_ns[we.namespace].append(workload_entry_labels(we))
    for w in kube.workloads(config):
        labels_by_ns[w.namespace].append(w.labels)
    for res in pools.values():
        pool = pool_from(res)
        if pool.selector and not any(_selects(pool.selector, labels) for labels in labels_by_ns[res.namespace]):
            yield res.diagnostic("spec.selector.matchLabels", "The selector matches no workload (WorkloadEntry, Pod, "
                                 f"Deployment ...) in namespace {res.namespace}: the pool has no endpoint",
                                 severity="warning")
        elif pool.selector and not pool_endpoints(config, pool):
            yield res.diagnostic("spec.selector.matchLabels", "The workloads the selector matches have no address "
                                 f"(a Pod's status.podIP, or the {kube.ADDRESSES_ANNOTATION} annotation): "
                                 "the pool has no endpoint", severity="warning")
        picker = pool.picker
        if picker is None:
            continue
        if (picker.group, picker.kind) != ("", "Service"):
            yield res.diagnostic("spec.endpointPickerRef.kind", f"endpointPickerRef kind {picker.group}/{picker.kind} "
                                 "is not supported (only Service): no picker is consulted", severity="warning")
            continue
        host = kube.service_host(picker.name, res.namespace)
        svc = index.service_for(host, res.namespace)
        if svc is None:
            yield res.diagnostic("spec.endpointPickerRef.name", f'Referenced endpoint picker Service not found: '
                                 f'"{res.namespace}/{picker.name}" (requests to the pool '
                                 f'{"go unpicked" if picker.failure_mode == "FailOpen" else "fail"})',
                                 code=REFERENCED_RESOURCE_NOT_FOUND, severity="warning")
            continue
        protocols = {str(p.get("protocol") or "").upper() for se in svc.entries for p in se.spec.get("ports") or []
                     if p.get("number") == picker.port}
        if not protocols:
            yield res.diagnostic("spec.endpointPickerRef.port.number", f'Referenced host:port not found: "{host}:'
                                 f'{picker.port}"', code=REFERENCED_RESOURCE_NOT_FOUND, severity="warning")
        elif not protocols & {"HTTP2", "GRPC"}:
            yield res.diagnostic("spec.endpointPickerRef.port.number", f"port {picker.port} of {host} is not declared "
                                 "HTTP/2 (appProtocol: http2, or a grpc- port name): Envoy's ext_proc speaks gRPC "
                                 "to the endpoint picker", severity="warning")


NO_MATCHING_WORKLOADS = "IST0127"


def _workload_labels(config: MeshConfig) -> dict[str, list[dict]]:
    """Namespace -> the labels of each workload known there: WorkloadEntries (the
    Kubernetes registry adds one per Pod or replica) and Gateway selectors (a
    gateway's proxies are workloads too, though no resource here lists them)."""
    out: dict[str, list[dict]] = defaultdict(list)
    for we in config.of_kind("WorkloadEntry"):
        out[we.namespace].append(workload_entry_labels(we))
    for gw in config.of_kind("Gateway"):
        if gw.group == "networking.istio.io":
            out[gw.namespace].append({str(k): str(v) for k, v in (gw.spec.get("selector") or {}).items()})
    return out


@analyzer
@reads_endpoints
def authorization_policies(index: Index) -> Iterator[Diagnostic]:
    """As istioctl's AuthorizationPoliciesAnalyzer: IST0127 a selector no workload
    of the namespace carries (only where the namespace has workloads to judge by),
    and IST0101 a source namespace no Namespace object names (only where the
    config holds Namespace objects at all)."""
    config = index.config
    workloads = _workload_labels(config)
    namespaces = {r.name for r in config.of_kind("Namespace")}
    for ap in config.of_kind("AuthorizationPolicy"):
        want = ((ap.spec.get("selector") or {}).get("matchLabels")) or {}
        if want and workloads.get(ap.namespace) and not any(_selects(want, w) for w in workloads[ap.namespace]):
            labels = ",".join(f"{k}={v}" for k, v in sorted(want.items()))
            yield ap.diagnostic("spec.selector.matchLabels", "No matching workloads for this resource with the "
                                f"following labels: {labels}", code=NO_MATCHING_WORKLOADS, severity="warning")
        if not namespaces:
            continue
        for i, rule in enumerate(ap.spec.get("rules") or []):
            for j, frm in enumerate((rule or {}).get("from") or []):
                for k, ns in enumerate(((frm or {}).get("source") or {}).get("namespaces") or []):
                    if "*" not in str(ns) and ns not in namespaces:
                        yield ap.diagnostic(f"spec.rules[{i}].from[{j}].source.namespaces[{k}]",
                                            f"Referenced namespace not found: {ns!r}",
                                            code=REFERENCED_RESOURCE_NOT_FOUND, severity="warning")
