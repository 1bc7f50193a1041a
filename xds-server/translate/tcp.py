"""VirtualService `tcp:` and `tls:` routes as Envoy tcp_proxy filter chains.

Gateway servers of protocol TCP get one tcp_proxy chain (the first tcp route
that applies); servers of protocol TLS with `tls.mode: PASSTHROUGH` get a
chain per `tls` route match, chosen by SNI (`sniHosts`) without terminating
TLS. Sidecars get a tcp_proxy listener for a TCP service port served by one
service (without service VIPs, a port shared by several TCP services cannot
be told apart, so it gets none).
"""
from __future__ import annotations

from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2

from mcp26.mesh.resources import Resource
from mcp26.xds.translate.index import TCP_PROTOCOLS, host_intersection
from mcp26.xds.translate.routes import RouteContext, destination, match_applies

TCP_PROXY_FILTER = "envoy.filters.network.tcp_proxy"


def tcp_proxy(ctx: RouteContext, vs: Resource, route: dict) -> tcp_proxy_pb2.TcpProxy | None:
    dests = [d for d in route.get("route") or [] if isinstance(d, dict)]
    weighted = [d for d in dests if len(dests) == 1 or int(d.get("weight") or 0) > 0] or dests[:1]
    if not weighted:
        return None
    names = [(destination(ctx, vs, d.get("destination") or {})[0], int(d.get("weight") or 0)) for d in weighted]
    tp = tcp_proxy_pb2.TcpProxy()
    if len(names) == 1:
        tp.cluster = tp.stat_prefix = names[0][0]
    else:
        tp.stat_prefix = f"outbound_tcp_{ctx.port}"
        for name, weight in names:
            tp.weighted_clusters.clusters.add(name=name, weight=weight)
    return tp


def cluster_proxy(cluster: str) -> tcp_proxy_pb2.TcpProxy:
    return tcp_proxy_pb2.TcpProxy(stat_prefix=cluster, cluster=cluster)


def _bound(ctx: RouteContext, vs: Resource, hosts: list[str]) -> bool:
    return any(host_intersection(ctx.idx.resolve(str(h), vs.namespace).lower(), sh.lower())
               for h in vs.spec.get("hosts") or [] for sh in hosts)


def first_tcp_route(ctx: RouteContext, candidates: list[Resource], hosts: list[str]) -> tcp_proxy_pb2.TcpProxy | None:
    """The first `tcp` route (of VirtualServices naming one of `hosts`) that applies here."""
    for vs in candidates:
        if not _bound(ctx, vs, hosts):
            continue
        for route in vs.spec.get("tcp") or []:
            if not isinstance(route, dict):
                continue
            matches = [m for m in route.get("match") or [] if isinstance(m, dict)]
            if matches and not any(match_applies(ctx, vs, m) for m in matches):
                continue
            tp = tcp_proxy(ctx, vs, route)
            if tp is not None:
                return tp
    return None


def tls_routes(ctx: RouteContext, candidates: list[Resource], hosts: list[str]) -> list[tuple[tuple, tcp_proxy_pb2.TcpProxy]]:
    """[(SNI names, tcp_proxy)] for the `tls` routes that apply here, in order."""
    out = []
    for vs in candidates:
        if not _bound(ctx, vs, hosts):
            continue
        for route in vs.spec.get("tls") or []:
            if not isinstance(route, dict):
                continue
            tp = None
            for m in route.get("match") or []:
                if not isinstance(m, dict) or not match_applies(ctx, vs, m):
                    continue
                tp = tp or tcp_proxy(ctx, vs, route)
                sni = tuple(str(h).lower() for h in m.get("sniHosts") or [])
                if tp is not None and sni:
                    out.append((sni, tp))
    return out
