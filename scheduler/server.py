"""`mcpctl epp serve`: the Endpoint Picker process. One asyncio loop holds
the ext_proc gRPC server (with the gRPC health services the protocol names),
the metrics poller, the pool refresh and a small admin HTTP endpoint
(`/stats`: picks per endpoint, refusals, decision time, prefix-hit rate,
the streamed answers seen to their end: SSE events, completion tokens, and
the garbage collector's pauses; `/metrics`: the upstream picker's Prometheus
names, scheduler/prometheus.py)."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter

import grpc
from aiohttp import web
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from mcp26.mesh import endpoint_picker as epp
from mcp26.serving import gc_pauses
from mcp26.serving.grpc.frontends import LANE
from mcp26.serving.grpc.server import EXCLUSIVE_PORT, GrpcLane, start_server
from mcp26.serving.h2 import limits as h2_limits
from mcp26.scheduler.ext_proc import EndpointPicker
from mcp26.scheduler.metrics import MetricsPoller
from mcp26.scheduler.pool_source import KubePoolSource, PoolSource, PoolView
from mcp26.scheduler.picker import Pick, Refusal, Scheduler
from mcp26.scheduler.prometheus import PickerMetrics
from mcp26.scheduler.loop.marks import FlowMarks

log = logging.getLogger("scheduler")
POOL_REFRESH_S = 0.5
EXT_PROC_MAX_MESSAGE = 4 << 20     # grpcio's default receive limit, which the grpc.aio server had


class PickerState:
    """What the servicer reads (the pool view, live loads, the scheduler) and what it reports."""

    def __init__(self, source: PoolSource, poller: MetricsPoller, scheduler: Scheduler | None = None):
        self.source, self.poller = source, poller
        self.scheduler = scheduler or Scheduler()
        self.picks: Counter = Counter()
        self.refusals: Counter = Counter()
        self.decisions, self.decision_s = 0, 0.0
        self.header_picks = 0                  # of the decisions: picked on the headers (pick_by_session)
        self.session_mode_refused = 0          # header picks whose body still came (override not allowed)
        self.prompts, self.prefix_hits = 0, 0.0
        self.streams, self.stream_events, self.stream_tokens = 0, 0, 0
        self.flow_marks = None                 # the loop's marked flows (--flow-marks)
        self.session_key: bytes | None = None  # re-signs an upgraded flow's class (--session-key-file)
        self.upgrades_refused = 0              # upgrades not applied: the request's signature failed
        self.gc: gc_pauses.PauseTally | None = None   # the process's GC pauses (serve() sets it)
        self.metrics = PickerMetrics().attach(self)   # /metrics, in the upstream picker's names

    def view(self) -> PoolView | None:
        return self.source.view

    def loads(self):
        return self.poller.loads

    def refresh(self) -> None:
        if self.source.refresh() and self.source.view is not None:
            self.poller.set_endpoints(e.key for e in self.source.view.endpoints)

    def record(self, result: Pick | Refusal, seconds: float, by_headers: bool = False,
               model: str | None = None) -> None:
        """`by_headers`: a live session's request picked without its body (one message);
        `model`: the model its body named."""
        self.metrics.decided(model, result.status if isinstance(result, Refusal) else None, seconds)
        self.decisions += 1
        self.header_picks += by_headers
        self.decision_s += seconds
        if isinstance(result, Refusal):
            self.refusals[result.status] += 1
            return
        self.picks[result.endpoints[0]] += 1
        if result.prompt_blocks:
            self.prompts += 1
            self.prefix_hits += result.prefix_hit

    def record_stream(self, events: int, usage: dict | None) -> None:
        """A streamed (SSE) answer that passed through the picker to its last chunk."""
        self.streams += 1
        self.stream_events += events
        tokens = (usage or {}).get("completion_tokens")
        if isinstance(tokens, int):
            self.stream_tokens += tokens

    def stats(self) -> dict:
        view = self.view()
        now = time.monotonic()
        return {
            "pool": view.pool.ref if view else None,
            "endpoints": {k: {"ready": l.ready, "waiting": l.waiting, "running": l.running,
                              "kv_utilisation": l.kv_utilisation, "age_ms": None if l.age_s(now) is None
                              else round(l.age_s(now) * 1000, 1),
                              "in_flight": self.scheduler.inflight.get(k, 0), "picked": self.picks[k]}
                          for k, l in self.loads().items()},
            "refused": {str(k): v for k, v in self.refusals.items()},
            "decisions": self.decisions,
            "header_picks": self.header_picks,
            "session_mode_refused": self.session_mode_refused,
            "upgrades_refused": self.upgrades_refused,
            "mean_decision_us": round(self.decision_s / self.decisions * 1e6, 1) if self.decisions else None,
            "prefix_hit_rate": round(self.prefix_hits / self.prompts, 4) if self.prompts else None,
            "streamed": {"answers": self.streams, "events": self.stream_events,
                         "completion_tokens": self.stream_tokens},
            "config_error": self.source.error,
            "gc": self.gc.snapshot() if self.gc else None,
        }


async def serve(config_dir: str | None, pool: str, grpc_port: int, admin_port: int, address: str,
                metrics_interval_ms: float, ready: asyncio.Event | None = None, flow_marks: str | None = None,
                session_key: bytes | None = None, grpc_frontend: str = LANE, kube_api=None) -> None:
    """The pool from `config_dir`, or (None) from the API server `kube_api` (mesh.kube_source.KubeApi)."""
    source = PoolSource(config_dir, pool) if config_dir is not None else KubePoolSource(kube_api, pool)
    await source.start()
    poller = MetricsPoller(interval_s=metrics_interval_ms / 1000.0)
    state = PickerState(source, poller)
    if flow_marks:               # the decision loop's marked flows (ext_proc._flow_marks reads state.flow_marks)
        state.flow_marks = FlowMarks(flow_marks)
    state.session_key = session_key
    state.refresh()
    # fast: serving.grpc.server's lane (an ext_proc stream through Envoy ~0.5 ms cheaper than on
    # grpc.aio, scheduler/README.md); grpcio: grpc.aio
    server = GrpcLane(EXT_PROC_MAX_MESSAGE, EXT_PROC_MAX_MESSAGE) if grpc_frontend == LANE else grpc.aio.server(options=[EXCLUSIVE_PORT])
    pb_grpc.add_ExternalProcessorServicer_to_server(EndpointPicker(state), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = await start_server(server, address, grpc_port, "the ext_proc port", reuse_address=True)

    async def set_health():
        serving = health_pb2.HealthCheckResponse.SERVING
        await health_servicer.set(epp.LIVENESS, serving)
        synced = serving if source.view is not None else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *epp.READINESS_SERVICES):          # "": the server as a whole
            await health_servicer.set(name, synced)

    app = web.Application()
    app.router.add_get("/stats", lambda _: web.json_response(state.stats()))
    app.router.add_get("/healthz", lambda _: web.Response(text="ok"))
    # The upstream picker's names, and what HTTP/2 clients of the ext_proc port were refused or
    # closed for (serving/h2/limits.py), in one registry.
    h2_limits.export_metrics(state.metrics.registry)
    app.router.add_get("/metrics", lambda _: web.Response(
        body=state.metrics.text(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, address, admin_port)
    await site.start()
    admin = runner.addresses[0][1] if runner.addresses else admin_port
    # Out of the cyclic collector's sight before it says SERVING: a full collection of the
    # startup heap stopped the loop 16-22 ms every ~3,000 requests (serving/gc_pauses.py).
    gc_pauses.freeze_startup_heap()
    state.gc = gc_pauses.PauseTally()       # the pauses while serving, not the freeze's own
    await set_health()
    print(json.dumps({"event": "ready", "grpc_port": bound, "admin_port": admin,
                      "pool": pool, "endpoints": [e.key for e in source.view.endpoints] if source.view else []}),
          flush=True)
    if ready is not None:
        ready.set()
    metrics_task = asyncio.create_task(poller.run())
    try:
        while True:
            await asyncio.sleep(POOL_REFRESH_S)
            state.refresh()
            await set_health()
            if metrics_task.done():
                raise RuntimeError(f"metrics poller stopped: {metrics_task.exception()!r}")
    finally:
        metrics_task.cancel()
        await source.stop()
        await server.stop(0.5)
        await runner.cleanup()

