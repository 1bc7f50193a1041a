"""The control plane process: config source -> translation -> ADS, plus admin HTTP.

Everything runs on one asyncio loop (see ads.py for why grpc.aio). Loading
and translating a change set run in a worker thread, so streams keep
answering ACKs meanwhile; the new snapshots are installed on the loop in one
step, then every stream is woken to push what changed for it.

The server owns everything translation is given besides the config: its
Translator (with the TranslateOptions the CLI built), and the Overlay -- the
decision loop's remaps and endpoint weights in force and the config's Wasm
modules, read when the config is loaded. The Overlay is immutable: a change
(a new config, a remap or weight from scheduler_actions.py) makes a new one,
translated and installed with the config under the apply lock. Two servers
in one process share nothing.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import gc
import itertools
import logging
import time

import grpc

from mcp26.mesh.diagnostics import ConfigError, Diagnostic
from mcp26.serving.grpc.frontends import GRPC_FRONTENDS, LANE
from mcp26.serving.grpc.server import EXCLUSIVE_PORT, GrpcLane, start_server
from mcp26.xds.admin import start_admin
from mcp26.xds.ads import AdsHub, add_to_server
from mcp26.xds.cache import SnapshotCache
from mcp26.xds.class_remaps import ClassRemaps
from mcp26.xds.endpoint_weights import EndpointWeights
from mcp26.xds.incremental_load import IncrementalLoader
from mcp26.xds.sds import IdentityService, rotation_loop, rotation_period
from mcp26.xds.settle import DEFAULT_SETTLE, weakenings
from mcp26.xds.telemetry import Telemetry, default as default_telemetry
from mcp26.xds.translate import NO_OVERLAY, Overlay, TranslateOptions, Translator
from mcp26.xds.wasm_modules import WasmModuleStore
from mcp26.xds.watch import DirectorySource

log = logging.getLogger("mcp26.xds")

UNREQUESTED_STREAM_HOLD_S = 600     # gRPC core's default: 30 s
MAX_HELD_STREAMS = 20_000           # gRPC core's default: 1,000 (past it, some refused), 3,000 (all)
MAX_MESSAGE = 64 << 20              # a whole RDS or EDS of a large mesh, either way
MIN_PING_INTERVAL_S = 5.0           # a proxy may ping this often with nothing sent to it


def default_load():
    """mcp26.mesh.change_set.load_config, re-parsing only changed files (see incremental_load.py)."""
    return IncrementalLoader()


def diagnostic_dict(d: Diagnostic) -> dict:
    return {"message": d.message, "file": d.file, "line": d.line, "resource": d.resource,
            "field": d.field, "code": d.code, "severity": d.severity, "text": str(d)}


class XdsServer:
    def __init__(self, config_dir: str, port: int = 18000, admin_port: int = 18001,
                 address: str = "127.0.0.1", load=None, translate=None,
                 debounce: float = 0.1, poll: float = 0.05, test_hooks: bool = False,
                 telemetry: Telemetry | None = None,
                 settle: float = DEFAULT_SETTLE, identity=None, grpc_frontend: str = LANE,
                 options: TranslateOptions | None = None, source=None):
        if grpc_frontend not in GRPC_FRONTENDS:
            raise ValueError(f"grpc_frontend must be one of {', '.join(GRPC_FRONTENDS)}, not {grpc_frontend!r}")
        self.grpc_frontend = grpc_frontend
        # The config source: the watched directory (the default), or `source`, e.g. a
        # kube_source.KubeSource, which brings its own loader and is described in its place.
        self.config_dir = config_dir if source is None else source.describe()
        self.settle = settle            # settle.py: how long a security weakening waits for its file
        self._recheck: asyncio.TimerHandle | None = None
        self.port, self.admin_port, self.address = port, admin_port, address
        self.load = load or (source.loader if source is not None else default_load())
        # The process default unless given one: the translator and cache report there.
        self.telemetry = telemetry or default_telemetry()
        # The server owns its Translator (and so its translation cache); a
        # caller may pass any (config, node) -> Snapshot function instead.
        self.translator = Translator(options, tracer=self.telemetry.tracer)
        self._custom_translate = translate
        self.wasm_modules = WasmModuleStore()      # bounded, by content hash (wasm_modules.py)
        # The decision loop's tables (scheduler_actions.py writes them), and the Overlay
        # translation is given: replaced whole, by apply() and republish_overlay() only.
        self.class_remaps = ClassRemaps()
        self.endpoint_weights = EndpointWeights()
        self.overlay: Overlay = NO_OVERLAY
        self._republished = itertools.count(1)
        self.cache = SnapshotCache(self._translating(self.overlay))
        self.hub = AdsHub(self.cache, self.telemetry)
        # SDS (sds.py): the mesh CA's certificates and credentialName secrets, per node.
        self.identity = self.hub.identity = identity or IdentityService(None)   # no CA: issues nothing
        self._rotation: asyncio.Task | None = None
        self.test_hooks = test_hooks
        if source is None:
            source = DirectorySource(config_dir, self.apply, poll=poll, debounce=debounce)
        else:
            source.on_change = self.apply
        self.source = source
        self._generations = itertools.count(1)
        self._apply_lock: asyncio.Lock | None = None
        self.status: dict = {"config_dir": config_dir, "generation": "", "applied_at": 0.0,
                             "resources": 0, "warnings": [], "rejected": None, "held": None}
        self.changed: asyncio.Event = asyncio.Event()   # set after each change set taken or rejected
        self._grpc: grpc.aio.Server | GrpcLane | None = None
        self._grpc_secure: grpc.aio.Server | None = None
        self.secure_port = 0
        self._admin = None

    async def start(self) -> None:
        self._apply_lock = asyncio.Lock()
        if getattr(self.source, "needs_sync", False):   # the API server: every kind listed first
            self.source.start()
            await self.source.synced()
        await self.apply()          # a bad initial config: serve nothing until a good one lands
        self._grpc = self._grpc_server()
        add_to_server(self.hub, self._grpc)
        self.port = await start_server(self._grpc, self.address, self.port, "ADS on")
        await self._admin_and_watch()

    def _grpc_server(self):
        """The ADS server: the project's HTTP/2 lane (serving.grpc.server; the same servicer at two
        thirds of grpc.aio's CPU per proxy, README "Scale"), or grpc.aio."""
        if self.grpc_frontend == LANE:
            # Envoy's bootstrap pings the control plane every 10 s (bootstrap.py); allowed as grpcio's
            # option below allows it.
            return GrpcLane(MAX_MESSAGE, MAX_MESSAGE, min_ping_interval_s=MIN_PING_INTERVAL_S)
        return grpc.aio.server(options=[
            ("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.http2.min_ping_interval_without_data_ms", int(MIN_PING_INTERVAL_S * 1000)),
            # A stream waits in gRPC core until this loop asks for it. When a fleet connects at
            # once the loop is busy pushing to the streams before it, and core cancels a stream
            # it held 30 s (its default) with CANCELLED, or refuses new ones past 1,000 held:
            # the proxy then re-opens and is sent everything again. Envoy waits on a slow ADS
            # stream, so hold them (xds-server/README.md "Scale": 1,000 clients at once).
            ("grpc.server_max_unrequested_time_in_server", UNREQUESTED_STREAM_HOLD_S),
            ("grpc.server.max_pending_requests", MAX_HELD_STREAMS),
            ("grpc.server.max_pending_requests_hard_limit", MAX_HELD_STREAMS),
            EXCLUSIVE_PORT,         # a second control plane on this port is an error, not half the proxies
        ])

    async def start_secure(self, address: str, port: int, authenticate, cert_chain: bytes, key: bytes) -> int:
        """ADS over TLS beside the plaintext loopback port (istiod's 15012): the same hub, each
        stream checked by `authenticate` (kube_auth.StreamAuthenticator) before anything is sent."""
        server = self._grpc_secure = grpc.aio.server(options=[
            ("grpc.max_send_message_length", MAX_MESSAGE), ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.http2.min_ping_interval_without_data_ms", int(MIN_PING_INTERVAL_S * 1000)),
            ("grpc.server_max_unrequested_time_in_server", UNREQUESTED_STREAM_HOLD_S),
            EXCLUSIVE_PORT])
        add_to_server(self.hub, server, authenticate)
        creds = grpc.ssl_server_credentials([(key, cert_chain)])
        self.secure_port = server.add_secure_port(f"{address}:{port}", creds)
        await server.start()
        log.info("ADS over TLS (ServiceAccount tokens) on %s:%d", address, self.secure_port)
        return self.secure_port

    async def _admin_and_watch(self) -> None:
        self._admin = await start_admin(self, self.address, self.admin_port)
        if self._admin.addresses:                      # --admin-port 0: the port it got
            self.admin_port = self._admin.addresses[0][1]
        self.source.start()
        if self.identity.ca is not None:
            self._rotation = asyncio.get_running_loop().create_task(
                rotation_loop(self.identity, self.hub, rotation_period(self.identity.ttl)))
        log.info("ADS (%s) on %s:%d, admin on %s:%d, watching %s (%s)", self.grpc_frontend, self.address, self.port,
                 self.address, self.admin_port, self.config_dir,
                 "inotify" if self.source.inotify is not None else
                 "polling" if isinstance(self.source, DirectorySource) else "informers")

    async def stop(self, grace: float = 0.5) -> None:
        if self._rotation is not None:
            self._rotation.cancel()
        if self._recheck is not None:
            self._recheck.cancel()
        await self.source.stop()
        if self._admin is not None:
            await self._admin.cleanup()
        if self._grpc_secure is not None:
            await self._grpc_secure.stop(grace)
        if self._grpc is not None:
            await self._grpc.stop(grace)

    async def wait(self) -> None:
        await self._grpc.wait_for_termination()

    async def apply(self) -> bool:
        """Load, validate and translate the whole directory; install it only if all of it is good."""
        async with self._apply_lock:
            m = self.telemetry.metrics
            try:
                config, overlay = await asyncio.to_thread(self._load)
            except ConfigError as e:
                self._reject(e.diagnostics)
                return False
            if self._held(config):
                return False
            generation = f"g{next(self._generations)}"
            nodes = self.hub.nodes()
            started = time.perf_counter()
            with self.telemetry.tracer.start_as_current_span("xds.translate") as span:
                span.set_attribute("xds.generation", generation)
                span.set_attribute("xds.config_resources", len(config))
                try:
                    subscriptions = self.hub.subscriptions()
                    translate = self._translating(overlay)
                    snapshots = await asyncio.to_thread(self._build, config, generation, nodes, subscriptions,
                                                        translate)
                except ConfigError as e:
                    self._reject(e.diagnostics)
                    return False
                except Exception as e:  # a translator bug must not take the last good config down
                    log.exception("translation failed")
                    self._reject([Diagnostic(f"translation failed: {type(e).__name__}: {e}",
                                             file=self.config_dir)])
                    return False
                span.set_attribute("xds.node_shapes", len(snapshots))
            m.translate_seconds.record(time.perf_counter() - started)
            self.cache.install(config, generation, snapshots, translate)
            self.overlay = overlay
            self.identity.config = config          # credentialName secrets follow the config
            # The config and snapshots are a million long-lived objects: move them
            # out of the cyclic collector's sight, or every full collection (during
            # the next load, or mid-push) walks them all, for seconds on this box.
            # Applies leave no cyclic garbage (measured), so nothing frozen leaks.
            gc.freeze()
            m.config_applied.add(1)
            self.status.update(generation=generation, applied_at=time.time(), resources=len(config),
                               warnings=[diagnostic_dict(d) for d in getattr(config, "warnings", [])],
                               rejected=None, held=None)
            log.info("applied %s: %d resources, %d node shapes", generation, len(config), len(snapshots))
            self.hub.notify_all()
            self.changed.set()
            return True

    async def republish_overlay(self) -> str:
        """Lay the remaps and endpoint weights now in force (self.class_remaps,
        self.endpoint_weights) over the served config: a new Overlay, translated for every
        proxy, installed and pushed. Only what they touch differs: the header-contract
        ECDS resource, the weighted clusters' EDS assignments. Returns the new generation
        ("" before the first config, which will be translated with them)."""
        async with self._apply_lock:
            now = time.time()
            overlay = dataclasses.replace(self.overlay, class_remaps=self.class_remaps.active(now),
                                          endpoint_weights=self.endpoint_weights.by_cluster(now))
            config = self.cache.config
            if config is None:
                self.overlay = overlay
                return ""
            generation = f"{self.status['generation'] or 'g0'}.s{next(self._republished)}"
            translate = self._translating(overlay)
            snapshots = await asyncio.to_thread(self._build, config, generation, self.hub.nodes(),
                                                self.hub.subscriptions(), translate)
            self.cache.install(config, generation, snapshots, translate)
            self.overlay = overlay
            self.hub.notify_all()
            return generation

    def _load(self) -> tuple:
        """(config, overlay): the directory, then the Wasm modules its WasmPlugins name (off
        the loop; ConfigError for either rejects the change set whole). A caller's translate
        function is given no overlay, so its config's modules are not read."""
        config = self.load(self.config_dir)
        if self._custom_translate is not None:
            return config, self.overlay
        return config, dataclasses.replace(self.overlay, wasm_modules=self.wasm_modules.load(config))

    def _translating(self, overlay: Overlay):
        """The (config, node) -> Snapshot function of one generation: the Translator with `overlay`."""
        if self._custom_translate is not None:
            return self._custom_translate
        return functools.partial(self.translator.translate, overlay=overlay)

    def _build(self, config, generation: str, nodes, subscriptions, translate) -> dict:
        """Translate for every translation key, then the selections and Delta diffs the streams
        will ask for, so the push itself (on the loop) only looks them up."""
        return self.cache.build(config, generation, nodes, subscriptions, translate)

    def _held(self, config) -> bool:
        """The settle rule (settle.py): hold a change set that weakens a security resource
        of a file written moments ago, and look again once that file has been quiet."""
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None
        found = weakenings(self.cache.config, config, self.settle)
        if not found:
            return False
        wait = max(w.quiet_in for w in found)
        self.status["held"] = {"at": time.time(), "until": time.time() + wait,
                               "weakenings": [w.as_dict() for w in found]}
        log.warning("change set in %s held for %.1f s (the settle rule): %s", self.config_dir, wait,
                    "; ".join(f"{w.file}: {w.resource} {w.change}" for w in found))
        loop = asyncio.get_running_loop()
        self._recheck = loop.call_later(wait + 0.05, self._apply_later)
        return True

    def _apply_later(self) -> None:
        self._recheck = None
        self._rechecking = asyncio.get_running_loop().create_task(self.apply())   # kept: tasks are weakly held

    def _reject(self, diagnostics: list[Diagnostic]) -> None:
        self.telemetry.metrics.config_rejected.add(1)
        self.status["rejected"] = {"at": time.time(), "errors": [diagnostic_dict(d) for d in diagnostics]}
        self.changed.set()
        kept = self.status["generation"] or "nothing (no good config yet)"
        log.error("change set in %s rejected whole; still serving %s:\n%s", self.config_dir, kept,
                  "\n".join(f"  {d}" for d in diagnostics))

    # Test hook (only with test_hooks): lay raw Envoy resources over every snapshot.
    def inject(self, overrides: dict) -> None:
        self.cache.set_overrides(overrides, self.hub.nodes())
        self.hub.notify_all()

    def node_snapshot(self, node_id: str):
        for node in self.hub.nodes():
            if node.id == node_id:
                return node, self.cache.snapshot_for(node)
        return None, None


async def serve(server: XdsServer) -> None:
    await server.start()
    try:
        await server.wait()
    finally:
        await server.stop()
