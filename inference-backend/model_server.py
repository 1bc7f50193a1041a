"""The served models: one batcher and compute thread per model, hot reload.

`ModelServer` is what the REST and gRPC front ends share: look a model up,
turn decoded tensors into a queued request, await its result. Reloading a
model loads and warms the new version beside the old one, then swaps it
under the queue in one step - the queue (and every request in it) stays, so
no request fails; the batch being computed finishes on the old session.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from mcp26.mesh.batching_policy import BatcherSettings
from mcp26.mesh.session import DEFAULT_MAX_AGE_S
from mcp26.inference import builtin_models
from mcp26.inference.batch_queue import Pending
from mcp26.inference.batcher import DynamicBatcher, Result, Settled
from mcp26.inference.decoder import (MAX_CONTEXT, PAST, DecoderExecutor, KVCache, TokenMeter, is_decoder,
                                       sequence_context)
from mcp26.inference.generation import GenerationLoad
from mcp26.inference.kv_blocks import DEFAULT_IDLE_S
from mcp26.inference.load_state import snapshot
from mcp26.inference.errors import InvalidArgument, NotFound, Unavailable
from mcp26.inference.executors import BatchExecutor
from mcp26.inference.load_report import LoadSampler
from mcp26.inference.profiler import Profiler
from mcp26.inference.runtime import OnnxModel
from mcp26.inference.response_cache import cache_key
from mcp26.inference.statistics import ModelStatistics
from mcp26.inference.telemetry import Telemetry
from mcp26.inference.partition import PartitionedModel, Spec
from mcp26.inference import model_repository
from mcp26.inference.ensemble import EnsembleModel

log = logging.getLogger("mcp26.inference")
# A model whose batch-1 run (measured at warm-up) takes at most this long runs a lone
# request on the event loop (batcher.py: inline runs): cheaper than handing it to the compute
# thread and back, and short enough not to hold up the next request's parsing.
INLINE_MAX_US = 100


def check_model_spec(spec: str) -> None:
    """Fail fast on a bad --model, without generating anything."""
    if spec.startswith("builtin:"):
        if spec.split(":", 1)[1] not in builtin_models.BUILDERS:
            raise ValueError(f"--model {spec!r}: no such built-in; expected one of "
                             f"{', '.join('builtin:' + b for b in builtin_models.BUILDERS)}")
    elif not os.path.isfile(spec):
        raise ValueError(f"--model {spec!r}: no such file (or use builtin:mlp / builtin:tiny-decoder)")


def resolve_model(spec: str) -> tuple[str, str]:
    """`builtin:NAME` or a path -> (default served name, file path); generates a built-in on first use."""
    check_model_spec(spec)
    if spec.startswith("builtin:"):
        name = spec.split(":", 1)[1]
        return name, builtin_models.builtin_path(name)
    return os.path.splitext(os.path.basename(spec))[0], spec


@dataclass
class ReloadRecord:
    kind: str             # model | policy
    seconds: float        # from the request to the swap
    detail: str
    at: float = field(default_factory=time.time)


def _on_done(future, callback) -> None:
    """`callback(future)` once done: a batcher Future's done callback, or now (a Settled one)."""
    if future.done():
        callback(future)
    else:
        future.add_done_callback(callback)


def _copy_outcome(src, dst: concurrent.futures.Future) -> None:
    if dst.done():
        return
    try:
        if src.cancelled():
            dst.cancel()
        elif src.exception() is not None:
            dst.set_exception(src.exception())
        else:
            dst.set_result(src.result())
    except concurrent.futures.InvalidStateError:     # cancelled meanwhile
        pass


def when_done(future, callback) -> None:
    """Call `callback(future)` on this loop once the batcher's `future` is done: at once when
    it was done on this loop's own thread (an inline run, as most batches of a cheap model
    are), else through call_soon_threadsafe (asyncio.wrap_future takes that wake-up every time)."""
    loop = asyncio.get_running_loop()
    loop_thread = threading.get_ident()

    def done(f) -> None:
        if threading.get_ident() == loop_thread:
            callback(f)
        elif not loop.is_closed():    # (a server stopping: nobody waits any more)
            loop.call_soon_threadsafe(callback, f)
    future.add_done_callback(done)


class _Arrival:
    """ServedModel.arrival's context manager (a class: a generator's costs a request ~2 us)."""

    __slots__ = ("batcher",)

    def __init__(self, batcher):
        self.batcher = batcher

    def __enter__(self) -> None:
        self.batcher.arrived()

    def __exit__(self, kind, error, tb) -> bool:
        # refused (an exception): a batch waiting for it need not wait; else it is submitted next
        self.batcher.departed(submitting=kind is None)
        return False


def _on_loop(future) -> asyncio.Future:
    """`future` (the batcher's) as this loop's future."""
    out = asyncio.get_running_loop().create_future()
    when_done(future, lambda f: _copy_state(f, out))
    return out


def _copy_state(src, dst: asyncio.Future) -> None:
    if dst.done():                # cancelled meanwhile (the caller cancels `src` then)
        return
    if src.cancelled():
        dst.cancel()
    elif (error := src.exception()) is not None:
        dst.set_exception(error)
    else:
        dst.set_result(src.result())


def split_off_reason(model: OnnxModel) -> str | None:
    """Why `--split-under-load` cannot split `model`, or None: it can, into as many
    one-thread instances as the session has intra-op threads."""
    if is_decoder(model):
        return "a decoder's KV cache is advanced by one run at a time"
    if model.device != "cpu":
        return f"it runs on {model.device}; splitting is for CPU sessions"
    if not model.batch_dim:
        return "not every input and output is batched on dim 0"
    if model.intra_op_threads < 2:
        return f"its session has {model.intra_op_threads} intra-op thread: nothing to split"
    return None


def split_width(model: OnnxModel) -> int:
    return 0 if split_off_reason(model) else model.intra_op_threads


class ServedModel:
    def __init__(self, name: str, model: OnnxModel, settings: BatcherSettings, telemetry: Telemetry,
                 kv_cache_bytes: int = 64 << 20, kv_idle_s: float = DEFAULT_IDLE_S, fast_path: bool = True,
                 instances: int = 1, split_under_load: bool = False, profile: bool = False):
        self.after_batch = None         # ModelServer.after_batch, set as it adds the model
        self.cache = None               # the server's ResponseCache where this model uses it
        self.name = name
        self.model = model
        self.telemetry = telemetry
        self.decoder = is_decoder(model)
        self.kv_cache = KVCache(kv_cache_bytes, idle_s=kv_idle_s) if self.decoder else None
        if self.kv_cache is not None:
            self.kv_cache.start_reclaimer()
        self.tokens = TokenMeter() if self.decoder else None
        self.generation_load = GenerationLoad() if self.decoder else None   # the OpenAI API's (generate.py)
        self.fast_path = fast_path
        self._flush_scheduled = False
        self.stats = ModelStatistics(name)          # Triton's ModelStatistics (statistics.py)
        self.stats.add_version(model.version)
        # --enable-profiler: the 17 metrics (profiler.py), in the statistics extension and /metrics
        self.profiler = Profiler(model, lambda: self.batcher.settings.max_batch_size) if profile else None
        self.stats.profiler = self.profiler
        if self.profiler is not None:
            telemetry.add_profiler(name, self.profiler)
        self.loaded = True                          # False after a repository unload (repository.py)
        self.entry = None                           # its model_repository.ModelEntry, if from a repository
        # every version served under this name, this one included, shared by them all: a
        # repository model serves each version its version_policy selects (ModelServer.serve_versions)
        self.family: dict[str, ServedModel] = {model.version: self}
        # split under load (batch_formation.py): as many one-thread instances as the session has threads
        self.split_width = split_width(model) if split_under_load else 0
        self.batcher = DynamicBatcher(name, self._executor_for(model), settings, observer=self,
                                      idle_dispatch=fast_path, instances=instances, split=self.split_width)
        self._arrival = _Arrival(self.batcher)
        # utilisation of the instances together (0-1), as each is busy that fraction of the time
        self.load = LoadSampler(lambda: self.batcher.busy_ns / self.batcher.instances,
                                lambda: self.batcher.completed,
                                self.batcher.total_queued, named=self._orca_named)
        self.version_count = 1
        self._reload_lock = threading.Lock()
        self.settles = 0                    # mapped .mcp26bin sessions replaced by full ones (_settle)
        self._maybe_settle(model)
        telemetry.served_models.add(name)
        # The per-model series are this model's while it is the one served under its name: an
        # older version of a repository model shares the name and its statistics record
        # (ModelServer.serve_versions), and a second source would repeat every series.
        self.reporting = True
        telemetry.add_gauge_source("queue_depth", self._queue_gauge)
        telemetry.add_load_source(lambda: [(snapshot(self), self)] if self.reporting else [])
        if self.decoder:
            attrs = {"model": name}
            telemetry.add_gauge_source("tokens_per_second", lambda: [(self.tokens.tokens_per_second(), attrs)])
            telemetry.add_gauge_source("kv_cache_hit_rate", lambda: [(self.kv_cache.hit_rate(), attrs)])
            telemetry.add_gauge_source("kv_cache_bytes", lambda: [(float(self.kv_cache.bytes), attrs)])
            telemetry.add_gauge_source("tokens", lambda: [
                (float(self.tokens.generated), {**attrs, "kind": "generated"}),
                (float(self.tokens.processed), {**attrs, "kind": "processed"}),
                (float(self.tokens.recomputed), {**attrs, "kind": "recomputed"})])

    def _executor_for(self, model: OnnxModel):
        if is_decoder(model):
            return DecoderExecutor(model, self.kv_cache, self.tokens)
        narrow = None
        if self.split_width:            # the same file on one thread, for the narrow instances
            narrow = OnnxModel.load(self.name, model.version, model.path, model.requested_device, 1)
        executor = BatchExecutor(model, inline_ok=self.fast_path and model.batch1_us <= INLINE_MAX_US, narrow=narrow)
        return self.profiler.wrap(executor) if getattr(self, "profiler", None) is not None else executor

    def _maybe_settle(self, model: OnnxModel) -> None:
        """A .mcp26bin serves at once from its mapped weights (no prepacking: a GEMM-bound
        model computes up to ~2x slower); on the CPU provider the session an ONNX file gets
        (all optimisation levels, prepacked weights) is then built beside it and swapped in
        like a reload of the same version. From then the answers
        are the ONNX file's, bit for bit."""
        if model.extra.get("mapped") and model.device == "cpu" and not self.decoder:
            threading.Thread(target=self._settle, args=(model,), name=f"settle-{self.name}", daemon=True).start()

    def _settle(self, mapped: OnnxModel) -> None:
        # (at normal priority: the session's intra-op threads, which serve from now on, would
        # inherit a nice value from the thread that makes it)
        try:
            full = OnnxModel.load(self.name, mapped.version, mapped.path, mapped.requested_device,
                                  mapped.intra_op_threads, mapped=False)
        except Exception as e:      # the mapped session keeps serving
            log.warning("model %s: the full session of %s failed (%s); serving from the mapped weights",
                        self.name, mapped.path, e)
            return
        with self._reload_lock:
            if self.model is not mapped:        # reloaded meanwhile: that version settles itself
                return
            full.extra = {**mapped.extra, "ort_threads": full.extra["ort_threads"], "mapped": False}
            if self.profiler is not None:
                self.profiler.attach(full)
            self.batcher.set_executor(self._executor_for(full))
            self.model = full
            self.settles += 1
        log.info("model %s v%s: settled from mapped weights into a full session (made in %.3fs, warm-up %.3fs)",
                 self.name, full.version, full.load_seconds, full.warmup_seconds)

    def _orca_named(self) -> dict:
        """Named metrics of the ORCA report beside queue_depth (load_state's terms)."""
        snap = snapshot(self, by_level=False)
        out = {"waiting": snap["waiting"], "running": snap["running"]}
        if self.decoder:
            out["kv_cache_utilization"] = snap["kv_cache_utilization"]
        return out

    def kv_cache_block_bytes(self) -> int:
        """Bytes of one full KV block (keys + values) of this decoder."""
        shape = self.model.inputs["past_key"].shape       # [B, heads, past, head_dim]
        return 2 * shape[1] * shape[3] * 4 * self.kv_cache.block_tokens if shape[1] > 0 and shape[3] > 0 else 0

    def _queue_gauge(self):
        if not self.reporting:
            return []
        depth = self.batcher.queue_depth()
        return [(float(depth.get(level, 0)), {"model": self.name, "priority_level": str(level)})
                for level in range(1, self.batcher.settings.priority_levels + 1)]

    # -- batcher observer -------------------------------------------------------------
    def on_batch(self, batch: list[Pending], times, rows: int, version: str = "") -> None:
        start, assemble_us, compute_us = times
        if self.after_batch is not None:
            self.after_batch()          # the engine state page (resource_signals.py)
        self.stats.on_batch(version or self.model.version, rows, assemble_us * 1000, compute_us * 1000)
        t = self.telemetry
        t.batch_size.series(self.name).observe(rows)
        t.compute_duration.series(self.name).observe(compute_us / 1e6)
        for p in batch:
            t.queue_duration.series(self.name, str(p.level)).observe((start - p.arrival_ns) / 1e9)

    def on_reject(self, level: int, reason: str) -> None:
        self.telemetry.rejections.add(1, {"model": self.name, "priority_level": str(level), "reason": reason})

    # -- requests -----------------------------------------------------------------------
    def versions(self) -> list[str]:
        """The versions served under this name, oldest first (Triton's metadata lists them all)."""
        return sorted({m.model.version for m in self.family.values()}, key=lambda v: (len(v), v))

    def at(self, version: str) -> "ServedModel":
        """The served model of `version` ("": this one, the newest where a name has several)."""
        if not version or version == self.model.version:
            return self
        served = next((m for m in self.family.values() if m.model.version == version), None)
        if served is None:     # (by each one's model: a reload changes a version in place)
            raise NotFound(f"model {self.name!r} has no version {version!r}; serving version(s) "
                           f"{', '.join(self.versions())}")
        return served

    def prepare(self, inputs: dict[str, np.ndarray], outputs: list[str], params: dict) -> Pending:
        """Decoded tensors + parameters -> a request ready to queue (all checks done here,
        on the request's thread, so the compute thread only ever sees valid batches)."""
        model = self.model
        if outputs:
            for o in outputs:
                if o not in model.outputs:
                    raise InvalidArgument(f"model {self.name!r} has no output {o!r}; outputs are {', '.join(model.outputs)}")
            if len(set(outputs)) != len(outputs):
                raise InvalidArgument("an output is requested twice")
        seq = sequence_context(model, params, set(inputs)) if self.decoder else None
        if seq or not inputs.keys() >= model.inputs.keys():     # (the usual case: every input given)
            missing = [n for n in model.inputs if not (seq and n in PAST) and n not in inputs]
            if missing:
                raise InvalidArgument(f"model {self.name!r} needs input(s) {', '.join(missing)}")
        timeout = params.get("timeout")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0):
            raise InvalidArgument(f"parameter timeout must be a non-negative integer (microseconds), got {timeout!r}")
        if seq:
            ids = inputs["input_ids"]
            if ids.shape[0] != 1 or ids.shape[1] < 1:
                raise InvalidArgument(f"a sequence request sends input_ids of shape [1, T>=1], got {list(ids.shape)}")
            if ids.size and (ids.min() < 0 or ids.max() >= model.extra.get("vocab", 256)):
                raise InvalidArgument(f"input_ids must be token ids in 0..{model.extra.get('vocab', 256) - 1}")
            context = (0 if seq["start"] else self.kv_cache.history_length(seq["sequence_id"])) + ids.shape[1]
            if context > MAX_CONTEXT:
                raise InvalidArgument(f"sequence {seq['sequence_id']!r} would reach {context} tokens; "
                                      f"the model's context is at most {MAX_CONTEXT}")
            return Pending(inputs=inputs, outputs=tuple(outputs), rows=1, key=("sequence", tuple(outputs)),
                           timeout_us=timeout or None, context=seq)
        if self.decoder and "input_ids" in inputs:
            ids = inputs["input_ids"]
            if ids.size and (ids.min() < 0 or ids.max() >= model.extra.get("vocab", 256)):
                raise InvalidArgument(f"input_ids must be token ids in 0..{model.extra.get('vocab', 256) - 1}")
            context = ids.shape[1] + (inputs["past_key"].shape[2] if "past_key" in inputs else 0)
            if context > MAX_CONTEXT:
                raise InvalidArgument(f"past + input_ids is {context} tokens; the model's context is at most {MAX_CONTEXT}")
        if model.batch_dim:
            items = sorted(inputs.items()) if len(inputs) > 1 else list(inputs.items())
            n = items[0][1].shape[0]
            if len(items) > 1 and any(a.shape[0] != n for _, a in items):
                raise InvalidArgument(f"inputs disagree on the batch dimension: {sorted({a.shape[0] for _, a in items})}")
            if n < 1:
                raise InvalidArgument("batch dimension is 0: nothing to infer")
            key = (tuple([(k, a.shape[1:], a.dtype) for k, a in items]), tuple(outputs))
        else:
            n, key = 1, ("unbatched", object())
        return Pending(inputs=inputs, outputs=tuple(outputs), rows=n, key=key, timeout_us=timeout or None)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self.batcher.flush()

    def arrival(self) -> "_Arrival":
        """Around a front end's decoding of one request: the batcher's idle dispatch waits
        for a request being decoded (it will join the batch), not for one never coming."""
        return self._arrival

    def submit(self, pending: Pending, qos_class: str | None, priority: int | None,
               run_now: bool = False) -> "concurrent.futures.Future | Settled":
        """Queue `pending` (below), through the response cache where this model uses one."""
        cache = self.cache
        if cache is None or self.decoder or pending.key[:1] == ("sequence",):
            return self._submit(pending, qos_class, priority, run_now)
        return self._submit_cached(cache, pending, qos_class, priority, run_now)

    # -- the response cache (response_cache.py) -------------------------------------------------
    def _submit_cached(self, cache, pending: Pending, qos_class, priority, run_now: bool):
        """With Redis: Redis on the cache's pool (its answer or the miss comes back to this loop),
        the local LRU only while the breaker is open (the seed's fallback). Without: the local LRU,
        inline. The model only on a miss, whose answer is then kept."""
        t0 = time.monotonic_ns()
        digest = cache_key(self.name, self.model.version, pending.inputs, pending.outputs)
        if cache.redis is not None:
            leave = cache.remote_usable()
            if leave is not None:
                return self._remote_lookup(cache, digest, pending, qos_class, priority, t0, leave)
            cache.count(self.name, fallbacks=1)    # the breaker is open: the local LRU answers
        outputs = cache.get_local(digest)
        if outputs is not None:
            return self._cache_hit(cache, pending, outputs, qos_class, priority, t0, "local_hits")
        return self._cache_miss(cache, digest, pending, qos_class, priority, run_now, t0)

    def _cache_hit(self, cache, pending, outputs, qos_class, priority, t0: int, tier: str):
        try:
            level = self.batcher.settings.level_for(qos_class, priority)
        except ValueError:
            level = self.batcher.settings.default_priority_level
        version = self.model.version
        f = concurrent.futures.Future()
        f.set_result(Result(outputs, 0, 0, 0, pending.rows, 1, level, version, {"cache_hit": True}))
        ns = time.monotonic_ns() - t0
        cache.count(self.name, hits=1, hit_ns=ns, **{tier: 1})
        self.stats.on_cache(version, True, ns)
        return f

    def _cache_miss(self, cache, digest, pending, qos_class, priority, run_now: bool, t0: int):
        lookup_ns, version = time.monotonic_ns() - t0, self.model.version
        inner = self._submit(pending, qos_class, priority, run_now)

        def keep(f) -> None:
            if f.cancelled() or f.exception() is not None:
                return
            t1 = time.monotonic_ns()
            cache.store(digest, f.result().outputs, self.name)
            ns = lookup_ns + time.monotonic_ns() - t1
            cache.count(self.name, misses=1, miss_ns=ns)
            self.stats.on_cache(version, False, ns)
        _on_done(inner, keep)
        return inner

    def _remote_lookup(self, cache, digest, pending, qos_class, priority, t0: int, leave: str):
        """The lookup on the cache's pool; the request waits for it at most `timeout_ms`
        (`late`): past that it is answered as if the breaker were open (the local LRU, else the
        model) and the lookup's late outcome only tells the breaker. redis-py's own timeout is not
        the request's: a Cluster client that times out refreshes its topology from each node
        before it raises (~4x timeout_ms: 200 ms at 50 ms measured against 500 ms-slow shards),
        and a lookup may first wait for a free pool thread."""
        outer = concurrent.futures.Future()
        loop = asyncio.get_running_loop()
        claimed = threading.Lock()          # the first of the lookup and `late` answers the request

        def miss() -> None:
            if outer.cancelled():
                return
            try:
                inner = self._cache_miss(cache, digest, pending, qos_class, priority, False, t0)
            except Exception as e:              # refused at admission: the request's own error
                outer.set_exception(e)
                return
            outer.add_done_callback(lambda f: inner.cancel() if f.cancelled() else None)
            _on_done(inner, lambda f: _copy_outcome(f, outer))

        def answer(outputs, tier: str) -> None:
            if outputs is not None:
                _copy_outcome(self._cache_hit(cache, pending, outputs, qos_class, priority, t0, tier), outer)
            elif not loop.is_closed():
                loop.call_soon_threadsafe(miss)

        def lookup() -> None:
            if outer.cancelled() or claimed.locked():
                return                                       # (`late` answered it: Redis is not called)
            tier = "redis_hits"
            if leave == "closed" and not cache.breaker.still_closed():
                cache.count(self.name, fallbacks=1)          # opened while this waited for the pool
                outputs, tier = cache.get_local(digest), "local_hits"
            else:
                outputs = cache.get_remote(digest, self.name)
            if claimed.acquire(blocking=False):
                if not loop.is_closed():
                    loop.call_soon_threadsafe(timer.cancel)
                answer(outputs, tier)

        def late() -> None:                                  # on the loop, timeout_ms after the submit
            if outer.cancelled() or not claimed.acquire(blocking=False):
                return
            cache.count(self.name, fallbacks=1, late=1)
            answer(cache.get_local(digest), "local_hits")

        timer = loop.call_later(cache.config.timeout_s, late)
        cache.pool.submit(lookup)
        return outer

    def _submit(self, pending: Pending, qos_class: str | None, priority: int | None,
                run_now: bool = False) -> "concurrent.futures.Future | Settled":
        """Queue `pending`; its future. With idle dispatch the batcher is flushed once per loop
        turn, after every request read in it. `run_now`: a lone request for an inline model on
        an idle instance, with nothing being decoded and no flush pending, runs before this
        returns (gRPC; DynamicBatcher.run_alone): the flush would form the batch [this request]
        and run it on the loop anyway; running it now saves the loop turn, the queue's
        bookkeeping, the future's thread-safe wake-up and the task switch. REST leaves it off:
        aiohttp starts the handlers of one loop turn's requests one after another, so running
        the first at once would split what the turn's flush batches."""
        b = self.batcher
        if not b.idle_dispatch:
            return b.submit(pending, qos_class, priority)
        if run_now and not self._flush_scheduled and b.run_alone(pending, qos_class, priority):
            return pending.future
        b.submit_deferred(pending, qos_class, priority)
        if not self._flush_scheduled:       # once per loop turn: after every request read in it
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return pending.future

    async def infer(self, pending: Pending, qos_class: str | None, priority: int | None,
                    run_now: bool = False) -> Result:
        """submit(), awaited."""
        future = self.submit(pending, qos_class, priority, run_now)
        if future.done():
            return future.result()
        try:
            return await _on_loop(future)
        except asyncio.CancelledError:
            future.cancel()       # the client went away: drop it from the queue
            raise

    # -- hot reconfiguration ------------------------------------------------------------
    def reload(self, path: str, version: str | None = None, device: str | None = None,
               intra_op_threads: int | None = None) -> ReloadRecord:
        """Load + warm a new version, check it accepts what the old one did, swap it in."""
        with self._reload_lock:
            t0 = time.perf_counter()
            old = self.model
            new_version = version or str(int(old.version) + 1 if old.version.isdigit() else old.version + "+1")
            # a .mcp26bin's new chunks are hashed first; those of the files already serving are trusted
            new = OnnxModel.load(self.name, new_version, path, device or old.requested_device,
                                 intra_op_threads or old.intra_op_threads,
                                 trusted=frozenset(old.extra.get("container_files", ())))
            # the old version's extras (a decoder's vocab...), but what describes the new session is its own
            new.extra = {**old.extra, **{k: new.extra[k] for k in ("ort_threads", "container_files", "mapped")}}
            # Queued requests were checked against the old inputs: the new version must take them.
            if {k: (v.datatype, v.shape) for k, v in new.inputs.items()} != \
                    {k: (v.datatype, v.shape) for k, v in old.inputs.items()}:
                raise InvalidArgument(f"new version of {self.name!r} has different inputs "
                                      f"({[s.describe() for s in new.inputs.values()]}); not swapped")
            if is_decoder(new) != self.decoder:
                raise InvalidArgument("a decoder can only be replaced by a decoder")
            self.stats.add_version(new.version)
            if self.profiler is not None:
                self.profiler.attach(new)
            self.batcher.set_executor(self._executor_for(new))
            self.model = new
            self.version_count += 1
            seconds = time.perf_counter() - t0
            self._maybe_settle(new)
            self.telemetry.reloads.add(1, {"model": self.name, "kind": "model"})
            log.info("model %s: version %s -> %s swapped in %.3fs (load %.3fs, warm-up %.3fs), zero requests dropped",
                     self.name, old.version, new.version, seconds, new.load_seconds, new.warmup_seconds)
            return ReloadRecord("model", seconds, f"{old.version} -> {new.version} from {path}")

    def reconfigure(self, settings: BatcherSettings) -> ReloadRecord:
        t0 = time.perf_counter()
        old = self.batcher.settings.name
        self.batcher.update_settings(settings)
        seconds = time.perf_counter() - t0
        self.telemetry.reloads.add(1, {"model": self.name, "kind": "policy"})
        log.info("model %s: QoS policy %s -> %s applied in %.6fs", self.name, old, settings.name, seconds)
        return ReloadRecord("policy", seconds, f"{old} -> {settings.name}")

    def status(self) -> dict:
        m = self.model
        out = {
            "name": self.name, "version": m.version, "path": m.path, "provider": m.provider, "device": m.device,
            "requested_device": m.requested_device, "placement": m.where(),
            "load_seconds": round(m.load_seconds, 4),
            "weights": "mapped" if m.extra.get("mapped") else "session",
            "settles": self.settles,
            "warmup_seconds": round(m.warmup_seconds, 4), "intra_op_threads": m.intra_op_threads,
            "instances": self.batcher.instances,
            "split_under_load": {"width": self.split_width, "split": self.batcher.split,
                                 "changes": self.batcher.split_changes,
                                 "narrow_batches": self.batcher.narrow_batches,
                                 "seen_load": round(self.batcher.seen_load, 2)} if self.split_width else None,
            "batching": self.batcher.settings.describe(), "queue_depth": self.batcher.queue_depth(),
            "regrouped_batches": self.batcher.regroup_waits,
            "reserved_lane": {"batches": self.batcher.lane_batches,
                              "busy_seconds": round(self.batcher.lane_busy_ns / 1e9, 4),
                              "threads_held": self.batcher.reserved_threads()},
            # the seed's QoS rules (batch_formation.py): slots given per level, freezes so far
            "qos_share": {"slots_by_level": {str(k): v for k, v in sorted(self.batcher.formation.slots.items())},
                          "freezes": self.batcher.formation.freezes},
            "load_report": self.load.sample(),
        }
        if self.decoder:
            out["kv_cache"] = self.kv_cache.stats()
            out["tokens"] = {"generated": self.tokens.generated, "processed": self.tokens.processed,
                             "recomputed": self.tokens.recomputed,
                             "tokens_per_second": round(self.tokens.tokens_per_second(), 2)}
        return out


class ModelServer:
    """Every model this process serves, and its liveness/readiness."""

    def __init__(self, telemetry: Telemetry, session_key: bytes | None = None,
                 session_max_age: float = DEFAULT_MAX_AGE_S):
        self.telemetry = telemetry
        self.models: dict[str, ServedModel] = {}
        self.session_key = session_key
        self.session_max_age = session_max_age   # seconds a session signature stays valid
        self.live = True
        self.ready = False          # models loaded and warm
        self.draining = False       # shutting down: report not ready, still answer what arrives
        self.reloads: list[ReloadRecord] = []
        self.model_control_mode = "none"   # explicit: repository load / unload allowed (repository.py)
        self.after_batch = None            # called after every batch of every model (the engine state page)
        self.response_cache = None         # response_cache.ResponseCache with --cache-config
        self.flow_publisher = None         # resource_signals.FlowPublisher with --flow-ring
        self.repository = None             # model_repository.Repository with --model-repository
        # --workers: the loopback admin ports of the other worker processes serving the same
        # ports (set by the first worker once all are ready); statistics are summed over them.
        self.peer_admin_ports: list[int] = []
        # `POST /infer` and `/v2/infer` (and an empty model name) mean this model: the one
        # named by --default-model, else the only one served.
        self.default_model: str | None = None

    def add(self, name: str, path: str, settings: BatcherSettings, *args, **kwargs) -> ServedModel:
        """Load and serve a model under `name` (build's arguments)."""
        served = self.build(name, path, settings, *args, **kwargs)
        self.models[name] = served
        return served

    def build(self, name: str, path: str, settings: BatcherSettings, device: str = "auto",
              intra_op_threads: int | None = None, kv_cache_bytes: int = 64 << 20, version: str = "1",
              profile: bool = False, kv_idle_s: float = DEFAULT_IDLE_S, fast_path: bool = True,
              instances: int = 1, split_under_load: bool = False, partition: str | None = None) -> ServedModel:
        """A loaded model with its batcher running, not yet served under its name."""
        if intra_op_threads is None:
            # The instances and the reserved lane (batch_formation.py) may run at once on
            # this session: each gets its share of the cores, so together they do
            # not oversubscribe the machine (2 + 2 ORT threads on 2 cores, beside
            # the event loop). On builtin:mlp batch-1 compute alone was about the
            # same at 1 thread as at 2 (it is bound by reading the weights).
            cores = max(1, os.cpu_count() or 1)
            runners = instances + (settings.reserved_lane_threads if settings.reserved_lane_levels else 0)
            intra_op_threads = max(1, cores // runners)
        if partition:       # one graph in stages over devices (partition.py)
            model = PartitionedModel.load_partitioned(name, version, path, Spec.parse(partition, device), device,
                                                      intra_op_threads)
        else:               # (--enable-profiler profiles on a twin of its own, never this session: profiler.py)
            model = OnnxModel.load(name, version, path, device, intra_op_threads)
        if is_decoder(model):
            model.extra["vocab"] = model.outputs["logits"].shape[-1] if "logits" in model.outputs and \
                model.outputs["logits"].shape[-1] > 0 else builtin_models.DEC_VOCAB
        served = ServedModel(name, model, settings, self.telemetry, kv_cache_bytes, kv_idle_s, fast_path,
                             instances=instances, split_under_load=split_under_load, profile=profile)
        served.after_batch = self.after_batch
        served.cache = self.response_cache
        return served

    def default_name(self) -> str:
        """The model the short form (`/infer`, `/v2/infer`) stands for."""
        if self.default_model:
            return self.default_model
        if len(self.models) == 1:
            return next(iter(self.models))
        if not self.ready and not self.models:
            raise Unavailable("server is not ready (loading models); no default model yet")
        raise NotFound(f"no default model: this server has {', '.join(sorted(self.models)) or 'none'}; "
                       f"POST /v2/models/NAME/infer, or start it with --default-model NAME")

    def add_entry(self, entry, base: BatcherSettings, intra_op_threads: int | None = None,
                  fast_path: bool = True, profile: bool = False):
        """Serve one model of a Triton repository (model_repository.ModelEntry): its config's
        batching, instances and device; an ensemble over the models already served. On any
        problem nothing is added (a model already served under the name stays)."""
        old = self.models.get(entry.name)
        if entry.is_ensemble:
            served = EnsembleModel(entry, self, base)
        else:
            settings = model_repository.batcher_settings(entry, base)
            served = self.add(entry.name, entry.served_path, settings, entry.device, intra_op_threads,
                              version=entry.version, profile=profile, fast_path=fast_path, instances=entry.instances,
                              partition=entry.parameter("partition"))
            try:
                model_repository.check_against_model(entry, served.model)
                served.entry = entry
                self.serve_versions(served, entry, intra_op_threads, fast_path)
            except ValueError:
                served.batcher.stop()       # (serve_versions stops the versions it started)
                if old is None:
                    del self.models[entry.name]
                else:
                    self.models[entry.name] = old
                raise
        served.entry = entry
        # Triton's rule: a repository model uses the server's response cache if its config says so
        served.cache = self.response_cache if entry.config.response_cache.enable else None
        for one in getattr(served, "family", {}).values():
            one.cache = served.cache
        if old is not None and old is not served:
            old.reporting = False       # its name's series are the new model's now
        self.models[entry.name] = served
        return served

    def serve_versions(self, served: ServedModel, entry, intra_op_threads: int | None = None,
                       fast_path: bool = True) -> list[str]:
        """Beside `served` (the newest version), every other version entry's version_policy
        selects, as Triton serves them: each its own session and batcher on the config's
        device and instances, one statistics record; versions no longer selected are stopped.
        A version that fails to load or to match the config raises, and what was already
        served stays. The changes, as lines for the log."""
        wanted = entry.versions[:-1]
        family = {v: m for v, m in served.family.items() if m is not served and v in wanted}
        added, out = [], []
        settings = served.batcher.settings          # the config's batching, as the newest has it
        try:
            for v in wanted:
                if v in family:
                    continue
                one = self.build(entry.name, entry.served_paths[v], settings, entry.device, intra_op_threads,
                                 version=v, fast_path=fast_path, instances=entry.instances,
                                 partition=entry.parameter("partition"))
                added.append(one)
                model_repository.check_against_model(entry, one.model)
                one.entry, one.stats, one.reporting, one.cache = entry, served.stats, False, served.cache
                served.stats.add_version(v)
                family[v] = one
                out.append(f"{entry.name}: version {v} served")
        except Exception:
            for one in added:
                one.batcher.stop()
            raise
        for v, m in served.family.items():
            if m is not served and v not in family:
                m.batcher.stop()
                out.append(f"{entry.name}: version {v} no longer served")
        family[served.model.version] = served
        served.family.clear()           # one dict shared by the versions: change it in place
        served.family.update(family)
        for m in family.values():
            m.family, m.entry = served.family, entry
        return out

    def get(self, name: str, version: str = "") -> ServedModel:
        name = name or self.default_name()
        served = self.models.get(name)
        if served is None and not self.ready:
            raise Unavailable(f"server is not ready (loading models); model {name!r} not served yet")
        if served is None:
            raise NotFound(f"unknown model {name!r}; this server has {', '.join(sorted(self.models)) or 'none'}")
        one = served.at(version)
        if not self.ready:
            raise Unavailable(f"model {name!r} is not ready")
        if not served.loaded:
            raise Unavailable(f"model {name!r} is unloaded (POST /v2/repository/models/{name}/load serves it again)")
        return one

    def lookup(self, name: str, version: str = "") -> ServedModel:
        """A known model, loaded or not (its configuration and statistics outlive an unload)."""
        name = name or self.default_name()
        served = self.models.get(name)
        if served is None:
            raise NotFound(f"unknown model {name!r}; this server has {', '.join(sorted(self.models)) or 'none'}")
        return served.at(version)

    @property
    def reports_ready(self) -> bool:
        """What health checks see: ready, and not draining (so balancers move away first)."""
        return self.ready and not self.draining

    def record(self, rec: ReloadRecord) -> ReloadRecord:
        self.reloads.append(rec)
        del self.reloads[:-50]
        return rec

    def stop(self) -> None:
        self.ready = False
        for m in self.models.values():
            for one in [m, *(o for o in getattr(m, "family", {}).values() if o is not m)]:
                one.batcher.stop()
            if getattr(m, "profiler", None) is not None:      # (an ensemble has none)
                m.profiler.stop()
