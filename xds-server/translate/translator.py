"""The Translator: a MeshConfig and a proxy in, every Envoy resource that
proxy should have out, as istiod's ConfigGenerator builds them -- one method
per xDS type (clusters: CDS + EDS, routes: RDS, listeners: LDS, and the HTTP
filters' extra resources such as ECDS and JWKS clusters).

Translation is a function of its arguments, as istiod's BuildListeners(node,
push): the config, the node, the TranslateOptions a Translator is made with
(options.py), and the Overlay the caller passes (overlay.py: the decision
loop's remaps and weights, the config's Wasm bytes). It reads no file, no
clock and no module-level state; its spans go to the tracer it is given.

A Translator owns its cache: the control plane holds one, tests and
benchmarks make their own, and nothing is shared between them. Work is
shared between proxies of one config (an index, namespace views, clusters),
between proxies with the same routing key (route configurations and
listeners), and with the config translated before (config_cache.py: an
endpoint-only change rebuilds only the changed assignments).
"""
from __future__ import annotations

import threading
from collections import OrderedDict

from opentelemetry import trace

from mcp26.mesh.resources import MeshConfig
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.model.type_urls import CLUSTER, ENDPOINT, LISTENER, ROUTE, Snapshot
from mcp26.xds.translate import endpoint_picker, http_filters, inference_pool
from mcp26.xds.translate.clusters import ClusterOptions, build_clusters, with_endpoint_weights
from mcp26.xds.translate.config_cache import ConfigTranslation
from mcp26.xds.translate.inbound import inbound
from mcp26.xds.translate.index import HTTP_PROTOCOLS, MESH_GATEWAY, MeshIndex
from mcp26.xds.translate.sidecar_scope import apply_egress, apply_outbound_policy, sidecar_for
from mcp26.xds.translate.listeners import Chain, api_listener, bound_listener, filter_chain_head, filter_chain_tail
from mcp26.xds.translate.names import cluster_name, gateway_https_route_name, sidecar_route_name
from mcp26.xds.translate.options import TranslateOptions
from mcp26.xds.translate.overlay import NO_OVERLAY, Overlay
from mcp26.xds.translate.route_configs import (gateway_route_config, grpc_route_config, mesh_virtual_services,
                                                sidecar_route_config)
from mcp26.xds.translate.routes import RouteContext
from mcp26.xds.translate.tcp import TCP_PROTOCOLS, cluster_proxy, first_tcp_route, tls_routes


class Translator:
    """MeshConfig x ProxyNode -> Snapshot ({type URL: {name: message}}).

    The messages returned are shared between proxies and calls: treat them as
    read-only. Thread-safe; keeps the translations of the last `keep` configs
    (the one being served and those before it).
    """

    def __init__(self, options: TranslateOptions | None = None, keep: int = 4, tracer: trace.Tracer | None = None):
        self.options = options or TranslateOptions()
        # The control plane passes its own (xds.telemetry, /debug/tracez); none: no spans.
        self.tracer = tracer or trace.NoOpTracer()
        self._keep = keep
        self._configs: "OrderedDict[int, ConfigTranslation]" = OrderedDict()   # id(config) -> its translation
        self._lock = threading.Lock()
        self._build_lock = threading.Lock()    # held while a config's ConfigTranslation is built

    # -- the whole snapshot ----------------------------------------------------
    def translate(self, config: MeshConfig, node: ProxyNode, overlay: Overlay = NO_OVERLAY) -> Snapshot:
        """Every resource `node` should have, with `overlay` laid over `config`."""
        # Nested under the control plane's per-change-set "xds.translate" span when there is one.
        with self.tracer.start_as_current_span("xds.translate.node") as span:
            span.set_attribute("xds.node.id", node.id)
            span.set_attribute("xds.node.kind", node.kind)
            state, config_hit = self._translation(config)
            clusters, assignments = self.clusters(state, node)
            assignments = with_endpoint_weights(assignments, overlay.endpoint_weights)
            routes, plan, key, routes_hit = self.routes(state, node)
            snapshot: Snapshot = {
                LISTENER: dict(self.listeners(state, node, plan, key)), ROUTE: dict(routes),
                CLUSTER: dict(clusters), ENDPOINT: dict(assignments),
            }
            if node.kind == "sidecar":
                snapshot = self.sidecar(state, node, snapshot)
            http_filters.resources(config, node, overlay, snapshot)
            span.set_attribute("xds.translate.config_cached", config_hit)
            span.set_attribute("xds.translate.endpoints_only", state.derived)
            span.set_attribute("xds.translate.clusters_reused", state.clusters_reused or state.derived)
            span.set_attribute("xds.translate.routes_cached", routes_hit)
            for type_url, resources in snapshot.items():
                span.set_attribute(f"xds.resources.{type_url.rsplit('.', 1)[-1]}", len(resources))
            return snapshot

    # -- CDS + EDS -------------------------------------------------------------
    def clusters(self, state: ConfigTranslation, node: ProxyNode) -> tuple[dict, dict]:
        """(clusters, cluster load assignments) by name, for what `node` sees."""
        copts = ClusterOptions(grpc=node.kind == "grpc", upstream_bind_address=self.options.upstream_bind_address)
        with state.lock:
            idx, view = state.view(node.namespace)
            found = state.clusters.get((copts, view))
            if found is None:
                with self.tracer.start_as_current_span("xds.translate.clusters"):
                    found = state.clusters[(copts, view)] = inference_pool.override_host(
                        idx, build_clusters(idx, copts), copts.grpc)
        return found

    # -- RDS -------------------------------------------------------------------
    def routes(self, state: ConfigTranslation, node: ProxyNode) -> tuple[dict, list, tuple, bool]:
        """(route configurations by name, the listener plan, the node's routing
        key -- which listeners are cached by too --, whether cached)."""
        with state.lock:
            idx, _ = state.view(node.namespace)
            key = routing_key(idx, node)
            found = state.routes.get(key)
            hit = found is not None
            if found is None:
                with self.tracer.start_as_current_span("xds.translate.routes"):
                    routes, plan = _route_plan(idx, node, state)
                    found = state.routes[key] = (endpoint_picker.with_picker(idx, node, routes), plan)
        return found[0], found[1], key, hit

    # -- LDS -------------------------------------------------------------------
    def listeners(self, state: ConfigTranslation, node: ProxyNode, plan: list, key: tuple) -> dict:
        """Listeners by name: bound ones for gateways and sidecars (their HCMs
        carrying the filter chain of http_filters.py), API listeners for
        proxyless gRPC."""
        grpc = node.kind == "grpc"
        if grpc:
            filters = {}
            cache_key = (key, None, None)
        else:
            filters = {entry[0]: http_filters.phase_filters(state.config, node, entry[0]) for entry in plan}
            cache_key = (key, self.options.bind_address,
                         tuple((p, tuple(f.SerializeToString(deterministic=True) for f in fs))
                               for p, fs in filters.items()))
        with state.lock:
            found = state.listeners.get(cache_key)
            if found is not None:
                return found
        out = {}
        if grpc:
            tail = filter_chain_head(grpc=True) + filter_chain_tail()
            for host, port in plan:
                lis = api_listener(host, port, tail)
                out[lis.name] = lis
        else:
            head, tail = filter_chain_head(grpc=False), filter_chain_tail()
            for port, chains, gateway, *vip in plan:
                lis = bound_listener(vip[0] if vip else self.options.bind_address, port, chains,
                                     head + filters[port] + tail, gateway, self.options.stream_idle_timeout_s)
                out[lis.name] = lis
        with state.lock:        # built meanwhile for another proxy of this key: share that one
            return state.listeners.setdefault(cache_key, out)

    # -- a sidecar's Sidecar resource: inbound listeners, egress scope ----------
    def sidecar(self, state: ConfigTranslation, node: ProxyNode, snapshot: Snapshot) -> Snapshot:
        """Inbound listeners and clusters for the Sidecar's ingress ports (an
        inbound listener replaces an outbound one of the same name), and only
        what its egress hosts allow (sidecar_scope.py, inbound.py)."""
        scope = sidecar_for(state.config, node)
        if scope is None:
            return snapshot
        with state.lock:
            idx, _ = state.view(node.namespace)
        snapshot = apply_egress(snapshot, idx, scope, node)
        snapshot = apply_outbound_policy(snapshot, scope)
        listeners, clusters = inbound(state.config, node, scope, self.options)
        if listeners:
            snapshot[LISTENER] = {**snapshot[LISTENER], **listeners}
            snapshot[CLUSTER] = {**snapshot[CLUSTER], **clusters}
        return snapshot

    # -- the per-config cache --------------------------------------------------
    def cached(self, config: MeshConfig) -> ConfigTranslation | None:
        """The kept translation of this config object, if any (kept longer: it was used)."""
        with self._lock:
            found = self._configs.get(id(config))
            if found is None or found.config is not config:
                return None
            self._configs.move_to_end(id(config))
            return found

    def reset(self) -> None:
        """Forget every config's translation: the next one is a full translation."""
        with self._lock:
            self._configs.clear()

    def _translation(self, config: MeshConfig) -> tuple[ConfigTranslation, bool]:
        found = self.cached(config)
        if found is not None:
            return found, True
        # One build per config: the first proxies of several shapes arrive together (the
        # server translates each new shape in a worker thread), and each used to build a
        # ConfigTranslation of its own, then all of its clusters and routes: 20 shapes of
        # a 1,000-service mesh cost 20 full translations (xds-server/README.md "Scale").
        with self._build_lock:
            found = self.cached(config)
            if found is not None:
                return found, True
            with self._lock:
                previous = next(reversed(self._configs.values()), None)     # the config translated last
            state = ConfigTranslation(config, previous)
            with self._lock:
                self._configs[id(config)] = state
                while len(self._configs) > self._keep:
                    self._configs.popitem(last=False)
        return state, False


def translate(config: MeshConfig, node: ProxyNode, options: TranslateOptions | None = None,
              overlay: Overlay = NO_OVERLAY) -> Snapshot:
    """One translation with a Translator of its own (nothing cached across
    calls): for tests, tools and one-off use. A server keeps a Translator.
    A config with WasmPlugins needs their modules in `overlay.wasm_modules`
    (xds.wasm_modules.WasmModuleStore.load)."""
    return Translator(options).translate(config, node, overlay)


# -- route planning: what a node's routes and listeners are built from ---------------

def routing_key(idx: MeshIndex, node: ProxyNode) -> tuple:
    """What of a node its routes depend on: kind, the gateways it runs,
    namespace, and its labels where some route matches sourceLabels. Nodes
    with equal keys share route configurations and listeners."""
    gateways = ()
    if node.kind == "router":
        gateways = tuple(g.ref for g in idx.selected_gateways(node.labels))
    labels = frozenset(node.labels.items()) if idx.uses_source_labels else None
    return node.kind, gateways, node.namespace, labels


def _route_plan(idx: MeshIndex, node: ProxyNode, cache: "ConfigTranslation | None" = None) -> tuple[dict, list]:
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
                    cache: "ConfigTranslation | None" = None) -> list:
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
