"""The decision loop's interface to the control plane (scheduler/README.md "Decision loop").

The loop (scheduler/loop/) imports only `mesh`, so it reaches the control plane
over its admin port, loopback only:

  POST   /scheduler/class-remap  {"from": CLASS, "to": CLASS, "expires_at": UNIX_S}
                                 one remap per `from` (a new one replaces it); answers the
                                 remaps now served and when the snapshots were rebuilt
  DELETE /scheduler/class-remap?from=CLASS
  POST   /scheduler/endpoint-weight  {"cluster": NAME, "weights": {"ADDRESS:PORT": 1..128}, "expires_at": UNIX_S}
                                 the load_balancing_weight of those endpoints in the cluster's EDS
                                 assignment (endpoint_weights.py); 404 for a cluster or endpoint
                                 the served config does not have; nothing applied on any error
  DELETE /scheduler/endpoint-weight?cluster=NAME[&endpoint=ADDRESS:PORT]
  GET    /scheduler/endpoint-weight  the weights in force
  GET    /scheduler              the remaps and weights in force

A remap is folded into the header-contract plugin's configuration
(translate/wasm_plugins.py -> mesh.header_contract `qos.remap`), so it travels
as one ECDS resource: no listener drains, and the filter signs the class it
gives. It carries its expiry twice: the filter stops applying it at
`expires_at` by its own clock (a control plane that stalls cannot extend it),
and the control plane drops it then and pushes the configuration without it.

The tables are the server's own (server.class_remaps, server.endpoint_weights);
after each change this module asks the server to republish its overlay
(XdsServer.republish_overlay), which translation is given whole.
"""
from __future__ import annotations

import asyncio
import ipaddress
import time

from aiohttp import web

from mcp26.mesh import qos as Q
from mcp26.mesh.header_contract import ClassRemap
from mcp26.serving.json_body import parse_json_body
from mcp26.xds.class_remaps import parse_remap
from mcp26.xds.endpoint_weights import parse_endpoint, parse_weights
from mcp26.xds.translate.clusters import ClusterOptions, build_clusters
from mcp26.xds.translate.index import build_index
from mcp26.xds.translate.overlay import endpoint_key


def _loopback(request: web.Request) -> bool:
    try:
        return ipaddress.ip_address((request.remote or "").split("%")[0]).is_loopback
    except ValueError:
        return False


def served_endpoints(server, cluster: str) -> set[str] | None:
    """The endpoints (endpoint_key) of `cluster`'s EDS assignment in the config being served,
    None when it has no such EDS cluster. Off the loop: may translate the clusters once."""
    config = server.cache.config
    if config is None:
        return None
    found = {}
    state = server.translator.cached(config)
    if state is not None:
        with state.lock:
            for _, assignments in state.clusters.values():
                found.update(assignments)
    if cluster not in found and not found:    # nothing translated yet (no proxy connected)
        found = build_clusters(build_index(config), ClusterOptions())[1]
    cla = found.get(cluster)
    if cla is None:
        return None
    return {endpoint_key(lb.endpoint.address.socket_address.address, lb.endpoint.address.socket_address.port_value)
            for loc in cla.endpoints for lb in loc.lb_endpoints if lb.endpoint.address.socket_address.address}


def _remap_json(r: ClassRemap, now: float) -> dict:
    return {"from": r.from_class.header_value, "to": r.to_class.header_value, "expires_at": r.expires_at,
            "expires_in_s": round(r.expires_at - now, 3)}


def routes(server) -> list:
    remaps, weights = server.class_remaps, server.endpoint_weights
    timers: dict[Q.QosClass, asyncio.TimerHandle] = {}

    def expire_later(remap: ClassRemap) -> None:
        old = timers.pop(remap.from_class, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()

        def fire():
            timers.pop(remap.from_class, None)
            if remaps.drop_expired():
                loop.create_task(server.republish_overlay())
        timers[remap.from_class] = loop.call_later(max(0.0, remap.expires_at - time.time()) + 0.01, fire)

    weight_timers: dict[float, asyncio.TimerHandle] = {}

    def expire_weights_later(expires_at: float) -> None:
        # One timer per expiry instant; one that finds nothing expired (replaced meanwhile) pushes nothing.
        if expires_at in weight_timers:
            return
        loop = asyncio.get_running_loop()

        def fire():
            weight_timers.pop(expires_at, None)
            if weights.drop_expired():
                loop.create_task(server.republish_overlay())
        weight_timers[expires_at] = loop.call_later(max(0.0, expires_at - time.time()) + 0.01, fire)

    def state(now: float, **extra) -> web.Response:
        body = {"class_remaps": [_remap_json(r, now) for r in remaps.active(now)],
                "endpoint_weights": [w.as_json(now) for w in weights.active(now)], **extra}
        return web.json_response(body)

    async def get_state(request):
        if not _loopback(request):
            return web.json_response({"error": "loopback only"}, status=403)
        return state(time.time())

    async def post_remap(request):
        if not _loopback(request):
            return web.json_response({"error": "loopback only"}, status=403)
        now = time.time()
        try:
            remap = parse_remap(parse_json_body(await request.read()), now)
            remaps.put(remap)
        except ValueError as e:
            return web.json_response({"error": str(e)}, status=400)
        started = time.perf_counter()
        generation = await server.republish_overlay()
        expire_later(remap)
        return state(now, generation=generation, republish_ms=round((time.perf_counter() - started) * 1e3, 3))

    async def delete_remap(request):
        if not _loopback(request):
            return web.json_response({"error": "loopback only"}, status=403)
        try:
            frm = Q.QosClass.parse(request.query.get("from", ""))
        except ValueError as e:
            return web.json_response({"error": f"from: {e}"}, status=400)
        generation = await server.republish_overlay() if remaps.remove(frm) else ""
        return state(time.time(), generation=generation)

    async def post_weights(request):
        if not _loopback(request):
            return web.json_response({"error": "loopback only"}, status=403)
        now = time.time()
        try:
            new = parse_weights(parse_json_body(await request.read()), now)
        except ValueError as e:
            return web.json_response({"error": str(e)}, status=400)
        cluster = new[0].cluster
        known = await asyncio.to_thread(served_endpoints, server, cluster)
        if known is None:
            return web.json_response({"error": f"cluster: no EDS cluster {cluster!r} in the served config"},
                                     status=404)
        missing = [w.endpoint for w in new if w.endpoint not in known]
        if missing:
            return web.json_response({"error": f"weights[{missing[0]!r}]: not an endpoint of {cluster!r} "
                                               f"(it has {', '.join(sorted(known)) or 'none'})"}, status=404)
        try:
            weights.put(new)
        except ValueError as e:
            return web.json_response({"error": str(e)}, status=400)
        started = time.perf_counter()
        generation = await server.republish_overlay()
        expire_weights_later(new[0].expires_at)
        return state(now, generation=generation, republish_ms=round((time.perf_counter() - started) * 1e3, 3))

    async def delete_weights(request):
        if not _loopback(request):
            return web.json_response({"error": "loopback only"}, status=403)
        cluster, endpoint = request.query.get("cluster", ""), request.query.get("endpoint")
        if not cluster:
            return web.json_response({"error": "cluster: required (?cluster=NAME[&endpoint=ADDRESS:PORT])"},
                                     status=400)
        try:
            endpoint = parse_endpoint(endpoint) if endpoint is not None else None
        except ValueError as e:
            return web.json_response({"error": f"endpoint: {e}"}, status=400)
        removed = weights.remove(cluster, endpoint)
        generation = await server.republish_overlay() if removed else ""
        return state(time.time(), generation=generation, removed=removed)

    return [web.get("/scheduler", get_state), web.post("/scheduler/class-remap", post_remap),
            web.delete("/scheduler/class-remap", delete_remap),
            web.get("/scheduler/endpoint-weight", get_state), web.post("/scheduler/endpoint-weight", post_weights),
            web.delete("/scheduler/endpoint-weight", delete_weights)]
