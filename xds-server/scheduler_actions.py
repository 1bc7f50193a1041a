"""The decision loop's interface to the control plane (scheduler/README.md "Decision loop").

The loop (scheduler/loop/) imports only `mesh`, so it reaches the control plane
over its admin port, loopback only:

  POST   /scheduler/class-remap  {"from": CLASS, "to": CLASS, "expires_at": UNIX_S}
                                 one remap per `from` (a new one replaces it); answers the
                                 remaps now served and when the snapshots were rebuilt
  DELETE /scheduler/class-remap?from=CLASS
  GET    /scheduler              the remaps in force

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
import threading
import time

from aiohttp import web

from mesh import qos as Q
from mesh.header_contract import MAX_CLASS_REMAPS, ClassRemap

MAX_HOLD_S = 3600.0      # a remap longer than an hour is a mistake, not a decision


class ClassRemaps:
    """The remaps in force; read by translation (any thread), written by the admin API."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by_from: dict[Q.QosClass, ClassRemap] = {}

    def active(self, now: float | None = None) -> tuple[ClassRemap, ...]:
        now = time.time() if now is None else now
        with self._lock:
            return tuple(sorted((r for r in self._by_from.values() if r.expires_at > now),
                                key=lambda r: r.from_class.priority_level))

    def put(self, remap: ClassRemap) -> None:
        with self._lock:
            if remap.from_class not in self._by_from and len(self._by_from) >= MAX_CLASS_REMAPS:
                raise ValueError(f"at most {MAX_CLASS_REMAPS} remaps")
            self._by_from[remap.from_class] = remap

    def remove(self, from_class: Q.QosClass) -> bool:
        with self._lock:
            return self._by_from.pop(from_class, None) is not None

    def drop_expired(self, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        with self._lock:
            gone = [k for k, r in self._by_from.items() if r.expires_at <= now]
            for k in gone:
                del self._by_from[k]
        return bool(gone)


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


async def republish(server) -> str:
    """Re-translate the config being served (the remaps changed, the config did not)
    and push what changed: only the header-contract ECDS resource differs."""
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

    def state(now: float, **extra) -> web.Response:
        body = {"class_remaps": [_remap_json(r, now) for r in REMAPS.active(now)], **extra}
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
            remap = parse_remap(await request.json(), now)
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

    return [web.get("/scheduler", get_state), web.post("/scheduler/class-remap", post_remap),
            web.delete("/scheduler/class-remap", delete_remap)]
