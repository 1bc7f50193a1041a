"""The Sidecar resource and PeerAuthentication: which one applies to a proxy, and what it allows.

Sidecar (istiod's SidecarScope): the one in the proxy's namespace whose
`workloadSelector.labels` match its labels, else that namespace's one without
a selector, else the root namespace's one without a selector (several: the
first by name). `egress[].hosts` (NAMESPACE/HOST; `*`, `.` = the proxy's,
`~` = none) limit the services the proxy gets clusters, routes and outbound
listeners for; `ingress[]` are its inbound listeners (inbound.py).

PeerAuthentication (istiod's authn policy applier): the mode of a port is the
workload's policy (selector matching, the oldest -- here the first by name)
port-level entry, else its `mtls`, else the namespace's policy, else the root
namespace's; UNSET inherits; nothing at all is PERMISSIVE.
"""
from __future__ import annotations

from envoy.config.core.v3 import base_pb2

from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.model.type_urls import CLUSTER, ENDPOINT, LISTENER, ROUTE, Snapshot
from mcp26.xds.translate.index import ROOT_NAMESPACE, MeshIndex, host_matches

SIDECAR = "Sidecar"
PEER_AUTHENTICATION = "PeerAuthentication"
MODES = ("STRICT", "PERMISSIVE", "DISABLE")


def _labels_match(want: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in (want or {}).items())


def _pick(resources: list[Resource], node: ProxyNode, selector_of) -> list[Resource]:
    """Workload-specific, namespace-wide, root-namespace-wide: the applicable ones, most specific first."""
    mine = sorted((r for r in resources if r.namespace == node.namespace), key=lambda r: r.name)
    root = sorted((r for r in resources if r.namespace == ROOT_NAMESPACE and not selector_of(r)),
                  key=lambda r: r.name)
    out = [r for r in mine if selector_of(r) and _labels_match(selector_of(r), node.labels)][:1]
    out += [r for r in mine if not selector_of(r)][:1]
    if node.namespace != ROOT_NAMESPACE:
        out += root[:1]
    return out


def sidecar_for(config: MeshConfig, node: ProxyNode) -> Resource | None:
    if node.kind != "sidecar":
        return None
    found = _pick(config.of_kind(SIDECAR), node, lambda r: (r.spec.get("workloadSelector") or {}).get("labels"))
    return found[0] if found else None


# -- egress ------------------------------------------------------------------------
def egress_allows(sidecar: Resource | None, host: str, service_namespace: str, node_namespace: str) -> bool:
    if sidecar is None or not sidecar.spec.get("egress"):
        return True
    for eg in sidecar.spec["egress"]:
        for h in eg.get("hosts") or []:
            ns, _, pattern = str(h).partition("/")
            if ns == "~":
                continue
            if ns == "." and service_namespace != node_namespace:
                continue
            if ns not in ("*", ".") and ns != service_namespace:
                continue
            if host_matches(host, pattern):
                return True
    return False


def apply_egress(snapshot: Snapshot, idx: MeshIndex, sidecar: Resource | None, node: ProxyNode) -> Snapshot:
    """The snapshot with what the Sidecar's egress excludes removed: outbound clusters and
    assignments of hosts not listed, their virtual hosts, and outbound listeners left
    with nothing. Messages kept are the same objects (read-only, shared)."""
    if sidecar is None or not sidecar.spec.get("egress"):
        return snapshot

    def allowed(host: str) -> bool:
        svc = idx.services.get(host)
        return egress_allows(sidecar, host, svc.namespace if svc else node.namespace, node.namespace)

    def keep_cluster(name: str) -> bool:
        parts = name.split("|")
        return not (len(parts) == 4 and parts[0] == "outbound") or allowed(parts[3])

    out = dict(snapshot)
    out[CLUSTER] = {n: c for n, c in snapshot.get(CLUSTER, {}).items() if keep_cluster(n)}
    out[ENDPOINT] = {n: e for n, e in snapshot.get(ENDPOINT, {}).items() if keep_cluster(n)}
    routes = {}
    for name, rc in snapshot.get(ROUTE, {}).items():
        kept = [vh for vh in rc.virtual_hosts if allowed(vh.name.rsplit(":", 1)[0])]
        if len(kept) != len(rc.virtual_hosts):
            copy = type(rc)()
            copy.CopyFrom(rc)
            del copy.virtual_hosts[:]
            copy.virtual_hosts.extend(kept)
            rc = copy
        if kept:
            routes[name] = rc
    out[ROUTE] = routes
    listeners = {}
    for name, lis in snapshot.get(LISTENER, {}).items():
        if lis.traffic_direction != base_pb2.OUTBOUND or _listener_targets_kept(lis, routes, out[CLUSTER]):
            listeners[name] = lis
    out[LISTENER] = listeners
    return out


def _listener_targets_kept(lis, routes: dict, clusters: dict) -> bool:
    """An outbound listener stays while one of its chains still leads somewhere."""
    from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
    from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
    for chain in lis.filter_chains:
        for f in chain.filters:
            if f.typed_config.Is(hcm_pb2.HttpConnectionManager.DESCRIPTOR):
                hcm = hcm_pb2.HttpConnectionManager()
                f.typed_config.Unpack(hcm)
                if not hcm.HasField("rds") or hcm.rds.route_config_name in routes:
                    return True
            elif f.typed_config.Is(tcp_proxy_pb2.TcpProxy.DESCRIPTOR):
                tp = tcp_proxy_pb2.TcpProxy()
                f.typed_config.Unpack(tp)
                names = [tp.cluster] if tp.cluster else [w.name for w in tp.weighted_clusters.clusters]
                if any(n in clusters for n in names):
                    return True
            else:
                return True
    return False


# -- PeerAuthentication -------------------------------------------------------------
def peer_authentications(config: MeshConfig, node: ProxyNode) -> list[Resource]:
    """The applicable ones, most specific first (workload, namespace, root namespace)."""
    return _pick(config.of_kind(PEER_AUTHENTICATION), node,
                 lambda r: (r.spec.get("selector") or {}).get("matchLabels"))


def mtls_mode(config: MeshConfig, node: ProxyNode, port: int) -> str:
    """STRICT, PERMISSIVE or DISABLE for inbound traffic to `port` of this workload."""
    for pa in peer_authentications(config, node):
        level = (pa.spec.get("portLevelMtls") or {})
        entry = level.get(str(port)) or level.get(port)
        for m in (entry, pa.spec.get("mtls")):
            mode = str((m or {}).get("mode") or "UNSET").upper()
            if mode in MODES:
                return mode
    return "PERMISSIVE"


# -- outboundTrafficPolicy ------------------------------------------------------------
BLACKHOLE_CLUSTER = "BlackHoleCluster"
PASSTHROUGH_CLUSTER = "PassthroughCluster"


def outbound_mode(sidecar: Resource | None) -> str | None:
    """The Sidecar's outboundTrafficPolicy.mode (REGISTRY_ONLY / ALLOW_ANY), or None when
    it sets none (then the route configs keep only their services: an unknown host is a 404)."""
    if sidecar is None:
        return None
    return ((sidecar.spec.get("outboundTrafficPolicy") or {}).get("mode")) or None


def apply_outbound_policy(snapshot: Snapshot, sidecar: Resource | None) -> Snapshot:
    """As istiod, for a destination in no service: REGISTRY_ONLY appends a `block_all`
    virtual host (`*`, 502) to every outbound route configuration and adds the
    BlackHoleCluster (no endpoints); ALLOW_ANY appends `allow_any` (`*` -> PassthroughCluster,
    ORIGINAL_DST). A route configuration that already has a `*` domain keeps it."""
    mode = outbound_mode(sidecar)
    if mode not in ("REGISTRY_ONLY", "ALLOW_ANY"):
        return snapshot
    from envoy.config.cluster.v3 import cluster_pb2
    from envoy.config.route.v3 import route_components_pb2 as rc_pb2
    from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
    outbound_routes = set()
    for lis in snapshot.get(LISTENER, {}).values():
        if lis.traffic_direction == base_pb2.INBOUND:
            continue
        for chain in lis.filter_chains:
            for f in chain.filters:
                if f.typed_config.Is(hcm_pb2.HttpConnectionManager.DESCRIPTOR):
                    hcm = hcm_pb2.HttpConnectionManager()
                    f.typed_config.Unpack(hcm)
                    if hcm.HasField("rds"):
                        outbound_routes.add(hcm.rds.route_config_name)
    out = dict(snapshot)
    routes = dict(snapshot.get(ROUTE, {}))
    for name in outbound_routes & set(routes):
        rc = routes[name]
        if any("*" in vh.domains for vh in rc.virtual_hosts):
            continue
        copy = type(rc)()
        copy.CopyFrom(rc)
        vh = copy.virtual_hosts.add(domains=["*"])
        route = vh.routes.add()
        route.match.prefix = "/"
        if mode == "REGISTRY_ONLY":
            vh.name = route.name = "block_all"
            route.direct_response.status = 502
        else:
            vh.name = route.name = "allow_any"
            route.route.cluster = PASSTHROUGH_CLUSTER
            route.route.timeout.SetInParent()       # 0: no timeout, as istiod's passthrough route
        routes[name] = copy
    out[ROUTE] = routes
    c = cluster_pb2.Cluster()
    c.connect_timeout.FromSeconds(10)
    if mode == "REGISTRY_ONLY":
        c.name = BLACKHOLE_CLUSTER
        c.type = cluster_pb2.Cluster.STATIC
    else:
        c.name = PASSTHROUGH_CLUSTER
        c.type = cluster_pb2.Cluster.ORIGINAL_DST
        c.lb_policy = cluster_pb2.Cluster.CLUSTER_PROVIDED
    out[CLUSTER] = {**snapshot.get(CLUSTER, {}), c.name: c}
    return out
