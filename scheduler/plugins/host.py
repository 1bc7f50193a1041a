"""PolicyHost: what the decision loop (decide) and the Endpoint Picker (score) call.

    host = PolicyHost("policy.py")        # or a built .wasm; None: the built-in seed table
    host.load()                           # blocking: build (cached), compile (cached), instantiate
    host.start_watching()                 # hot swap when the file changes (a background thread)
    d = host.decide(signals)              # Decision: .actions (the previous ones when d.ok is False)
    s = host.score(request, endpoints)    # list[float], or None when the plugin failed
    host.stats()                          # counters: calls, failures by reason, cost p50/p99, swaps
    host.close()

A failed call never raises: a plugin that loops, traps, runs out of memory or answers nonsense
costs that one call, is logged with its reason and counted, and the previous decision stands.
A swap builds, compiles and instantiates the new plugin off the calling thread and replaces the
active one in one reference assignment: calls already running finish on the old one, calls after
it use the new one, none fails. A new plugin that fails to build or instantiate is not swapped in.
"""
from __future__ import annotations

import hashlib
import logging
import os
import pathlib
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Sequence

from mcp26.scheduler.decisions import Action, EndpointInfo, RequestInfo, Signals
from mcp26.scheduler.plugins import convert
from mcp26.scheduler.plugins.build import WIT_DIR, build
from mcp26.scheduler.plugins.compiled_cache import CompiledCache, default_dir
from mcp26.scheduler.plugins.sandbox import Limits, Plugin, PluginError, engine_for

log = logging.getLogger("mcp26.scheduler.plugins")

DEFAULT_POLICY = pathlib.Path(__file__).resolve().parent / "policies" / "seed_table.py"
COST_SAMPLES = 1024


@dataclass(frozen=True)
class Decision:
    actions: tuple[Action, ...]
    ok: bool                              # False: the plugin failed; actions are the previous decision
    error: str | None = None              # "reason: detail" when not ok
    elapsed_us: float = 0.0
    plugin: str = ""                      # sha256 of the component that answered (or failed)


@dataclass
class _Active:
    plugin: Plugin
    source: str
    info: dict
    lock: threading.Lock = field(default_factory=threading.Lock)


class PolicyHost:
    def __init__(self, source: str | os.PathLike | None = None, *, limits: Limits = Limits(),
                 cache_dir: str | os.PathLike | None = None):
        self.source = pathlib.Path(source).resolve() if source else DEFAULT_POLICY
        self.limits = limits
        self.cache_dir = pathlib.Path(cache_dir) if cache_dir else default_dir()
        self.compiled = CompiledCache(self.cache_dir / "compiled")
        self.engine = engine_for(limits)
        self._active: _Active | None = None
        self._last_actions: tuple[Action, ...] = ()
        self._stats_lock = threading.Lock()
        self._calls: Counter = Counter()
        self._failures: Counter = Counter()           # reason -> count
        self._cost_us: dict[str, deque] = {"decide": deque(maxlen=COST_SAMPLES), "score": deque(maxlen=COST_SAMPLES)}
        self._fuel: dict[str, int | None] = {"decide": None, "score": None}
        self.last_error: str | None = None
        self.swaps = 0
        self.swap_failures = 0
        self.last_swap_error: str | None = None
        self._swap_lock = threading.Lock()
        self._watch_stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._seen: tuple | None = None

    # -- loading -----------------------------------------------------------------------------------
    def _component_bytes(self, path: pathlib.Path) -> tuple[bytes, dict]:
        """A .wasm as it is; a .py built with componentize-py, cached by its source's hash."""
        if path.suffix == ".wasm":
            wasm = path.read_bytes()
            if not wasm.startswith(b"\0asm"):    # else wasmtime reads it as WAT text: "expected `(`"
                raise PluginError("instantiate", "not a Wasm binary (it does not begin with \\0asm); "
                                                 "`mcpctl policy build FILE.py` makes one")
            return wasm, {"built": False, "build_s": 0.0}
        text = path.read_bytes()
        key = hashlib.sha256(text + _toolchain_id()).hexdigest()[:32]
        out = self.cache_dir / "built" / f"{key}.wasm"          # content only: a renamed copy is the same plugin
        t0 = time.perf_counter()
        built = not out.exists()
        if built:
            build(path, out)
        return out.read_bytes(), {"built": built, "build_s": round(time.perf_counter() - t0, 3)}

    def _prepare(self, path: pathlib.Path) -> _Active:
        wasm, info = self._component_bytes(path)
        loaded = self.compiled.load(self.engine, wasm, self.limits.engine_key())
        plugin = Plugin(loaded.component, self.engine, self.limits, path.name, loaded.sha256)
        t0 = time.perf_counter()
        plugin.warm()
        info.update(sha256=loaded.sha256, compiled_from_cache=loaded.from_cache,
                    compile_s=round(loaded.seconds, 3), instantiate_s=round(time.perf_counter() - t0, 3),
                    loaded_at=time.time())
        return _Active(plugin, str(path), info)

    def load(self) -> dict:
        """Load (or reload) the source now, on this thread; raises BuildError/PluginError/OSError
        and keeps the active plugin when that fails. Returns what was loaded."""
        with self._swap_lock:
            seen = _fingerprint(self.source)
            active = self._prepare(self.source)
            swapped = self._active is not None
            self._active = active                         # the swap: one reference assignment
            self._seen = seen
            if swapped:
                self.swaps += 1
            log.info("policy %s loaded: %s", self.source, active.info)
            return dict(active.info)

    def reload(self) -> bool:
        """load() that logs and counts a failure instead of raising (the watcher's path)."""
        try:
            self.load()
            return True
        except Exception as e:  # noqa: BLE001 - whatever broke, the old plugin keeps serving
            self.swap_failures += 1
            self.last_swap_error = f"{type(e).__name__}: {e}"
            self._seen = _fingerprint(self.source)       # do not retry until the file changes again
            log.error("policy %s not swapped in, the previous one stays: %s", self.source, self.last_swap_error)
            return False

    def start_watching(self, interval_s: float = 0.5) -> None:
        """Poll the source's mtime/size/hash; on a change, reload on the watcher thread."""
        if self._watcher is not None:
            return
        self._watch_stop.clear()

        def watch():
            while not self._watch_stop.wait(interval_s):
                if _fingerprint(self.source) != self._seen:
                    self.reload()

        self._watcher = threading.Thread(target=watch, name="policy-watch", daemon=True)
        self._watcher.start()

    def close(self) -> None:
        self._watch_stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
            self._watcher = None

    # -- calls -------------------------------------------------------------------------------------
    def _call(self, export: str, convert_out, *args):
        active = self._active
        if active is None:
            raise PluginError("not-loaded", "no policy loaded")
        with active.lock:
            raw = active.plugin.call(export, *args)
            fuel = active.plugin.fuel_used()
        self._fuel[export] = fuel
        try:
            return convert_out(raw), active
        except convert.BadResult as e:
            raise PluginError("bad-result", str(e)) from None

    def _failed(self, export: str, e: PluginError) -> str:
        with self._stats_lock:
            self._failures[e.reason] += 1
        self.last_error = f"{export}: {e.reason}: {e.detail}"
        log.warning("policy %s %s failed (%s): %s", self.source.name, export, e.reason, e.detail)
        return f"{e.reason}: {e.detail}"

    def decide(self, signals: Signals) -> Decision:
        t0 = time.perf_counter()
        with self._stats_lock:
            self._calls["decide"] += 1
        active = self._active
        try:
            actions, active = self._call("decide", convert.actions_from_answer, convert.encode_signals(signals))
        except PluginError as e:
            error = self._failed("decide", e)
            return Decision(self._last_actions, False, error, _us(t0), active.info["sha256"] if active else "")
        self._last_actions = tuple(actions)
        elapsed = _us(t0)
        self._cost_us["decide"].append(elapsed)
        return Decision(self._last_actions, True, None, elapsed, active.info["sha256"])

    def score(self, request: RequestInfo, endpoints: Sequence[EndpointInfo]) -> list[float] | None:
        t0 = time.perf_counter()
        with self._stats_lock:
            self._calls["score"] += 1
        try:
            scores, _ = self._call("score", lambda raw: convert.scores_from_answer(raw, len(endpoints)),
                                   convert.encode_request(request), convert.encode_endpoints(endpoints))
        except PluginError as e:
            self._failed("score", e)
            return None
        self._cost_us["score"].append(_us(t0))
        return scores

    @property
    def last_decision(self) -> tuple[Action, ...]:
        return self._last_actions

    def stats(self) -> dict:
        active = self._active
        with self._stats_lock:
            cost = {name: _percentiles(samples) | {"fuel_last": self._fuel[name]}
                    for name, samples in self._cost_us.items()}
            return {
                "source": str(self.source),
                "plugin": dict(active.info) if active else None,
                "calls": dict(self._calls),
                "failures": dict(self._failures),
                "last_error": self.last_error,
                "cost_us": cost,
                "instantiations": active.plugin.instantiations if active else 0,
                "plugin_log_lines": active.plugin.log_lines if active else 0,
                "swaps": self.swaps,
                "swap_failures": self.swap_failures,
                "last_swap_error": self.last_swap_error,
                "compiled_cache": {"hits": self.compiled.hits, "misses": self.compiled.misses},
                "limits": {"fuel": self.limits.fuel, "deadline_ms": self.limits.deadline_ms,
                           "memory_bytes": self.limits.memory_bytes},
            }


def _us(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e6


def _percentiles(samples) -> dict:
    if not samples:
        return {"n": 0, "p50": None, "p99": None}
    s = sorted(samples)
    return {"n": len(s), "p50": round(s[len(s) // 2], 1), "p99": round(s[min(len(s) - 1, int(len(s) * 0.99))], 1)}


def _fingerprint(path: pathlib.Path) -> tuple | None:
    try:
        st = path.stat()
        return (st.st_mtime_ns, st.st_size, hashlib.sha256(path.read_bytes()).hexdigest())
    except OSError:
        return None


_TOOLCHAIN: bytes | None = None


def _toolchain_id() -> bytes:
    """What else a build depends on: the WIT and componentize-py's version."""
    global _TOOLCHAIN
    if _TOOLCHAIN is None:
        import importlib.metadata
        try:
            version = importlib.metadata.version("componentize-py")
        except importlib.metadata.PackageNotFoundError:
            version = "?"
        wit = b"".join(p.read_bytes() for p in sorted(WIT_DIR.glob("*.wit")))
        _TOOLCHAIN = version.encode() + wit + (pathlib.Path(__file__).parent / "build.py").read_bytes()
    return _TOOLCHAIN
