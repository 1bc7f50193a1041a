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
"""
from __future__ import annotations

import asyncio
import ipaddress
import itertools
import time

from aiohttp import web

from mcp26.mesh import qos as Q
from mcp26.serving.json_body import parse_json_body
from mcp26.mesh.header_contract import MAX_CLASS_REMAPS, ClassRemap
from mcp26.xds.expiring import ExpiringTable
from mcp26.xds.endpoint_weights import WEIGHTS, parse_endpoint, parse_weights

MAX_HOLD_S = 3600.0      # a remap longer than an hour is a mistake, not a decision


class ClassRemaps(ExpiringTable):
    """The remaps in force, one per from-class, in priority order."""

    def __init__(self):
        super().__init__(key=lambda r: r.from_class, order=lambda r: r.from_class.priority_level,
                         limit=MAX_CLASS_REMAPS, over_limit=f"at most {MAX_CLASS_REMAPS} remaps")

    def put(self, remap: ClassRemap) -> None:
        self.put_all([remap])

    def remove(self, from_class: Q.QosClass) -> bool:
        return self.remove_where(lambda k: k == from_class) > 0


# One control plane per process: translation (wasm_plugins.plugin_configuration)
# reads the remaps here, as it reads the config it is given.
REMAPS = ClassRemaps()
_republished = itertools.count(1)


def parse_remap(body, now: float) -> ClassRemap:
    if not isinstance(body, dict):
        raise ValueError('expected {"from": CLASS, "to": CLASS, "expires_at": UNIX_SECONDS}')
    try:
        frm, to = Q.QosClass.parse(str(body.get("from", ""))), Q.QosClass.parse(str(body.get("to", "")))
    except ValueError as e:
        raise ValueError(f"from/to: {e}") from None
    exp = body.get("expires_at")
    if not isinstance(exp, (int, float)) or isinstance(exp, bool):
        raise ValueError("expires_at: expected unix seconds (a number)")
    if not now < exp <= now + MAX_HOLD_S:
        raise ValueError(f"expires_at: must be in the future and within {MAX_HOLD_S:.0f} s")
    if frm is to:
        raise ValueError("from and to are the same class")
    return ClassRemap(frm, to, float(exp))


def _loopback(request: web.Request) -> bool:
    try:
        return ipaddress.ip_address((request.remote or "").split("%")[0]).is_loopback
    except ValueError:
        return False


def served_endpoints(server, cluster: str) -> set[str] | None:
    """The endpoints (endpoint_key) of `cluster`'s EDS assignment in the config being served,
    None when it has no such EDS cluster. Off the loop: may translate the clusters once."""
    from mcp26.xds.endpoint_weights import endpoint_key
    from mcp26.xds.translate.clusters import ClusterOptions, build_clusters
    from mcp26.xds.translate.index import build_index
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


async def republish(server) -> str:
    """Re-translate the config being served (the remaps or weights changed, the config did
    not) and push what changed: only the header-contract ECDS resource, or the weighted
    clusters' EDS assignments, differ."""
    async with server._apply_lock:
        config = server.cache.config
        if config is None:
            return ""
        base = server.status["generation"] or "g0"
        generation = f"{base}.s{next(_republished)}"
        snapshots = await asyncio.to_thread(server._build, config, generation, server.hub.nodes(),
                                            server.hub.subscriptions())
        server.cache.install(config, generation, snapshots)
        server.hub.notify_all()
        return generation


def _remap_json(r: ClassRemap, now: float) -> dict:
    return {"from": r.from_class.header_value, "to": r.to_class.header_value, "expires_at": r.expires_at,
            "expires_in_s": round(r.expires_at - now, 3)}


def routes(server) -> list:
    timers: dict[Q.QosClass, asyncio.TimerHandle] = {}

    def expire_later(remap: ClassRemap) -> None:
        old = timers.pop(remap.from_class, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()

        def fire():
            timers.pop(remap.from_class, None)
            if REMAPS.drop_expired():
                loop.create_task(republish(server))
        timers[remap.from_class] = loop.call_later(max(0.0, remap.expires_at - time.time()) + 0.01, fire)

    weight_timers: dict[float, asyncio.TimerHandle] = {}

    def expire_weights_later(expires_at: float) -> None:
        # One timer per expiry instant; one that finds nothing expired (replaced meanwhile) pushes nothing.
        if expires_at in weight_timers:
            return
        loop = asyncio.get_running_loop()

        def fire():
            weight_timers.pop(expires_at, None)
            if WEIGHTS.drop_expired():
                loop.create_task(republish(server))
        weight_timers[expires_at] = loop.call_later(max(0.0, expires_at - time.time()) + 0.01, fire)

    def state(now: float, **extra) -> web.Response:
        body = {"class_remaps": [_remap_json(r, now) for r in REMAPS.active(now)],
                "endpoint_weights": [w.as_json(now) for w in WEIGHTS.active(now)], **extra}
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
            REMAPS.put(remap)
        except ValueError as e:
            return web.json_response({"error": str(e)}, status=400)
        started = time.perf_counter()
        generation = await republish(server)
        expire_later(remap)
        return state(now, generation=generation, republish_ms=round((time.perf_counter() - started) * 1e3, 3))

    async def delete_remap(request):
        if not _loopback(request):
            return web.json_response({"error": "loopback only"}, status=403)
        try:
            frm = Q.QosClass.parse(request.query.get("from", ""))
        except ValueError as e:
            return web.json_response({"error": f"from: {e}"}, status=400)
        generation = await republish(server) if REMAPS.remove(frm) else ""
        return state(time.time(), generation=generation)

    async def post_weights(request):
        if not _loopback(request):
            return web.json_response({"error": "loopback only"}, status=403)
        now = time.time()
        try:
            weights = parse_weights(parse_json_body(await request.read()), now)
        except ValueError as e:
            return web.json_response({"error": str(e)}, status=400)
        cluster = weights[0].cluster
        known = await asyncio.to_thread(served_endpoints, server, cluster)
        if known is None:
            return web.json_response({"error": f"cluster: no EDS cluster {cluster!r} in the served config"},
                                     status=404)
        missing = [w.endpoint for w in weights if w.endpoint not in known]
        if missing:
            return web.json_response({"error": f"weights[{missing[0]!r}]: not an endpoint of {cluster!r} "
                                               f"(it has {', '.join(sorted(known)) or 'none'})"}, status=404)
        try:
            WEIGHTS.put(weights)
        except ValueError as e:
            return web.json_response({"error": str(e)}, status=400)
        started = time.perf_counter()
        generation = await republish(server)
        expire_weights_later(weights[0].expires_at)
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
        removed = WEIGHTS.remove(cluster, endpoint)
        generation = await republish(server) if removed else ""
        return state(time.time(), generation=generation, removed=removed)

    return [web.get("/scheduler", get_state), web.post("/scheduler/class-remap", post_remap),
            web.delete("/scheduler/class-remap", delete_remap),
            web.get("/scheduler/endpoint-weight", get_state), web.post("/scheduler/endpoint-weight", post_weights),
            web.delete("/scheduler/endpoint-weight", delete_weights)]
