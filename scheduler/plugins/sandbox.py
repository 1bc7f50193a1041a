"""One plugin component in a wasmtime sandbox: the engine, the limits, the host imports, calls.

The sandbox, per call: **fuel** (a deterministic instruction budget; a loop runs out of it), an
**epoch deadline** (wall clock, ticked by one thread per engine; it also bounds what fuel does not
count), and the store's **memory limit** (`memory.grow` fails past it, the guest's allocation
fails, the call traps). The component imports nothing but `mcp:scheduler/{inference,host}`:
plugins are built with componentize-py's `--stub-wasi`, so no WASI function (filesystem,
sockets, environment, stdio, clocks, random) exists in the guest at all; the clock is the
host's `now-ms`. A trap leaves a component instance unusable (wasmtime poisons it), so the next
call instantiates a fresh one (~30 ms): a plugin's module-level state does not survive a trap.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import ctypes

from wasmtime import Config, Engine, Store, Trap, TrapCode, WasmtimeError
from wasmtime.component import Component, Func, Linker, String

try:    # wasmtime-py internals the fast call needs (tested with 50.x); without them, the public call
    from wasmtime import _ffi as ffi
    from wasmtime.component._enter import enter_wasm
    _FAST = all(hasattr(ffi, n) for n in ("wasmtime_component_func_call", "wasmtime_component_val_t",
                                          "str_to_capi", "to_str", "wasmtime_component_val_delete"))
except ImportError:
    ffi = enter_wasm = None
    _FAST = False

from mcp26.scheduler.plugins.build import EXCEPTION_TAG
from mcp26.scheduler.plugins.convert import ENCODING
from mcp26.scheduler.plugins.inference import OnnxInference

log = logging.getLogger("mcp26.scheduler.plugins")

EPOCH_TICK_S = 0.005
LOG_LINES_PER_CALL = 20
LOG_LINE_CHARS = 2000
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}


@dataclass(frozen=True)
class Limits:
    """What one call may spend. None turns a limit off (the benchmark measures fuel on and off)."""
    fuel: int | None = 100_000_000                 # a seed-table decide burns ~0.2 M
    deadline_ms: float | None = 500.0              # wall clock: a backstop (CPU starvation counts)
    memory_bytes: int = 256 << 20                  # linear memory; the Python runtime needs ~40 MiB

    def engine_key(self) -> str:
        """What of the limits changes compiled code (a serialized component is only valid for it)."""
        return f"fuel={self.fuel is not None},epoch={self.deadline_ms is not None}"


class PluginError(Exception):
    """A call that did not produce a usable answer. reason: fuel | deadline | memory | exception
    (an uncaught Python exception) | trap (any other) | bad-result | instantiate."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


def engine_for(limits: Limits) -> Engine:
    """One engine per code-generation setting, shared by every plugin (and its swaps)."""
    key = limits.engine_key()
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            cfg = Config()
            cfg.consume_fuel = limits.fuel is not None
            cfg.epoch_interruption = limits.deadline_ms is not None
            engine = _engines[key] = Engine(cfg)
            if limits.deadline_ms is not None:
                threading.Thread(target=_tick, args=(engine,), name="wasm-epoch", daemon=True).start()
        return engine


def _tick(engine: Engine) -> None:
    while True:
        time.sleep(EPOCH_TICK_S)
        engine.increment_epoch()


def _classify(e: Exception, limits: Limits, exception: str | None) -> PluginError:
    """Why a call trapped. wasmtime-py raises component traps as WasmtimeError whose text ends
    with the trap's cause; the guest's own exception (reported by the build's wrapper) names a
    MemoryError when the memory limit was hit."""
    cause = _cause(e)
    if (isinstance(e, Trap) and e.trap_code == TrapCode.OUT_OF_FUEL) or "all fuel consumed" in cause:
        return PluginError("fuel", f"ran out of its {limits.fuel:,} fuel")
    if (isinstance(e, Trap) and e.trap_code == TrapCode.INTERRUPT) or "interrupt" in cause:
        return PluginError("deadline", f"ran past its {limits.deadline_ms:g} ms deadline")
    if exception and exception.startswith("MemoryError"):
        return PluginError("memory", f"hit its {limits.memory_bytes >> 20} MiB memory limit ({exception})")
    if exception:
        return PluginError("exception", exception)
    return PluginError("trap", cause)


def _cause(e: Exception) -> str:
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(e).__name__


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class StringCall:
    """An export `func(string, ...) -> string` (every one the world has), called through
    wasmtime's C API as wasmtime-py's Func.__call__ does, minus what that repeats per call:
    looking the function's type up over FFI (~25 % of a small decide). The type is checked once
    here; the strings are copied in and out, owned and freed as Func.__call__ does."""

    def __init__(self, store: Store, func: Func, name: str):
        ty = func.type(store)
        params = [t for _, t in ty.params]
        if not all(isinstance(t, String) for t in params) or not isinstance(ty.result, String):
            raise PluginError("instantiate", f"{name} is not func(string, ...) -> string (built for another world?)")
        self.func, self.arity = func, len(params)
        self._params_type = ffi.wasmtime_component_val_t * self.arity if _FAST else None

    def __call__(self, store: Store, *args: str) -> str:
        if len(args) != self.arity:
            raise TypeError(f"{self.arity} arguments, not {len(args)}")
        if not _FAST or not hasattr(self.func, "_func"):
            return self.func(store, *args)
        params = self._params_type()
        for i, text in enumerate(args):
            params[i].kind = ffi.WASMTIME_COMPONENT_STRING
            params[i].of.string = ffi.str_to_capi(text)
        result = ffi.wasmtime_component_val_t()
        try:
            enter_wasm(lambda: ffi.wasmtime_component_func_call(
                ctypes.byref(self.func._func), store._context(), params, self.arity, ctypes.byref(result), 1))
        finally:
            for i in range(self.arity):
                ffi.wasmtime_component_val_delete(ctypes.byref(params[i]))
        try:
            return ffi.to_str(result.of.string)
        finally:
            ffi.wasm_byte_vec_delete(ctypes.byref(result.of.string))

    def post_return(self, store: Store) -> None:
        self.func.post_return(store)


class Plugin:
    """A compiled component and, while it is healthy, one instance of it. Not thread-safe: the
    owner (PolicyHost) serialises calls."""

    def __init__(self, component: Component, engine: Engine, limits: Limits, name: str, sha256: str):
        self.component, self.engine, self.limits = component, engine, limits
        self.name, self.sha256 = name, sha256
        self.instantiations = 0
        self.log_lines = 0                     # what the plugin logged through the host
        self._store: Store | None = None
        self._funcs: dict[str, object] = {}
        self._log_budget = 0
        self._exception: str | None = None

    # -- the imports ---------------------------------------------------------------------------
    def _linker(self, inference: OnnxInference) -> Linker:
        linker = Linker(self.engine)
        with linker.root() as root:
            with root.add_instance("mcp:scheduler/host") as host:
                host.add_func("log", self._log)
                host.add_func("now-ms", lambda _store: int(time.time() * 1000))
            with root.add_instance("mcp:scheduler/inference") as nn:
                nn.add_func("load", lambda _s, builder, encoding, target: inference.load(builder, encoding, target))
                nn.add_func("init-execution-context", lambda _s, graph: inference.init_execution_context(graph))
                nn.add_func("set-input", lambda _s, ctx, index, t: inference.set_input(
                    ctx, index, list(t.dimensions), getattr(t, "tensor-type"), t.data))
                nn.add_func("compute", lambda _s, ctx: inference.compute(ctx))
                nn.add_func("get-output", lambda _s, ctx, index: inference.get_output(ctx, index))
        return linker

    def _log(self, _store, level: str, message: str) -> None:
        if message.startswith(EXCEPTION_TAG):         # the build's wrapper, just before a trap
            self._exception = message[len(EXCEPTION_TAG):]
            return
        # A plugin that logs in a loop must not flood the host's log: a budget per call.
        self._log_budget -= 1
        if self._log_budget < 0:
            return
        self.log_lines += 1
        log.log(LEVELS.get(level, logging.INFO), "plugin %s: %s", self.name, message[:LOG_LINE_CHARS])

    # -- instances -----------------------------------------------------------------------------
    def _arm(self, store: Store) -> None:
        if self.limits.fuel is not None:
            store.set_fuel(self.limits.fuel)
        if self.limits.deadline_ms is not None:
            store.set_epoch_deadline(int(self.limits.deadline_ms / 1000 / EPOCH_TICK_S) + 1)
        self._log_budget = LOG_LINES_PER_CALL
        self._exception = None

    def _instantiate(self) -> None:
        store = Store(self.engine)
        store.set_limits(memory_size=self.limits.memory_bytes)
        self._arm(store)
        try:
            instance = self._linker(OnnxInference()).instantiate(store, self.component)
        except (Trap, WasmtimeError) as e:
            raise PluginError("instantiate", _first_line(e)) from None
        exports = {name: instance.get_func(store, name) for name in ("encoding", "decide", "score")}
        missing = [n for n, f in exports.items() if f is None]
        if missing:
            raise PluginError("instantiate", f"the component does not export {', '.join(missing)}")
        funcs = {name: StringCall(store, f, name) for name, f in exports.items()}
        try:
            encoding = funcs["encoding"](store)
            funcs["encoding"].post_return(store)
        except (Trap, WasmtimeError) as e:
            raise PluginError("instantiate", f"encoding(): {_first_line(e)}") from None
        if encoding != ENCODING:
            raise PluginError("instantiate", f"the component speaks {encoding!r}, the host {ENCODING!r} (rebuild it)")
        self._store, self._funcs = store, funcs
        self.instantiations += 1

    def warm(self) -> None:
        """Instantiate now (a swap does this off the calling thread)."""
        if self._store is None:
            self._instantiate()

    def call(self, export: str, *args):
        """Call an export with fresh limits; a trap discards the instance and raises PluginError."""
        if self._store is None:
            self._instantiate()
        store, func = self._store, self._funcs[export]
        self._arm(store)
        try:
            result = func(store, *args)
            func.post_return(store)
            return result
        except (Trap, WasmtimeError) as e:
            self._store, self._funcs = None, {}
            raise _classify(e, self.limits, self._exception) from None

    def fuel_used(self) -> int | None:
        if self._store is None or self.limits.fuel is None:
            return None
        return self.limits.fuel - self._store.get_fuel()
