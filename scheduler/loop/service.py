"""`mcpctl scheduler run`: the decision loop over an InferencePool, with its admin HTTP
(loopback only): GET /status (decisions, inputs, expiry, call cost), GET /flows (the
flows marked latency-critical, for the Endpoint Picker's path), GET /healthz."""
from __future__ import annotations

import asyncio
import ipaddress
import json
import logging

from aiohttp import web

from mcp26.scheduler.loop.actions import ActionApplier, pool_cluster
from mcp26.scheduler.loop.loop import DecisionLoop
from mcp26.scheduler.loop.policy import load_policy
from mcp26.scheduler.pool_source import PoolSource

log = logging.getLogger("mcp26.scheduler.loop")


def _loopback_only(handler):
    async def wrapped(request):
        try:
            ok = ipaddress.ip_address((request.remote or "").split("%")[0]).is_loopback
        except ValueError:
            ok = False
        return await handler(request) if ok else web.json_response({"error": "loopback only"}, status=403)
    return wrapped


def make_app(loop: DecisionLoop) -> web.Application:
    async def status(request):
        return web.json_response(loop.status(), dumps=lambda d: json.dumps(d, indent=1))

    async def flows(request):
        return web.json_response(loop.status()["in_force"]["flows"])

    async def healthz(request):
        return web.json_response({"status": "ok", "cycles": loop.cycles})

    app = web.Application()
    app.add_routes([web.get(p, _loopback_only(h)) for p, h in
                    (("/status", status), ("/flows", flows), ("/healthz", healthz))])
    return app


async def run(config_dir: str, pool_ref: str, control_plane_admin: str, period_ms: float = 200.0,
              policy_file: str | None = None, admin_port: int = 0, address: str = "127.0.0.1",
              remap_hold_s: float | None = None, budget_ms: float | None = None,
              replica_admin: dict | None = None, replica_pids: dict | None = None, flows_fn=None,
              flow_marks: str | None = None, burst_preset: str | None = None, resources=None) -> None:
    # a Wasm plugin's build + compile can take ~30-60 s cold: load it before the loop, off the event loop
    policy, name = await asyncio.to_thread(load_policy, policy_file, remap_hold_s, None, True, burst_preset)
    pool = PoolSource(config_dir, pool_ref)
    pool.refresh()

    def endpoints():
        pool.refresh()          # a stat of each file: cheap enough per period
        return [e.key for e in pool.view.endpoints] if pool.view else []

    loop = DecisionLoop(policy, name, endpoints, ActionApplier(control_plane_admin, replica_admin, marks_path=flow_marks,
                                                               weight_cluster=pool_cluster(pool_ref)),
                        period_s=period_ms / 1e3, budget_s=None if budget_ms is None else budget_ms / 1e3,
                        flows_fn=flows_fn, resources=resources)
    loop.reader.pids.update(replica_pids or {})
    runner = web.AppRunner(make_app(loop), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, address, admin_port)
    await site.start()
    port = runner.addresses[0][1]
    print(json.dumps({"event": "ready", "admin_port": port, "policy": name,
                      "endpoints": endpoints(), "pool_error": pool.error}), flush=True)
    try:
        await loop.run()
    finally:
        await loop.close()
        await runner.cleanup()
