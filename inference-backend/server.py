"""One server process: REST + gRPC on one asyncio loop, hot reconfiguration, shutdown.

Reconfiguration arrives two ways, both taken whole or not at all:
- a watched `--policy-file` (an L7SchedulingPolicy; checked by the same
  validator `mcpctl validate` uses) or a watched `--model` file;
- the admin listener (`--admin-port`): POST /admin/reload {"model", "path"?,
  "version"?}, POST /admin/policy {"qosPolicy" | L7SchedulingPolicy spec},
  POST /admin/class-weight {"class", "weight"} (the decision loop's class-weight action),
  GET /admin/status. It is a separate port so the mesh never routes to it.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass, replace

import grpc
import prometheus_client
from aiohttp import web
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from mcp26.serving import gc_pauses
from mcp26.serving.grpc.frontends import LANE
from mcp26.serving.grpc.server import EXCLUSIVE_PORT, GrpcLane, start_server
from mcp26.mesh.resources import MeshConfig
from mcp26.serving.json_body import parse_json_body
from mcp26.mesh.parse import parse_documents
from mcp26.mesh.validation import check
from mcp26.mesh.diagnostics import ConfigError, Diagnostic
from mcp26.mesh.qos import QosClass
from mcp26.mesh.session import DEFAULT_MAX_AGE_S, MIN_KEY_BYTES
from mcp26.mesh.batching_policy import (BatcherSettings, KIND, preset, selector_matches, settings_from_spec,
                                        with_class_weight)
from mcp26.inference import connection_balance
from mcp26.inference.errors import InferenceError, InvalidArgument
from mcp26.inference.grpc_service import add_to_server
from mcp26.inference.model_server import ModelServer, resolve_model, split_off_reason
from mcp26.inference.priority_worker import PARENT_NICE, PriorityWorker, lower_own_priority
from mcp26.inference.protos import grpc_service_pb2 as pb
from mcp26.inference.rest import InferCore, build_app
from mcp26.inference.rest_httptools import FastLane
from mcp26.inference import openai_api, resource_signals, triton_rpcs
from mcp26.inference.response_cache import ResponseCache, parse_cache_config
from mcp26.inference.response_cache import register_metrics as register_response_cache_metrics
from mcp26.inference.telemetry import Telemetry
from mcp26.inference.model_repository import Repository
from mcp26.inference.event_lines import emit_event

log = logging.getLogger("mcp26.inference")

WATCH_INTERVAL_S = 0.25
REPOSITORY_POLL_S = 1.0          # --model-control-mode poll: the directory is read this often
GRPC_MAX_MESSAGE = 64 << 20


@dataclass
class ServeOptions:
    model: str | None
    model_repository: str | None = None      # a Triton model repository directory (model_repository.py)
    load_models: list | None = None          # explicit mode: the repository's models loaded at start
    partition: str | None = None             # one graph in stages over devices (partition.py's SPEC)
    name: str | None = None
    default_model: str | None = None         # what POST /infer stands for (default: the only model)
    host: str = "127.0.0.1"
    http_port: int = 8080
    grpc_port: int = 8081
    priority_argv: list[str] | None = None   # `mcpctl serve` arguments of the priority worker, if any
    serve_class: str | None = None           # as a priority worker: the one class both front ends take
    admin_port: int | None = None
    device: str = "auto"
    qos_policy: str = "balanced"
    policy_file: str | None = None
    max_batch: int | None = None
    max_queue_delay_us: int | None = None
    intra_op_threads: int | None = None
    instances: int = 1                       # compute threads per model (Triton's instance_group count)
    split_under_load: bool = False           # one-thread instances while more than a batch waits (batch_formation.py)
    kv_cache_mb: float = 64
    kv_idle_seconds: float = 5.0             # unreferenced KV blocks are dropped after this long (kv_blocks.py)
    openai_models: dict | None = None        # OpenAI model name -> (served model, version): openai_api.py
    max_body_bytes: int = 64 << 20
    session_key_file: str | None = None
    session_max_age: float = DEFAULT_MAX_AGE_S
    trace_file: str | None = None
    enable_profiler: bool = False
    labels: dict | None = None
    watch_model: bool = False
    drain_seconds: float = 1.0
    model_control_mode: str = "none"         # Triton's: explicit allows repository load / unload
    fast_path: bool = True                   # idle dispatch + inline runs (batch_formation.py, batcher.py); off: --no-fast-path
    workers: int = 1                         # processes serving the same ports: see Workers
    worker_argv: list[str] | None = None     # first worker: `mcpctl serve` arguments of the others, less ports
    worker_index: int = 0                    # 0: the first worker (admin, fan-out); 1..N-1: the others
    connection_balance: str = "exact"        # with workers: exact (connection_balance.py) or kernel (SO_REUSEPORT)
    inherited: dict | None = None            # a worker but the first: the shared sockets' and counts' fds
    rest_frontend: str = "fast"              # fast: infer on rest_fast's lane, the rest on aiohttp; aiohttp: all
    grpc_frontend: str = LANE                # fast: grpc_fast's HTTP/2 lane serves the gRPC port; grpcio: grpc.aio
    # the decision loop's resource and flow signals (resource_signals.py)
    cache_config: list | None = None         # Triton's --cache-config items (response_cache.py)
    numa_node: str = "auto"                  # auto | a node id | off
    engine_state: str | None = None          # the engine state page's path
    flow_ring: str | None = None             # a flow ring file: per-flow tokens/s and KV-cache hit rate


GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE),
    ("grpc.max_send_message_length", GRPC_MAX_MESSAGE),
    EXCLUSIVE_PORT,                # SO_REUSEPORT only with --workers (grpc_options)
]


def grpc_options(workers: int) -> list[tuple]:
    """With --workers N > 1 every worker binds the same ports with SO_REUSEPORT and the kernel
    spreads connections over them; with one, a port in use is an error, as before."""
    return [(k, 1 if k == EXCLUSIVE_PORT[0] and workers > 1 else v) for k, v in GRPC_OPTIONS]


def load_policy_file(path: str, labels: dict | None = None) -> BatcherSettings:
    """The L7SchedulingPolicy in `path` whose selector matches this workload.
    Raises ConfigError naming file:line and field."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    resources = [r for r in parse_documents(text, file=path) if r.kind == KIND]
    if not resources:
        raise ConfigError([Diagnostic(f"no {KIND} in this file", file=path)])
    check(MeshConfig(resources))
    # A replica started without --label takes the file's policies as its own.
    chosen = [r for r in resources if selector_matches(r.spec, labels)] if labels else resources
    if not chosen:
        raise ConfigError([resources[0].diagnostic("spec.selector", "no policy in this file selects this workload")])
    res = chosen[0]
    settings = settings_from_spec(res.spec)
    return replace(settings, name=f"{res.name}({settings.name})")


class Server:
    def __init__(self, opts: ServeOptions):
        self.opts = opts
        self.telemetry = Telemetry.get(opts.trace_file)
        key = None
        if opts.session_key_file:
            try:
                with open(opts.session_key_file, "rb") as fh:
                    key = fh.read().strip()
            except OSError as e:
                raise ValueError(f"--session-key-file {opts.session_key_file}: {e.strerror or e}") from None
            if len(key) < MIN_KEY_BYTES:
                raise ValueError(f"--session-key-file {opts.session_key_file}: the key has {len(key)} bytes; "
                                 f"at least {MIN_KEY_BYTES} are needed")
        self.models = ModelServer(self.telemetry, session_key=key, session_max_age=opts.session_max_age)
        self.models.model_control_mode = opts.model_control_mode
        self.settings = self._initial_settings()
        self._runner: web.AppRunner | None = None
        self._admin_runner: web.AppRunner | None = None
        self._fast: FastLane | None = None
        self._grpc: grpc.aio.Server | None = None
        self._priority: PriorityWorker | None = None
        self._workers: list[PriorityWorker] = []     # the first worker's handles on the others
        self._watch_task: asyncio.Task | None = None
        self._stop = asyncio.Event()
        self.exit_status = 0
        self.only_class = QosClass.parse(opts.serve_class) if opts.serve_class else None
        self._next_poll = 0.0

    def _initial_settings(self) -> BatcherSettings:
        o = self.opts
        if o.policy_file:
            base = load_policy_file(o.policy_file, o.labels)
        else:
            base = preset(o.qos_policy)
        return base.with_overrides(o.max_batch, o.max_queue_delay_us)

    async def start(self) -> None:
        """Listen first (live, not ready: health checks see the model loading), then
        load and warm the model, then report ready. Port 0: any free port, reported
        in the ready event."""
        o = self.opts
        # before any thread of ours or ONNX Runtime's starts: they inherit the node's CPUs
        self.numa = resource_signals.pin_to_numa_node(o.numa_node, o.device)
        if o.engine_state:              # before the models: each one added publishes after its batches
            self.engine_state = resource_signals.EngineStatePublisher(o.engine_state, self.models)
            self.models.after_batch = self.engine_state.publish
        if o.flow_ring:
            self.models.flow_publisher = resource_signals.FlowPublisher(o.flow_ring)
        cache_config = parse_cache_config(o.cache_config or [])
        if cache_config is not None:    # before the models: each one added takes it (a repository's: if enabled)
            self.models.response_cache = ResponseCache(cache_config)
            register_response_cache_metrics(self.models.response_cache, prometheus_client.REGISTRY)
        if o.priority_argv:
            # First, while this process has no gRPC threads to fork around, and before it
            # lowers its own priority (the worker must not inherit nice 19).
            self._priority = PriorityWorker(o.priority_argv)
            await self._priority.start()
            log.info("priority worker started; this process's %d threads now run at nice %d",
                     lower_own_priority(), PARENT_NICE)
        core = InferCore(self.models, o.max_body_bytes, self.only_class)
        app = build_app(self.models, o.max_body_bytes, self.only_class, core)
        openai_api.register(app, self.models, o.openai_models, self.only_class)   # /v1/...: the OpenAI API, /v1/load
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        # With workers, a lane we accept on ourselves shares one socket among them and
        # balances connections exactly (connection_balance.py); the others use SO_REUSEPORT.
        counts = None
        if o.workers > 1 and o.connection_balance == "exact":
            counts = connection_balance.SharedCounts(o.workers, (o.inherited or {}).get("counts", [None])[0])
        shared = {"counts": [counts.fd]} if counts else {}    # the descriptors the other workers inherit
        balance_rest = counts is not None and o.rest_frontend == "fast"
        balance_grpc = counts is not None and o.grpc_frontend == LANE
        listen = dict(backlog=1024, reuse_address=True, reuse_port=o.workers > 1 or None)

        if o.rest_frontend == "fast":   # infer on the fast lane; any other request's connection goes to aiohttp
            conns = connection_balance.CountedSet(counts.lane("http", o.worker_index)) if balance_rest else None
            self._fast = FastLane(core, self._runner, conns)
            if balance_rest:
                http_port = self._balanced(self._fast, "http", o.http_port, "REST port", shared)
            else:
                http_port = await self._fast.start(o.host, o.http_port, **listen)
        else:
            await web.TCPSite(self._runner, o.host, o.http_port, **listen).start()
            http_port = self._runner.addresses[0][1]
        if o.grpc_frontend == LANE:   # the same servicers on grpc_fast's lane
            conns = connection_balance.CountedSet(counts.lane("grpc", o.worker_index)) if balance_grpc else None
            self._grpc = GrpcLane(GRPC_MAX_MESSAGE, GRPC_MAX_MESSAGE, connections=conns)
        else:
            self._grpc = grpc.aio.server(options=grpc_options(o.workers))
        add_to_server(self.models, self._grpc, self.only_class)
        triton_rpcs.add_to_server(self.models, self._grpc)     # ModelConfig, ModelStatistics, repository
        # grpc.health.v1 for Envoy's gRPC health checks (NOT_SERVING until the model is warm),
        # reflection for grpcurl.
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._grpc)
        await _set_health(self._health, "", health_pb2.HealthCheckResponse.NOT_SERVING)
        # the asyncio servicer on either server (enable_server_reflection picks grpcio's
        # thread-pool one for anything not a grpc.aio.Server)
        reflection_pb2_grpc.add_ServerReflectionServicer_to_server(reflection.aio.ReflectionServicer(
            (pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name, reflection.SERVICE_NAME),
            pool=pb.DESCRIPTOR.pool), self._grpc)   # the protocol's messages live in a private pool
        if balance_grpc:
            grpc_port = self._balanced(self._grpc, "grpc", o.grpc_port, "gRPC port", shared,
                                       self._grpc.new_connection)
        else:
            grpc_port = await start_server(self._grpc, o.host, o.grpc_port, "gRPC port", **listen)
        if o.worker_argv and o.workers > 1:
            # The others serve the ports this one got (port 0 resolved): the sockets themselves
            # where balanced, else their own bound with SO_REUSEPORT. Each loads the model
            # beside this one and has its own GIL, event loop, batcher and ONNX session.
            fds = [fd for v in shared.values() for fd in v]
            extra = ["--inherit-listeners", json.dumps(shared)] if shared else []
            for i in range(1, o.workers):
                w = PriorityWorker([*o.worker_argv, "--http-port", str(http_port), "--grpc-port", str(grpc_port),
                                    "--admin-port", "0", "--workers", str(o.workers), "--worker-index", str(i),
                                    *extra],
                                   label=f"worker {i}", preexec=False, pass_fds=tuple(fds))   # gRPC's threads run here now
                self._workers.append(w)
                await w.start()
        t0 = time.perf_counter()
        if o.model_repository:
            served = await asyncio.to_thread(self._load_repository)
            path = o.model_repository
        else:
            # A built-in is generated on first use (the worker may do so at the same time:
            # builtin_path writes then renames).
            name, path = await asyncio.to_thread(resolve_model, o.model)
            self._model_path = path
            self._model_mtime = os.stat(path).st_mtime
            served = await asyncio.to_thread(self.models.add, o.name or name, path, self.settings, o.device,
                                             o.intra_op_threads, int(o.kv_cache_mb * (1 << 20)),
                                             profile=o.enable_profiler, kv_idle_s=o.kv_idle_seconds,
                                             fast_path=o.fast_path, instances=o.instances,
                                             split_under_load=o.split_under_load, partition=o.partition)
        self._policy_mtime = os.stat(o.policy_file).st_mtime if o.policy_file else None
        if o.default_model and o.default_model not in self.models.models:
            raise ValueError(f"--default-model {o.default_model!r}: not served here; this server serves "
                             f"{', '.join(repr(n) for n in sorted(self.models.models)) or 'none'}")
        # POST /infer: the named model, else the one served (several, from a repository: none)
        self.models.default_model = o.default_model or (served.name if served is not None else None)
        if served is not None:
            if o.workers > 1 and served.decoder:
                # a sequence's KV cache lives in one process; its next step may land on another
                raise ValueError("--workers > 1 cannot serve a decoder model (its sequences' KV caches are per process)")
            if o.instances > 1 and served.decoder:
                # its KV cache is advanced by one run at a time (decoder.py)
                raise ValueError("--instances > 1 cannot serve a decoder model (its KV cache takes one run at a time)")
            if o.split_under_load and not served.split_width:
                log.warning("--split-under-load: off for model %s: %s", served.name, split_off_reason(served.model))
            m = served.model
            log.info("serving %s (%s) on %s, provider %s; load %.3fs + warm-up %.3fs (total %.3fs); batching %s",
                     served.name, path, m.device, m.provider, m.load_seconds, m.warmup_seconds,
                     time.perf_counter() - t0, json.dumps(self.settings.describe()))
        if o.enable_profiler and served is not None and getattr(served, "profiler", None) is not None:
            prof = served.profiler
            log.info("profiler on: 17 metrics per batch (statistics extension `profiler`, /metrics mcp_profiler_*); "
                     "counters %s; unavailable: %s", ", ".join(prof.events) or "none",
                     "; ".join(f"{k}: {v}" for k, v in prof.unavailable.items()) or "none")
        admin_port = None
        # The first of several workers always listens (loopback, any port): the others read
        # its statistics there.
        if o.admin_port is not None or self._workers:
            admin = self._admin_app()
            self._admin_runner = web.AppRunner(admin, access_log=None, handle_signals=False)
            await self._admin_runner.setup()
            # loopback only, whatever --host is: reload and policy calls are not for the network
            await web.TCPSite(self._admin_runner, "127.0.0.1", o.admin_port or 0, reuse_address=True).start()
            admin_port = self._admin_runner.addresses[0][1]
        # Loaded, warm, listening: out of the cyclic collector's sight before traffic (gc_pauses).
        # Before the joins: its one full collection overlaps the other workers' start-up.
        frozen = gc_pauses.freeze_startup_heap()
        worker = await self._priority.wait_ready() if self._priority else {}
        if self._workers:
            await self._join_workers(admin_port)
        if not o.worker_index:      # the other workers: once the first has joined them (/admin/workers)
            await self._serving()
        self._watch_task = asyncio.create_task(self._watch())
        log.info("ready: http %s:%d grpc %s:%d%s%s%s; %d startup objects frozen", o.host, http_port, o.host, grpc_port,
                 f" admin 127.0.0.1:{admin_port}" if admin_port else "",
                 f" priority worker pid {self._priority.proc.pid}: grpc {worker.get('grpc_port')} "
                 f"http {worker.get('http_port')}" if worker else "",
                 f" (serving only {o.serve_class})" if o.serve_class else "", frozen)
        m = served.model if served is not None else None
        emit_event({"event": "ready", "model": served.name if served is not None else None,
                          "models": sorted(self.models.models), "http_port": http_port, "grpc_port": grpc_port,
                          "admin_port": admin_port, "serve_class": o.serve_class,
                          "priority_worker": {"pid": self._priority.proc.pid, "http_port": worker["http_port"],
                                              "grpc_port": worker["grpc_port"]} if worker else None,
                          "workers": [os.getpid(), *(w.proc.pid for w in self._workers)] if self._workers else None,
                          "provider": m and m.provider, "load_seconds": m and round(m.load_seconds, 4),
                          "warmup_seconds": m and round(m.warmup_seconds, 4)})

    async def _serving(self) -> None:
        """Ready, on REST and gRPC health. The workers of --workers share the ports, and a probe
        reaches any of them: none says ready before the first has joined them all."""
        self.models.ready = True
        await _set_health(self._health, "", health_pb2.HealthCheckResponse.SERVING)
        await _set_health(self._health, "inference.GRPCInferenceService", health_pb2.HealthCheckResponse.SERVING)

    def _balanced(self, lane, name: str, port: int, what: str, shared: dict, factory=None) -> int:
        """Serve `lane` on the shared sockets (bound here and listed in `shared` for the other
        workers, or inherited by one of them), accepting while this worker has no more
        connections than the least loaded other; the port."""
        inherited = (self.opts.inherited or {}).get(name)
        if inherited:
            socks = [socket.socket(fileno=fd) for fd in inherited]
        else:
            socks = connection_balance.bind(self.opts.host, port, what)
            shared[name] = [s.fileno() for s in socks]
        lane.server = connection_balance.BalancedListener(socks, factory or lane, lane.connections)
        lane.server.start()
        return lane.server.port

    async def _join_workers(self, admin_port: int) -> None:
        """Wait for every other worker, then tell each the admin ports of all the others
        (statistics are summed over them, triton_rpcs.all_stats_docs)."""
        ready = await asyncio.gather(*(w.wait_ready() for w in self._workers))
        ports = [admin_port, *(r["admin_port"] for r in ready)]
        self.models.peer_admin_ports = ports[1:]
        for i, w in enumerate(self._workers, start=1):
            status, out = await w.forward("/admin/workers", {"peer_admin_ports": ports[:i] + ports[i + 1:]})
            if status != 200:
                raise OSError(f"worker {i} refused its peers: {out}")
        log.info("%d workers serve the ports (pids %s)", len(ports),
                 ", ".join(str(p) for p in [os.getpid(), *(w.proc.pid for w in self._workers)]))

    def _load_repository(self):
        """--model-repository: every model (explicit mode: those of --load-model), ensembles
        after their steps; the first served model (for the ready line)."""
        o = self.opts
        repo = Repository(o.model_repository, o.device, self.settings, o.intra_op_threads, o.fast_path,
                          o.enable_profiler)
        self.models.repository = repo
        if o.model_control_mode == "explicit":
            loaded = repo.load_all(self.models, o.load_models) if o.load_models else []
        else:
            loaded = repo.load_all(self.models)
        for served in loaded:
            log.info("repository %s: model %s v%s on %s", repo.root, served.name, served.model.version,
                     json.dumps(served.model.where()))
        return loaded[0] if loaded else None

    # -- hot reconfiguration -------------------------------------------------------------
    def served(self):
        """The model a reload without a name means: the one of --model (a repository's first plain model)."""
        return next((m for m in self.models.models.values() if hasattr(m, "reload")), None)

    async def reload_model(self, path: str | None = None, version: str | None = None, name: str | None = None) -> dict:
        served = self.models.models.get(name) if name else self.served()
        if served is None or not hasattr(served, "reload"):
            raise InvalidArgument(f"unknown model {name!r}" if served is None else
                                  f"model {name!r} is an ensemble: reload its step models")
        path = path or getattr(self, "_model_path", None) or served.model.path
        if path.startswith("builtin:"):
            path = resolve_model(path)[1]
        if not os.path.isfile(path):
            raise InvalidArgument(f"no model file {path!r}")
        rec = await asyncio.to_thread(served.reload, path, version)
        self.models.record(rec)
        return {"kind": rec.kind, "seconds": round(rec.seconds, 4), "detail": rec.detail, "version": served.model.version}

    def apply_settings(self, settings: BatcherSettings) -> dict:
        settings = settings.with_overrides(self.opts.max_batch, self.opts.max_queue_delay_us)
        out = []
        for served in self.models.models.values():
            if served.entry is not None:     # a repository model keeps its config.pbtxt's batching
                continue
            out.append(self.models.record(served.reconfigure(settings)))
        if not out:
            raise InvalidArgument("every model is from a repository and keeps its config.pbtxt's batching")
        self.settings = settings
        # the generation per model: /admin/status `policy_changes` says when its first batch formed
        return {"kind": "policy", "seconds": round(max(r.seconds for r in out), 6), "policy": settings.describe(),
                "generation": {name: m.batcher.policy_generation for name, m in self.models.models.items()}}

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            if self._priority and self._priority.returncode is not None:
                log.error("priority worker exited with status %s; stopping (the two serve as one replica)",
                          self._priority.returncode)
                self.exit_status = 1
                self._stop.set()
                return
            dead = [w for w in self._workers if w.returncode is not None]
            if dead:
                log.error("%s exited with status %s; stopping (the workers serve as one server)",
                          dead[0].label, dead[0].returncode)
                self.exit_status = 1
                self._stop.set()
                return
            try:
                if self.opts.policy_file:
                    mtime = os.stat(self.opts.policy_file).st_mtime
                    if mtime != self._policy_mtime:
                        self._policy_mtime = mtime
                        t0 = time.perf_counter()
                        try:
                            settings = load_policy_file(self.opts.policy_file, self.opts.labels)
                        except (ConfigError, ValueError, OSError) as e:
                            log.error("policy file not applied (the previous policy stays):\n%s", e)
                            continue
                        rec = self.apply_settings(settings)
                        log.info("policy file %s applied in %.4fs (read + validate + swap)",
                                 self.opts.policy_file, time.perf_counter() - t0)
                        del rec
                if self.opts.model_control_mode == "poll" and self.models.repository is not None and \
                        time.monotonic() >= self._next_poll:
                    self._next_poll = time.monotonic() + REPOSITORY_POLL_S
                    for line in await asyncio.to_thread(self.models.repository.poll, self.models):
                        log.info("repository poll: %s", line)
                if self.opts.watch_model:
                    mtime = os.stat(self._model_path).st_mtime
                    if mtime != self._model_mtime:
                        self._model_mtime = mtime
                        try:
                            await self.reload_model(self._model_path)
                        except Exception as e:  # a bad file leaves the old version serving
                            log.error("model file %s not reloaded (the previous version stays): %s",
                                      self._model_path, e)
            except FileNotFoundError:
                continue
            except Exception:
                log.exception("watcher")

    def _admin_app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 20)
        routes = web.RouteTableDef()

        async def body(request) -> dict:
            try:
                doc = parse_json_body(await request.read()) if request.can_read_body else {}
            except ValueError as e:
                raise InvalidArgument(str(e)) from None
            if not isinstance(doc, dict):
                raise InvalidArgument("body must be a JSON object")
            return doc

        @routes.post("/admin/reload")
        async def reload(request):
            try:
                doc = await body(request)
                out = await self.reload_model(doc.get("path"), doc.get("version"), doc.get("model"))
            except InferenceError as e:
                return web.json_response({"error": e.message}, status=e.http_status)
            except Exception as e:
                return web.json_response({"error": f"reload failed, previous version still serving: {e}"}, status=400)
            return await self._forward("/admin/reload", doc, out)

        @routes.post("/admin/policy")
        async def policy(request):
            try:
                doc = await body(request)
                settings = settings_from_spec(doc.get("spec", doc))
                out = self.apply_settings(settings)
            except InferenceError as e:       # (every model from a repository: apply_settings)
                return web.json_response({"error": e.message}, status=e.http_status)
            except ValueError as e:
                return web.json_response({"error": str(e)}, status=400)
            return await self._forward("/admin/policy", doc, out)

        @routes.post("/admin/class-weight")
        async def class_weight(request):
            """{"class", "weight"}: one class's batch-slot weight (the decision loop's class-weight)."""
            try:
                doc = await body(request)
                weight = doc.get("weight")
                if isinstance(weight, float) and weight.is_integer():
                    weight = int(weight)
                out = self.apply_settings(with_class_weight(self.settings, doc.get("class"), weight))
            except InferenceError as e:
                return web.json_response({"error": e.message}, status=e.http_status)
            except ValueError as e:
                return web.json_response({"error": str(e)}, status=400)
            return await self._forward("/admin/class-weight", doc, out)

        @routes.get("/admin/status")
        async def status(_):
            return web.json_response({"models": [m.status() for m in self.models.models.values()],
                                      "numa": getattr(self, "numa", None),
                                      "response_cache": (self.models.response_cache.describe()
                                                         if self.models.response_cache else None),
                                      "reloads": [vars(r) for r in self.models.reloads],
                                      # per model: each policy change, when applied and when its first batch formed
                                      "policy_changes": {name: list(m.batcher.policy_changes)
                                                         for name, m in self.models.models.items()}})

        @routes.get("/metrics")
        async def metrics(_):
            text = self.telemetry.prometheus_text()
            if self._workers:           # every worker's series, told apart by a worker label
                texts = [text]
                for w in self._workers:
                    status, body = await w.get("/metrics")
                    if status != 200:
                        return web.json_response({"error": body}, status=502)
                    texts.append(body.encode())
                text = merge_prometheus_texts(texts)
            return web.Response(body=text, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

        @routes.get("/admin/statistics")
        async def statistics(request):
            """This process's own statistics (the peers of --workers sum them)."""
            try:
                docs = triton_rpcs.stats_docs(self.models, request.query.get("name", ""),
                                              request.query.get("version", ""))
            except InferenceError as e:
                return web.json_response({"error": e.message}, status=e.http_status)
            return web.json_response({"model_stats": docs})

        @routes.post("/admin/workers")
        async def workers(request):
            try:
                doc = parse_json_body(await request.read())
            except ValueError as e:
                return web.json_response({"error": str(e)}, status=400)
            ports = doc.get("peer_admin_ports") if isinstance(doc, dict) else None
            if not isinstance(ports, list) or not all(isinstance(p, int) and 0 < p < 65536 for p in ports):
                return web.json_response({"error": "peer_admin_ports: a list of ports"}, status=400)
            self.models.peer_admin_ports = ports
            if not self.models.ready and not self._stop.is_set():
                await self._serving()
            return web.json_response({"peer_admin_ports": ports})

        app.add_routes(routes)
        return app

    async def _forward(self, path: str, doc: dict, out: dict) -> web.Response:
        """Apply an admin call the parent has applied to the priority worker and the other
        workers too: the answer carries each; a worker's failure is the answer's status."""
        status = 200
        if self._priority:
            status, out["priority_worker"] = await self._priority.forward(path, doc)
            if status != 200:
                log.error("priority worker refused %s (status %d): %s", path, status, out["priority_worker"])
        if self._workers:
            answers = await asyncio.gather(*(w.forward(path, doc) for w in self._workers))
            out["workers"] = [body for _, body in answers]
            for w, (st, body) in zip(self._workers, answers):
                if st != 200:
                    log.error("%s refused %s (status %d): %s", w.label, path, st, body)
                    status = st if status == 200 else status
        return web.json_response(out, status=status)

    async def stop(self) -> None:
        """Drain: report not ready (health, /v2/health/ready, ServerReady) but keep
        serving for --drain-seconds, so balancers move away and requests already on
        the wire are taken; then stop the listeners, answer what is queued, close."""
        self.models.draining = True
        if self._priority:
            self._priority.terminate()        # it drains beside this process
        for w in self._workers:
            w.terminate()                     # so do the other workers
        if getattr(self, "_health", None):
            await _set_health(self._health, "", health_pb2.HealthCheckResponse.NOT_SERVING)
            await _set_health(self._health, "inference.GRPCInferenceService", health_pb2.HealthCheckResponse.NOT_SERVING)
        if self._watch_task:
            self._watch_task.cancel()
        if self.opts.drain_seconds > 0 and self.models.ready:
            log.info("draining for %.1fs", self.opts.drain_seconds)
            await asyncio.sleep(self.opts.drain_seconds)
        # Both front ends stop taking requests at once and let in-flight ones finish
        # (the batcher still runs), then the queues are drained and closed.
        await asyncio.gather(*([self._grpc.stop(grace=5)] if self._grpc else []),
                             *([self._stop_rest()] if self._runner else []))
        if self._admin_runner:
            await self._admin_runner.cleanup()
        await asyncio.to_thread(self.models.stop)
        if self.models.response_cache is not None:
            self.models.response_cache.close()
        if self._priority:
            await self._priority.stop()
        await asyncio.gather(*(w.stop() for w in self._workers))
        self.telemetry.shutdown()

    async def _stop_rest(self) -> None:
        if self._fast:                  # first: its answers still need the body parser and the batcher
            await self._fast.close(grace=5)
        await self._runner.cleanup()

    async def run_forever(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        try:
            await self.start()
        except BaseException:
            # Nothing half-started stays behind: the worker, the listeners.
            if self._priority:
                await self._priority.stop()
            await asyncio.gather(*(w.stop() for w in self._workers))
            if self._grpc:
                await self._grpc.stop(0)
            if self._fast:
                await self._fast.close(grace=0)
            for runner in (self._runner, self._admin_runner):
                if runner:
                    await runner.cleanup()
            raise
        await self._stop.wait()
        log.info("shutting down")
        await self.stop()
        return self.exit_status


def merge_prometheus_texts(texts: list[bytes]) -> bytes:
    """Several workers' exposition texts as one: each sample gains worker="i" (i: the
    worker's index), and each family's samples stay together under one HELP/TYPE, as the
    text format requires."""
    families: dict[str, tuple[list[str], list[str]]] = {}
    for i, text in enumerate(texts):
        family = None
        for line in text.decode().splitlines():
            if not line:
                continue
            if line.startswith("#"):
                parts = line.split(None, 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    family = parts[2]
                    head, _ = families.setdefault(family, ([], []))
                    if i == 0 or not any(h.split(None, 2)[1] == parts[1] for h in head):
                        head.append(line) if len(head) < 2 else None
                continue
            name, brace, rest = line.partition("{")
            label = f'worker="{i}"'
            sample = (f"{name}{{{label},{rest}" if rest and not rest.startswith("}") else
                      f"{name}{{{label}{rest}") if brace else \
                f"{line.split(None, 1)[0]}{{{label}}} {line.split(None, 1)[1]}"
            families.setdefault(family or name, ([], []))[1].append(sample)
    return ("\n".join(line for head, samples in families.values() for line in [*head, *samples]) + "\n").encode()


async def _set_health(servicer, service: str, status) -> None:
    result = servicer.set(service, status)
    if asyncio.iscoroutine(result):
        await result


def _runner():
    """uvloop where installed (a project dependency): its transports and event loop in C
    cut the per-request cost of the loop that parses, enqueues and answers every request."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


def serve(opts: ServeOptions) -> int:
    try:
        return _runner()(Server(opts).run_forever())
    except ConfigError as e:
        print(f"mcpctl serve: {e}", flush=True)
        return 2
