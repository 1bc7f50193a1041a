"""One benchmark run, from options to result dict (what cli.py prints and
benchmarks/bench_inference.py consumes). Several runs may share one event
loop: `await run_all([cfg_a, cfg_b])` drives them at the same time."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from mcp26.inference.bench import engine, stats
from mcp26.inference.bench.http1 import encode_request
from mcp26.inference.bench.mix import MixSequence, Priority, parse_mix
from mcp26.inference.bench import server_profile
from mcp26.inference.bench.target import (Target, TargetError, build_tensors, fetch_metadata, no_model,
                                            parse_inputs, parse_shapes, parse_url, resolve_default_model,
                                            rest_body, use_binary)
from mcp26.mesh.headers import QOS_CLASS
from mcp26.inference.bench.http_slots import HttpSlot


# The first answers looked at: all 404 means no model behind the URL (the run stops there).
PROBE_REQUESTS = 8


@dataclass
class Config:
    url: str
    concurrency: int = 1
    requests: int | None = None  # default 1000, or unbounded with --duration
    duration: float | None = None
    rate: float | None = None
    grpc: bool = False
    priority_mix: str | None = None
    model: str | None = None
    shape: str | None = None
    inputs: list[str] | None = None   # --input specs: skip the metadata call
    timeout: float = 30.0
    warmup: int = 0
    connections: int = 1        # gRPC channels (HTTP/1.1 always uses one per slot)
    grpc_client: str = "h2"     # h2: our HTTP/2 client (h2_grpc.py); grpcio: grpcio's channel
    seed: int = 0
    server_profile: bool = False  # read the server's profiler (statistics extension) around the run
    binary_data: str = "auto"     # REST inputs as the binary-tensor extension: auto (large ones), always, never

    def validate(self) -> None:
        if self.concurrency < 1:
            raise TargetError(f"-c {self.concurrency}: concurrency must be >= 1")
        if self.requests is not None and self.requests < 1:
            raise TargetError(f"-n {self.requests}: requests must be >= 1")
        if self.rate is not None and not self.rate > 0:
            raise TargetError(f"--rate {self.rate}: must be > 0")
        if self.duration is not None and not self.duration > 0:
            raise TargetError(f"--duration {self.duration}: must be > 0")
        if not self.timeout > 0:
            raise TargetError(f"--timeout {self.timeout}: must be > 0")
        if self.grpc_client not in ("h2", "grpcio"):
            raise TargetError(f"--grpc-client {self.grpc_client!r}: h2 or grpcio")
        if self.warmup < 0 or self.connections < 1:
            raise TargetError("--warmup must be >= 0 and --connections >= 1")


class Prepared:
    """Target resolved, payloads encoded, slots connected: ready to load."""

    def __init__(self, cfg: Config):
        cfg.validate()
        self.cfg = cfg
        self.target: Target = parse_url(cfg.url, cfg.model, cfg.grpc)
        mix = parse_mix(cfg.priority_mix) if cfg.priority_mix else None
        self.mix = mix
        self.priorities: list[Priority | None] = [p for p, _ in mix] if mix else [None]
        self.channels = []              # grpcio's (--grpc-client grpcio)
        self.connections = []           # ours (h2_grpc.H2GrpcConnection)
        self.slots = []
        self.cpu_s: float | None = None      # this process's CPU over the measured load (load())
        self.profile_before: dict | None = None   # the server's profiler reading before the load
        self.profile_after: dict | None = None

    async def setup(self) -> None:
        cfg, t = self.cfg, self.target
        qos = [p.header_value if p else None for p in self.priorities]
        levels = [p.level if p else None for p in self.priorities]
        if cfg.grpc:
            from mcp26.inference.bench import grpc_slots
            meta = parse_inputs(cfg.inputs)
            if meta is None:
                channel = grpc_slots.open_channels(t, 1)[0]
                try:
                    meta = await grpc_slots.fetch_metadata(t, channel)
                finally:
                    channel.close()
            tensors = build_tensors(meta, parse_shapes(cfg.shape), cfg.seed)
            payloads = [grpc_slots.infer_request(t, tensors, lv) for lv in levels]
            if cfg.grpc_client == "grpcio":
                self.channels = grpc_slots.open_channels(t, cfg.connections)
                self.slots = [grpc_slots.GrpcSlot(self.channels[i % len(self.channels)], payloads, qos, cfg.timeout)
                              for i in range(cfg.concurrency)]
            else:
                self.connections = await grpc_slots.open_connections(t, cfg.connections)
                self.slots = [grpc_slots.H2Slot(self.connections[i % len(self.connections)], t, payloads, qos,
                                                cfg.timeout) for i in range(cfg.concurrency)]
            return
        if t.short_form and not t.model:
            t.model = await asyncio.to_thread(resolve_default_model, t, cfg.url, min(cfg.timeout, 10.0))
        if t.model:
            meta = parse_inputs(cfg.inputs) or await asyncio.to_thread(fetch_metadata, t, min(cfg.timeout, 10.0))
            tensors = build_tensors(meta, parse_shapes(cfg.shape), cfg.seed)
            binary = use_binary(tensors, cfg.binary_data)
            payloads = []
            for q, lv in zip(qos, levels):
                headers, body = rest_body(tensors, lv, binary)
                payloads.append(encode_request("POST", t.infer_path, t.authority,
                                               {**headers, **({QOS_CLASS: q} if q else {})}, body))
        else:
            payloads = [encode_request("GET", t.path, t.authority, {QOS_CLASS: q} if q else {}) for q in qos]
        self.slots = [HttpSlot(t.host, t.port, payloads) for _ in range(cfg.concurrency)]
        try:
            await asyncio.gather(*(s.connect() for s in self.slots))
        except (OSError, asyncio.TimeoutError) as e:
            self.close_sync()
            raise TargetError(f"cannot connect to {t.authority}: {e}") from None

    def close_sync(self) -> None:
        for s in self.slots:
            s.close()
        for c in self.connections:
            c.close()

    async def close(self) -> None:
        self.close_sync()
        if self.channels:
            from mcp26.inference.bench import grpc_slots
            await grpc_slots.close_channels(self.channels)

    async def load(self) -> dict:
        cfg = self.cfg
        if cfg.warmup:
            await engine.run(engine.Load(requests=cfg.warmup, timeout=cfg.timeout,
                                         mix=MixSequence(self.mix) if self.mix else None), self.slots)
        load = engine.Load(requests=self.total_requests(), duration=cfg.duration, rate=cfg.rate,
                           timeout=cfg.timeout, mix=MixSequence(self.mix) if self.mix else None,
                           probe=PROBE_REQUESTS)
        if cfg.server_profile and self.target.model:
            self.profile_before = await asyncio.to_thread(server_profile.read, self.target, cfg.grpc)
        cpu0 = time.process_time()
        await engine.run(load, self.slots)
        self.cpu_s = time.process_time() - cpu0
        if load.aborted:
            raise no_model(cfg.url, self.target)
        if cfg.server_profile and self.target.model:
            self.profile_after = await asyncio.to_thread(server_profile.read, self.target, cfg.grpc)
        return self.result(load)

    def total_requests(self) -> int:
        cfg = self.cfg
        if cfg.requests is not None:
            return cfg.requests
        if cfg.duration:  # bounded by time alone
            return int(cfg.rate * cfg.duration) if cfg.rate else 10**12
        return 1000

    def result(self, load: engine.Load) -> dict:
        cfg, rec = self.cfg, load.recorder
        labels = [p.label if p else "all" for p in self.priorities]
        rows = stats.summarize_rows(rec, labels, load.t_start, load.t_end)
        if len(labels) > 1:
            for row, p in zip(rows[1:], self.priorities):
                row["qos_class"] = p.header_value
        duration = load.t_end - load.t_start
        run = {
            "target": cfg.url, "protocol": "grpc" if cfg.grpc else "http/1.1",
            "mode": "open-loop" if cfg.rate else "closed-loop", "concurrency": cfg.concurrency,
            "requests": self.total_requests(), "completed": len(rec), "duration_s": round(duration, 4),
            "rate_rps": cfg.rate, "priority_mix": cfg.priority_mix, "model": self.target.model,
        }
        if len(rec) and self.cpu_s is not None:
            # this process's CPU (every thread: grpcio's too) over the measured requests, warm-up
            # left out: on a small machine the load generator's share is part of every figure
            run["client_cpu_us_per_request"] = round(1e6 * self.cpu_s / len(rec), 1)
        if cfg.rate and len(rec):
            span = max(rec.sent) - min(rec.sent)
            run["sent_rate_rps"] = round((len(rec) - 1) / span, 2) if span > 0 else float(len(rec))
        out = {"run": run, "rows": rows, "schedule_lag": stats.schedule_lag(rec), "ended_at": time.time()}
        if cfg.server_profile and self.target.model:
            levels = ["all"] + [str(p.level) for p in self.priorities if p] if len(labels) > 1 else ["all"]
            out["server_profile"] = server_profile.window(self.profile_before, self.profile_after, levels)
        return out


async def run_all(cfgs: list[Config]) -> list[dict]:
    """Set up every run, then drive them all at once."""
    prepared = [Prepared(c) for c in cfgs]
    try:
        for p in prepared:
            await p.setup()
        results = list(await asyncio.gather(*(p.load() for p in prepared)))
        if len(results) > 1:        # the process's CPU is theirs together: no run's own
            for r in results:
                r["run"].pop("client_cpu_us_per_request", None)
        return results
    finally:
        for p in prepared:
            await p.close()


def event_loop_runner():
    """uvloop where installed: on this machine it drives 90k req/s where
    asyncio's own loop drives 57k (see bench/README.md)."""
    try:
        import uvloop
        return uvloop.run
    except ImportError:
        return asyncio.run


def run_sync(cfg: Config) -> dict:
    return event_loop_runner()(run_all([cfg]))[0]
