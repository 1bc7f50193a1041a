"""Translation of the mesh model into Envoy resources, as istiod does it.

The one entry point is `translate(config, node, options) -> Snapshot`: every
resource this proxy should have, keyed by type URL (xds_server.type_urls) then by
name. It is pure (no I/O) and shares work between proxies of the same shape.

Seam protocol (other parts add HTTP filters and resources without editing
this package's core): each seam module -- `authn` (jwt_authn from
RequestAuthentication), `wasm_plugins` (the Wasm header-contract filter from
WasmPlugin, via ECDS) and `grpc_web` (the gRPC-Web filter) -- exposes

    http_filters(config: MeshConfig, node: ProxyNode, port: int) -> list[HttpFilter]
        HttpFilter messages (envoy.extensions.filters.network.
        http_connection_manager.v3.HttpFilter) for the HTTP connection manager
        serving `port` (a Gateway server port; for proxyless gRPC the
        service port of the API listener).
    resources(config: MeshConfig, node: ProxyNode) -> Snapshot
        extra resources merged into the node's snapshot (a JWKS cluster, the
        ECDS TypedExtensionConfig, ...). A name clash with a translated
        resource is an error, never a silent overwrite.

The HCM chain is, in order: cors, authn, grpc_web, wasm_plugins, fault,
router (the router always last). grpc_web sits before the Wasm filter so that
on the response path the filter sees gRPC trailers (grpc-status), not the
gRPC-Web body they are folded into. Seams must be pure and deterministic
functions of (config, node, port): their output is cached with the rest.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from mesh.resources import MeshConfig
from mesh.diagnostics import ConfigError, Diagnostic
from xds_server import telemetry
from xds_server.type_urls import CLUSTER, ENDPOINT, LISTENER, ROUTE, Snapshot
from xds_server.node import ProxyNode
from xds_server.translate import authn, grpc_web, wasm_plugins
from xds_server.translate.clusters import ClusterOptions, build_clusters, reassign
from xds_server.translate.index import EXPORTABLE, HTTP_PROTOCOLS, MESH_GATEWAY, MeshIndex, build_index, exported_to
from xds_server.translate.listeners import Chain, api_listener, bound_listener, filter_chain_head, filter_chain_tail
from xds_server.translate.names import cluster_name, gateway_https_route_name, sidecar_route_name
from xds_server.translate.route_configs import (gateway_route_config, grpc_route_config, mesh_virtual_services,
                                                sidecar_route_config)
from xds_server.translate.routes import RouteContext
from xds_server.translate.tcp import TCP_PROTOCOLS, cluster_proxy, first_tcp_route, tls_routes

__all__ = ["translate", "TranslateOptions", "SEAMS", "endpoint_only_change", "reset_cache"]

SEAMS = (authn, grpc_web, wasm_plugins)      # HCM order, between cors and fault


@dataclass(frozen=True)
class TranslateOptions:
    """bind_address: where gateway and sidecar listeners bind. istiod binds
    0.0.0.0; this project binds loopback by default (every server does).
    upstream_bind_address: the source address of QoS-marked upstream
    connections (upstream_bind_config; a v6 address uses IPV6_TCLASS)."""
    bind_address: str = "127.0.0.1"
    upstream_bind_address: str = "127.0.0.1"


# Endpoint data: what feeds only EDS (ClusterLoadAssignments). WorkloadEntries
# reach translation only as endpoints of the ServiceEntries selecting them.
_ENDPOINT_KINDS = ("WorkloadEntry",)


def _same_except_endpoints(a, b) -> bool:
    """Equal as translation reads them: everything but a ServiceEntry's
    spec.endpoints. File and field lines are left out: they only name places
    in errors, and a translation of equal content that succeeded once
    succeeds again."""
    if a is b:
        return True
    if (a.api_version, a.kind, a.name, a.namespace, a.labels, a.annotations) != \
            (b.api_version, b.kind, b.name, b.namespace, b.labels, b.annotations):
        return False
    if a.kind != "ServiceEntry":
        return a.spec == b.spec
    return ({k: v for k, v in a.spec.items() if k != "endpoints"}
            == {k: v for k, v in b.spec.items() if k != "endpoints"})


# What clusters and assignments are built from (build_clusters reads only the
# index's services and DestinationRules): with these unchanged, CDS and EDS are too.
_CLUSTER_KINDS = ("ServiceEntry", "DestinationRule", "WorkloadEntry")


def same_cluster_inputs(old: MeshConfig, new: MeshConfig) -> bool:
    """Whether every resource clusters are built from is equal (in order) in both."""
    a, b = old.of_kind(*_CLUSTER_KINDS), new.of_kind(*_CLUSTER_KINDS)
    return len(a) == len(b) and all(
        x is y or (_same_except_endpoints(x, y) and (x.kind != "ServiceEntry" or x.spec == y.spec))
        for x, y in zip(a, b))


def endpoint_only_change(old: MeshConfig, new: MeshConfig) -> bool:
    """Whether `new` differs from `old` at most in endpoint data: WorkloadEntries
    (added, removed, changed) and ServiceEntries' spec.endpoints, every other
    resource equal and in the same order (the first ServiceEntry of a host
    keeps its ports and resolution). Whether the changed endpoints feed only
    EDS is decided per service by clusters.reassign (STATIC services only)."""
    a = [r for r in old if r.kind not in _ENDPOINT_KINDS]
    b = [r for r in new if r.kind not in _ENDPOINT_KINDS]
    return len(a) == len(b) and all(_same_except_endpoints(x, y) for x, y in zip(a, b))


class _ConfigCache:
    """Everything derived from one MeshConfig, shared by all its proxies."""

    def __init__(self, config: MeshConfig, previous: "_ConfigCache | None" = None):
        self.config = config           # held while cached: its id() cannot be reused meanwhile
        self.index: MeshIndex = build_index(config)
        # exportTo, and DestinationRules for one host in several namespaces,
        # make what a proxy sees depend on its namespace; without them (the
        # usual case) every namespace shares the one full view.
        self.per_namespace = (any(r.spec.get("exportTo") is not None for r in config.of_kind(*EXPORTABLE))
                              or self.index.destination_rules_by_namespace)
        self.views: dict = {}          # namespace -> MeshIndex of what it sees
        self.clusters: dict = {}       # (ClusterOptions, view) -> (clusters, assignments)
        self.shapes: dict = {}         # node shape -> (route configs, listener plan)
        self.listeners: dict = {}      # (shape, bind, seam filters) -> listeners
        self.lock = threading.Lock()
        # gateway route configuration key -> (the resources it was built from, RouteConfiguration)
        self.gateway_routes: dict = {}
        self.previous_routes: dict = {}   # `previous`'s, reused where those resources are equal
        self.derived = False           # True: built from `previous` by an endpoint-only change
        self.clusters_reused = False   # True: clusters and assignments are `previous`'s
        if previous is not None and previous.per_namespace == self.per_namespace:
            if endpoint_only_change(previous.config, config):
                self.derived = self._derive(previous)
            if not self.derived and same_cluster_inputs(previous.config, config):
                # e.g. only VirtualServices or Gateways changed: CDS and EDS are kept
                # (the same messages); route configurations are built again, but a
                # gateway's is reused when nothing it reads changed (gateway_route_config).
                with previous.lock:
                    self.clusters = dict(previous.clusters)
                    self.previous_routes = dict(previous.gateway_routes)
                self.clusters_reused = True

    def gateway_route_config(self, idx: MeshIndex, port: int, servers: list, base: RouteContext,
                             name: str = ""):
        """route_configs.gateway_route_config, reused from the previous config when
        everything it reads is equal there: the services and DestinationRules
        (same_cluster_inputs, else there is nothing to reuse from), the servers'
        Gateways, the VirtualServices bound to them (in order) and the ones they
        delegate to; the proxy's labels and namespace are in the key."""
        key = (idx.proxy_namespace, port, name, tuple((s.gateway.namespace, s.gateway.name, s.index) for s in servers),
               tuple(sorted(base.labels.items())), base.namespace)
        found = self.gateway_routes.get(key)
        if found is not None:
            return found[1]
        deps = _route_inputs(idx, servers)
        before = self.previous_routes.get(key)
        if before is not None and len(before[0]) == len(deps) and all(
                a is b or (a is not None and b is not None and _same_except_endpoints(a, b))
                for a, b in zip(before[0], deps)):
            rc = before[1]
        else:
            rc = gateway_route_config(idx, port, servers, base, name=name)
        self.gateway_routes[key] = (deps, rc)
        return rc

    def _derive(self, previous: "_ConfigCache") -> bool:
        """Incremental EDS, as istiod pushes it: after an endpoint-only change keep
        `previous`'s clusters, route configurations and listeners (the same
        message objects, so their versions do not change and Delta sends only
        the changed assignments) and rebuild only the assignments of services
        whose endpoints changed. Everything or nothing: False (and nothing
        kept) when some changed endpoints feed more than EDS."""
        with previous.lock:
            clusters = dict(previous.clusters)
            shapes, listeners = dict(previous.shapes), dict(previous.listeners)
            views = dict(previous.views)
            gateway_routes = dict(previous.gateway_routes)
        derived = {}
        for (copts, view), (by_name, assignments) in clusters.items():
            old_idx = previous.index if view is None else views.get(view)
            if old_idx is None:
                return False
            new_idx = self.view(view)[0] if view is not None else self.index
            new_assignments = reassign(old_idx, new_idx, assignments)
            if new_assignments is None:
                self.views.clear()
                return False
            derived[(copts, view)] = (by_name, new_assignments)
        self.clusters, self.shapes, self.listeners = derived, shapes, listeners
        self.gateway_routes = gateway_routes      # built from Gateways and VirtualServices: unchanged
        return True


    def view(self, namespace: str) -> tuple[MeshIndex, str | None]:
        """The index of what a proxy in `namespace` sees, and its cache key."""
        if not self.per_namespace:
            return self.index, None
        idx = self.views.get(namespace)
        if idx is None:
            visible = [r for r in self.config if exported_to(r, namespace)]
            idx = self.views[namespace] = build_index(MeshConfig(visible), proxy_namespace=namespace)
        return idx, namespace


def _route_inputs(idx: MeshIndex, servers: list) -> list:
    """The resources a gateway's route configuration is built from, besides the
    services and DestinationRules: the servers' Gateways, then each bound
    VirtualService followed by the VirtualServices (or None) its routes delegate to."""
    out, refs = [], set()
    for s in servers:
        refs.add(f"{s.gateway.namespace}/{s.gateway.name}")
        if not any(g is s.gateway for g in out):
            out.append(s.gateway)
    for vs in idx.virtual_services:
        if not refs & idx.vs_gateways(vs):
            continue
        out.append(vs)
        for http in vs.spec.get("http") or []:
            if isinstance(http, dict) and http.get("delegate"):
                ref = http["delegate"] if isinstance(http["delegate"], dict) else {}
                out.append(idx.virtual_service(str(ref.get("namespace") or vs.namespace), str(ref.get("name") or "")))
    return out


_CACHE: "OrderedDict[int, _ConfigCache]" = OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 4                         # the configs being served and the ones before


def reset_cache() -> None:
    """Forget every config's translation (the next translate() of any config is a full one)."""
    with _CACHE_LOCK:
        _CACHE.clear()


def _cache_for(config: MeshConfig) -> tuple[_ConfigCache, bool]:
    with _CACHE_LOCK:
        entry = _CACHE.get(id(config))
        if entry is not None and entry.config is config:
            _CACHE.move_to_end(id(config))
            return entry, True
        previous = next(reversed(_CACHE.values()), None)     # the config translated last
    entry = _ConfigCache(config, previous)
    with _CACHE_LOCK:
        _CACHE[id(config)] = entry
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return entry, False


def _shape(idx: MeshIndex, node: ProxyNode) -> tuple:
    """What of the node changes its routes: kind, gateways selected, source labels."""
    gateways = ()
    if node.kind == "router":
        gateways = tuple(g.ref for g in idx.selected_gateways(node.labels))
    labels = frozenset(node.labels.items()) if idx.uses_source_labels else None
    return node.kind, gateways, node.namespace, labels


def _routes_for_shape(idx: MeshIndex, node: ProxyNode, cache: "_ConfigCache | None" = None) -> tuple[dict, list]:
    """Route configurations and the listeners to build: [(port, [Chain], gateway?[, address])]
    for bound listeners (address: a service VIP, else the bind address),
    [(host, port)] for proxyless API listeners."""
    base = RouteContext(idx, 0, set(), dict(node.labels), node.namespace, node.kind == "grpc")
    routes, plan = {}, []
    if node.kind == "router":
        by_port: dict[int, list] = {}
        for srv in idx.servers(idx.selected_gateways(node.labels)):
            if srv.port:
                by_port.setdefault(srv.port, []).append(srv)
        for port in sorted(by_port):
            chains = _gateway_chains(idx, port, by_port[port], base, routes, cache)
            # A server's `bind` (an IP) gets the port's listener on that address.
            binds = sorted({s.bind for s in by_port[port]}, key=lambda b: (b != "", b))
            for bind in binds if chains else ():
                plan.append((port, chains, True, bind) if bind else (port, chains, True))
    elif node.kind == "grpc":
        for svc in idx.services.values():
            for p in svc.ports:
                rc = grpc_route_config(idx, svc.host, p.number, base)
                routes[rc.name] = rc
                plan.append((svc.host, p.number))
    else:
        ports = sorted({p.number for s in idx.services.values() for p in s.ports if p.protocol in HTTP_PROTOCOLS})
        for port in ports:
            rc = sidecar_route_config(idx, port, base)
            routes[rc.name] = rc
            plan.append((port, [Chain(sidecar_route_name(port))], False))
        tcp_ports = {p.number for s in idx.services.values() for p in s.ports if p.protocol in TCP_PROTOCOLS}
        for port in sorted(tcp_ports - set(ports)):
            owners = [s for s in idx.services.values() if s.port(port)]
            ctx = RouteContext(idx, port, {MESH_GATEWAY}, dict(node.labels), node.namespace)
            # As istiod: a TCP service with VIPs listens on VIP_PORT; one
            # without has the port to itself, or (shared) no listener at all.
            for svc in owners:
                tp = first_tcp_route(ctx, mesh_virtual_services(idx, svc.host), [svc.host]) \
                    or cluster_proxy(cluster_name(svc.host, port))
                if svc.addresses:
                    plan.extend((port, [Chain(tcp_proxy=tp)], False, vip) for vip in svc.addresses)
                elif len(owners) == 1:
                    plan.append((port, [Chain(tcp_proxy=tp)], False))
    return routes, plan


def _gateway_chains(idx: MeshIndex, port: int, servers: list, base: RouteContext, routes: dict,
                    cache: "_ConfigCache | None" = None) -> list:
    """A port serves one kind of server (istiod refuses mixes): HTTPS
    terminated here (a chain and route config per server), TLS passthrough
    (a chain per SNI), TCP (one tcp_proxy), or plain HTTP (one route config)."""
    chains = []
    build = cache.gateway_route_config if cache is not None else \
        (lambda idx, port, servers, base, name="": gateway_route_config(idx, port, servers, base, name=name))
    terminated = [s for s in servers if s.terminates_tls]
    passthrough = [s for s in servers if s.protocol == "TLS" and str(s.tls.get("mode") or "").upper() == "PASSTHROUGH"]
    tcp = [s for s in servers if s.protocol in TCP_PROTOCOLS - {"TLS"}]
    http = [s for s in servers if s.protocol in ("HTTP", "HTTP2", "GRPC")]
    if terminated:
        for srv in terminated:
            name = gateway_https_route_name(port, srv.port_name, srv.gateway.name, srv.gateway.namespace)
            routes[name] = build(idx, port, [srv], base, name=name)
            sni = tuple(h for _, h in srv.hosts if h != "*") if all(h != "*" for _, h in srv.hosts) else ()
            chains.append(Chain(name, tuple(sorted((k, str(v)) for k, v in srv.tls.items())), sni))
    elif passthrough or tcp:
        group = passthrough or tcp
        refs = {f"{s.gateway.namespace}/{s.gateway.name}" for s in group}
        ctx = RouteContext(idx, port, refs, base.labels, base.namespace)
        bound = [vs for vs in idx.virtual_services if refs & idx.vs_gateways(vs)]
        hosts = [h for s in group for _, h in s.hosts]
        if passthrough:
            chains = [Chain(server_names=sni, tcp_proxy=tp) for sni, tp in tls_routes(ctx, bound, hosts)]
        else:
            tp = first_tcp_route(ctx, bound, hosts)
            chains = [Chain(tcp_proxy=tp)] if tp is not None else []
    elif http:
        rc = build(idx, port, http, base)
        routes[rc.name] = rc
        chains.append(Chain(rc.name))
    return chains


def _merge(snapshot: Snapshot, extra: Snapshot, owner: str) -> None:
    for type_url, resources in (extra or {}).items():
        target = snapshot.setdefault(type_url, {})
        for name, msg in resources.items():
            if name in target:
                raise ConfigError([Diagnostic(
                    f"{owner} adds {type_url.rsplit('.', 1)[-1]} {name!r}, which translation already emits")])
            target[name] = msg


def translate(config: MeshConfig, node: ProxyNode, options: TranslateOptions | None = None) -> Snapshot:
    """Every resource `node` should have: {type URL: {name: message}}.

    The messages are shared between proxies of the same shape and between
    calls for the same config object: treat them as read-only.
    """
    options = options or TranslateOptions()
    # Spans go to the control plane's tracer (xds_server.telemetry, /debug/tracez),
    # nested under its per-change-set "xds.translate" span when there is one.
    tracer = telemetry.tracer()
    with tracer.start_as_current_span("xds.translate.node") as span:
        span.set_attribute("xds.node.id", node.id)
        span.set_attribute("xds.node.kind", node.kind)
        cache, config_hit = _cache_for(config)
        grpc = node.kind == "grpc"
        copts = ClusterOptions(grpc=grpc, upstream_bind_address=options.upstream_bind_address)
        with cache.lock:
            idx, view = cache.view(node.namespace)
            shape = _shape(idx, node)
            clusters = cache.clusters.get((copts, view))
            if clusters is None:
                with tracer.start_as_current_span("xds.translate.clusters"):
                    clusters = cache.clusters[(copts, view)] = build_clusters(idx, copts)
            shaped = cache.shapes.get(shape)
            shape_hit = shaped is not None
            if shaped is None:
                with tracer.start_as_current_span("xds.translate.routes"):
                    shaped = cache.shapes[shape] = _routes_for_shape(idx, node, cache)
        routes, plan = shaped
        listeners = _listeners(cache, shape, plan, config, node, options, grpc)
        snapshot: Snapshot = {
            LISTENER: dict(listeners), ROUTE: dict(routes),
            CLUSTER: dict(clusters[0]), ENDPOINT: dict(clusters[1]),
        }
        for seam in SEAMS:
            _merge(snapshot, seam.resources(config, node), seam.__name__)
        span.set_attribute("xds.translate.config_cached", config_hit)
        span.set_attribute("xds.translate.endpoints_only", cache.derived)
        span.set_attribute("xds.translate.clusters_reused", cache.clusters_reused or cache.derived)
        span.set_attribute("xds.translate.shape_cached", shape_hit)
        for type_url, resources in snapshot.items():
            span.set_attribute(f"xds.resources.{type_url.rsplit('.', 1)[-1]}", len(resources))
        return snapshot


def _listeners(cache: _ConfigCache, shape: tuple, plan: list, config: MeshConfig, node: ProxyNode,
               options: TranslateOptions, grpc: bool) -> dict:
    if grpc:
        # Proxyless gRPC implements only a few HTTP filters (gRFC A39): the
        # seams' filters (jwt_authn, Wasm, grpc_web) are Envoy-only.
        key = (shape, None, None)
        tail = filter_chain_head(grpc=True) + filter_chain_tail()
        seam_filters = {}
    else:
        seam_filters = {entry[0]: [f for seam in SEAMS for f in seam.http_filters(config, node, entry[0])]
                        for entry in plan}
        key = (shape, options.bind_address,
               tuple((p, tuple(f.SerializeToString(deterministic=True) for f in fs)) for p, fs in seam_filters.items()))
    with cache.lock:
        found = cache.listeners.get(key)
        if found is not None:
            return found
    out = {}
    if grpc:
        for host, port in plan:
            lis = api_listener(host, port, tail)
            out[lis.name] = lis
    else:
        head, tail = filter_chain_head(grpc=False), filter_chain_tail()
        for port, chains, gateway, *vip in plan:
            lis = bound_listener(vip[0] if vip else options.bind_address, port, chains,
                                 head + seam_filters[port] + tail, gateway)
            out[lis.name] = lis
    with cache.lock:
        cache.listeners[key] = out
    return out
