"""Route configurations: one per listener port, virtual hosts per host:port.

Gateways: `http.PORT` holds a virtual host for every host a VirtualService
bound to the gateway shares with the gateway server's hosts. Sidecars:
`PORT` holds a virtual host per service on that port (VirtualService routes
for `mesh`, else a default route to the service). Proxyless gRPC: one route
configuration per `HOST:PORT`, named like its API listener.

An L7SchedulingPolicy with the seed's routing fields (mesh/l7_routing.py) puts one route
before the others in every virtual host of the gateways' and sidecars' route
configurations in its namespace: its headers matched exactly, to backendService, with the
QoS class of its priority in the route's `mcp-mesh` metadata, where the header-contract
filter reads it (the highest priority first, then by name).
"""
from __future__ import annotations

from envoy.config.route.v3 import route_components_pb2, route_pb2

from google.protobuf import struct_pb2

from mcp26.mesh.batching_policy import KIND as SCHEDULING_POLICY
from mcp26.mesh.header_contract import ROUTE_CLASS_KEY
from mcp26.mesh.l7_routing import parse_routing
from mcp26.mesh.resources import Resource
from mcp26.xds.translate.index import DOMAIN_SUFFIX, MESH_GATEWAY, GatewayServer, MeshIndex, host_intersection, host_matches
from mcp26.xds.translate.names import cluster_name, gateway_route_name, grpc_listener_name, sidecar_route_name, virtual_host_name
from mcp26.xds.translate.routes import SOURCE_METADATA, RouteContext, default_route, http_routes

RouteConfiguration = route_pb2.RouteConfiguration
DIRECT_RESPONSE_BODY_LIMIT = 4096       # Envoy's default max_direct_response_body_size_bytes


def _domains(host: str, port: int) -> list[str]:
    return ["*"] if host == "*" else [host, f"{host}:{port}"]


def sidecar_domains(idx: MeshIndex, host: str, port: int, namespace: str) -> list[str]:
    """What a sidecar's client may send as Host, as istiod's
    generateVirtualHostDomains: the name, the Kubernetes short forms a pod
    in `namespace` can use (reviews, reviews.shop, reviews.shop.svc), the
    service's VIPs -- each bare and with :PORT."""
    names = [host]
    suffix = f".{DOMAIN_SUFFIX}"
    if host.endswith(suffix):
        name, _, ns = host[:-len(suffix)].rpartition(".")
        if name and "." not in name:
            names += ([name] if ns == namespace else []) + [f"{name}.{ns}", f"{name}.{ns}.svc"]
    svc = idx.services.get(host)
    names += list(svc.addresses) if svc else []
    return [d for n in names for d in _domains(n, port)]




def scheduling_policies(idx: MeshIndex, namespace: str) -> list[Resource]:
    """The L7SchedulingPolicies of `namespace` that route (have the routing fields)."""
    return [r for r in idx.config.of_kind(SCHEDULING_POLICY)
            if r.namespace == namespace and parse_routing(r.spec)[0] is not None]


def scheduling_routes(idx: MeshIndex, namespace: str) -> list:
    """The routes of `namespace`'s routing L7SchedulingPolicies (module docstring)."""
    key = ("l7-scheduling-routes", namespace)
    if key in idx.memo:
        return idx.memo[key]
    rules = []
    for res in scheduling_policies(idx, namespace):
        rule, _ = parse_routing(res.spec)
        host = idx.resolve(rule.backend_host, namespace)
        svc = idx.services.get(host)
        port = rule.backend_port or (min(p.number for p in svc.ports) if svc and svc.ports else 80)
        route = route_components_pb2.Route(name=f"l7schedulingpolicy.{res.namespace}.{res.name}")
        route.match.prefix = "/"
        for name, value in rule.match_headers:
            route.match.headers.add(name=name).string_match.exact = value
        route.route.cluster = cluster_name(host, port)
        route.route.timeout.SetInParent()
        md = struct_pb2.Struct()
        # where it came from (`mcpctl route explain`: explain/sources.py), and the class it gives
        md.update({"resource": res.ref, "rule": "spec", "priority": rule.priority,
                   ROUTE_CLASS_KEY: rule.qos_class.header_value})
        route.metadata.filter_metadata[SOURCE_METADATA].CopyFrom(md)
        rules.append((-rule.priority, res.name, route))
    idx.memo[key] = [r for *_, r in sorted(rules, key=lambda t: t[:2])]
    return idx.memo[key]


def _route_config(name: str, vhosts: dict[str, list], port: int, tls_only: set = frozenset(),
                  domains=None, first: list = ()) -> RouteConfiguration:
    rc = RouteConfiguration(name=name)
    rc.validate_clusters.value = False     # as istiod: a missing cluster is a 503, not a NACK
    seen: set = set()
    for host in sorted(vhosts):
        vh = rc.virtual_hosts.add(name=virtual_host_name(host, port))
        # Envoy NACKs a domain two virtual hosts share: the first keeps it (istiod's dedupe).
        for d in (domains(host) if domains else _domains(host, port)):
            if d.lower() not in seen:
                seen.add(d.lower())
                vh.domains.append(d)
        vh.routes.extend(first)
        vh.routes.extend(vhosts[host])
        if host in tls_only:
            vh.require_tls = route_components_pb2.VirtualHost.ALL    # tls.httpsRedirect: 301 to https
    _fit_direct_responses(rc, [r for routes in vhosts.values() for r in routes])
    return rc


def _fit_direct_responses(rc: RouteConfiguration, routes: list) -> None:
    """Envoy refuses a direct response body over 4 KiB unless the route
    configuration raises the limit; raise it to the largest body it holds."""
    largest = max((len(r.direct_response.body.inline_string.encode()) or len(r.direct_response.body.inline_bytes)
                   for r in routes if r.HasField("direct_response")), default=0)
    if largest > DIRECT_RESPONSE_BODY_LIMIT:
        rc.max_direct_response_body_size_bytes.value = largest


def gateway_route_config(idx: MeshIndex, port: int, servers: list[GatewayServer],
                         ctx_base: RouteContext, name: str = "") -> RouteConfiguration:
    vhosts: dict[str, list] = {}
    tls_only: set = set()
    for vs in idx.virtual_services:
        bound = idx.vs_gateways(vs)
        mine = [s for s in servers if f"{s.gateway.namespace}/{s.gateway.name}" in bound]
        if not mine:
            continue
        hosts: list[str] = []
        for vs_host in vs.spec.get("hosts") or []:
            for s in mine:
                for ns, server_host in s.hosts:
                    if ns not in ("*", vs.namespace):
                        continue
                    # DNS names are case-insensitive; Envoy rejects domains equal but for case.
                    h = host_intersection(str(vs_host).lower(), server_host.lower())
                    if h and h not in hosts:
                        hosts.append(h)
                    if h and s.tls.get("httpsRedirect"):
                        tls_only.add(h)
        if not hosts:
            continue
        ctx = RouteContext(idx, port, {f"{s.gateway.namespace}/{s.gateway.name}" for s in mine},
                           ctx_base.labels, ctx_base.namespace)
        routes = http_routes(ctx, vs)
        for h in hosts:
            # Several VirtualServices for one host merge, in config order.
            vhosts.setdefault(h, []).extend(routes)
    return _route_config(name or gateway_route_name(port), vhosts, port, tls_only,
                         first=scheduling_routes(idx, ctx_base.namespace))


def mesh_virtual_services(idx: MeshIndex, host: str) -> list[Resource]:
    """VirtualServices for `mesh` naming `host`: exact hosts, else the first wildcard."""
    exact = idx.mesh_vs_exact.get(host)
    if exact:
        return exact
    return next(([vs] for pattern, vs in idx.mesh_vs_wildcard if host_matches(host, pattern)), [])


def mesh_virtual_host_routes(idx: MeshIndex, host: str, port: int, ctx_base: RouteContext) -> list:
    ctx = RouteContext(idx, port, {MESH_GATEWAY}, ctx_base.labels, ctx_base.namespace, ctx_base.grpc)
    routes = []
    for vs in mesh_virtual_services(idx, host):
        routes.extend(http_routes(ctx, vs))
    if not routes:
        routes = [default_route(ctx, host, port)]
    return routes


def sidecar_route_config(idx: MeshIndex, port: int, ctx_base: RouteContext) -> RouteConfiguration:
    vhosts = {}
    for svc in idx.services.values():
        if svc.port(port):
            vhosts[svc.host] = mesh_virtual_host_routes(idx, svc.host, port, ctx_base)
    # As istiod: a `mesh` VirtualService host that is no service (an external
    # name, a wildcard) gets a virtual host on every HTTP port's route config.
    ctx = RouteContext(idx, port, {MESH_GATEWAY}, ctx_base.labels, ctx_base.namespace)
    for vs in idx.virtual_services:
        if MESH_GATEWAY not in idx.vs_gateways(vs):
            continue
        extra = [h for h in (idx.resolve(str(h), vs.namespace).lower() for h in vs.spec.get("hosts") or [])
                 if h not in idx.services and h not in vhosts]
        if extra:
            routes = http_routes(ctx, vs)
            for h in extra:
                if routes:
                    vhosts[h] = routes
    return _route_config(sidecar_route_name(port), vhosts, port,
                         domains=lambda h: sidecar_domains(idx, h, port, ctx_base.namespace),
                         first=scheduling_routes(idx, ctx_base.namespace))


def grpc_route_config(idx: MeshIndex, host: str, port: int, ctx_base: RouteContext) -> RouteConfiguration:
    name = grpc_listener_name(host, port)
    rc = RouteConfiguration(name=name)
    vh = rc.virtual_hosts.add(name=virtual_host_name(host, port))
    vh.domains.extend([name, host])
    routes = mesh_virtual_host_routes(idx, host, port, ctx_base)
    vh.routes.extend(routes)
    _fit_direct_responses(rc, routes)
    return rc
