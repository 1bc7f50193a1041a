"""Autoregressive decoding with a server-side KV cache keyed by sequence id.

A model is a decoder when it takes `past_key`/`past_value` and returns
`present_key`/`present_value` (builtin:tiny-decoder, or any ONNX export in the
same form). A request that carries the `sequence_id` parameter (Triton's name;
with `sequence_start` / `sequence_end`) and no past tensors gets its past from
the cache. The cache is bounded (LRU by bytes): a continuing sequence whose
entry was evicted is a miss, and the server rebuilds the entry by running the
sequence's full token history - slower, never wrong. Entries are tagged with
the model version that computed them, so after a hot reload a sequence
continues (as a miss, recomputed) on the new weights. Hits, misses and tokens
per second are therefore real measurements of the cache.
"""
from __future__ import annotations

import collections
import threading
import time

import numpy as np

from inference_backend.batcher import Pending
from inference_backend.errors import InvalidArgument
from inference_backend.executors import BatchExecutor, wanted_outputs
from inference_backend.runtime import OnnxModel

PAST = ("past_key", "past_value")
PRESENT = ("present_key", "present_value")
SEQUENCE_OUTPUTS_DEFAULT = ("logits", "next_token")
MAX_HISTORIES = 100_000
# Longest context (past + new tokens) a request may make the model attend over:
# attention is quadratic in it, and one huge request must not exhaust memory.
MAX_CONTEXT = 2048


def is_decoder(model: OnnxModel) -> bool:
    return all(n in model.inputs for n in PAST) and all(n in model.outputs for n in PRESENT) \
        and "input_ids" in model.inputs


class KVCache:
    """Per-sequence past key/value tensors, least recently used evicted past `capacity_bytes`."""

    def __init__(self, capacity_bytes: int):
        self.capacity_bytes = capacity_bytes
        self._kv: collections.OrderedDict = collections.OrderedDict()
        self._history: collections.OrderedDict = collections.OrderedDict()   # tokens fed so far
        self.bytes = 0
        self.hits = self.misses = self.evictions = 0
        self._lock = threading.Lock()     # the compute thread writes; metrics read

    def history_length(self, sid) -> int:
        """For request threads (a racy read is fine: a history only grows)."""
        h = self._history.get(sid)
        return len(h) if h is not None else 0

    def history(self, sid) -> list[int] | None:
        h = self._history.get(sid)
        if h is not None:
            self._history.move_to_end(sid)
        return h

    def lookup(self, sid, version: str = ""):
        """(key, value) computed by model `version`; another version's past is useless."""
        entry = self._kv.get(sid)
        if entry is None or entry[2] != version:
            return None
        self._kv.move_to_end(sid)
        return entry[0], entry[1]

    def store(self, sid, history: list[int], key: np.ndarray, value: np.ndarray, version: str = "") -> None:
        with self._lock:
            self._drop_kv(sid)
            self._history[sid] = history
            self._history.move_to_end(sid)
            while len(self._history) > MAX_HISTORIES:
                old, _ = self._history.popitem(last=False)
                self._drop_kv(old)
            size = key.nbytes + value.nbytes
            if size > self.capacity_bytes:
                return
            self._kv[sid] = (key, value, version)
            self.bytes += size
            while self.bytes > self.capacity_bytes:
                _, (k, v, _) = self._kv.popitem(last=False)
                self.bytes -= k.nbytes + v.nbytes
                self.evictions += 1

    def end(self, sid) -> None:
        with self._lock:
            self._drop_kv(sid)
            self._history.pop(sid, None)

    def _drop_kv(self, sid) -> None:
        kv = self._kv.pop(sid, None)
        if kv is not None:
            self.bytes -= kv[0].nbytes + kv[1].nbytes

    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def stats(self) -> dict:
        with self._lock:
            return {"sequences": len(self._history), "cached": len(self._kv), "bytes": self.bytes,
                    "capacity_bytes": self.capacity_bytes, "hits": self.hits, "misses": self.misses,
                    "evictions": self.evictions, "hit_rate": self.hit_rate()}


class TokenMeter:
    """Tokens generated and processed, with a rate over a sliding window."""

    def __init__(self, window_s: float = 10.0):
        self.window_s = window_s
        self.generated = 0
        self.processed = 0
        self.recomputed = 0
        self._events: collections.deque = collections.deque()
        self._lock = threading.Lock()

    def add(self, generated: int, processed: int, recomputed: int) -> None:
        now = time.monotonic()
        with self._lock:
            self.generated += generated
            self.processed += processed
            self.recomputed += recomputed
            self._events.append((now, generated))
            self._trim(now)

    def _trim(self, now: float) -> None:
        while self._events and self._events[0][0] < now - self.window_s:
            self._events.popleft()

    def tokens_per_second(self) -> float:
        now = time.monotonic()
        with self._lock:
            self._trim(now)
            if not self._events:
                return 0.0
            # Over the window, or since the first token in it when that is more recent
            # (a burst reads at its own rate, then decays as the window passes).
            span = max(now - self._events[0][0], 0.05)
            return sum(n for _, n in self._events) / span


class DecoderExecutor(BatchExecutor):
    """Batches decode steps across sequences; requests with explicit past tensors run stateless."""

    concurrent_runs = False     # the KV cache is advanced by one run at a time: no reserved lane

    def __init__(self, model: OnnxModel, cache: KVCache, meter: TokenMeter):
        super().__init__(model)
        self.cache = cache
        self.meter = meter
        spec = model.inputs["past_key"].shape
        self._past_shape = spec

    def empty_past(self) -> np.ndarray:
        shape = [1] + [d if d >= 0 else 0 for d in self._past_shape[1:]]
        shape[2] = 0
        return np.zeros(shape, np.float32)

    def run_batch(self, batch: list[Pending]):
        if batch[0].key[0] != "sequence":
            return super().run_batch(batch)
        outputs: list = [None] * len(batch)
        params: list = [None] * len(batch)
        assemble = compute = 0.0
        remaining = list(enumerate(batch))
        while remaining:
            # One step per sequence per round: a second request for the same
            # sequence needs the first one's present tensors.
            this_round, later, seen = [], [], set()
            for i, p in remaining:
                sid = p.context["sequence_id"]
                (later if sid in seen else this_round).append((i, p))
                seen.add(sid)
            a, c = self._round(this_round, outputs, params)
            assemble += a
            compute += c
            remaining = later
        return outputs, params, assemble, compute

    def _round(self, items, outputs, params) -> tuple[float, float]:
        t0 = time.perf_counter()
        groups: dict[tuple, list] = collections.defaultdict(list)
        for i, p in items:
            ctx = p.context
            sid = ctx["sequence_id"]
            new_ids = p.inputs["input_ids"]
            history = None if ctx.get("start") else self.cache.history(sid)
            hit, recomputed = None, 0
            if history is None:
                history, ids, past = [], new_ids, (self.empty_past(), self.empty_past())
            else:
                kv = self.cache.lookup(sid, self.model.version)
                if kv is not None:
                    hit, ids, past = True, new_ids, kv
                    self.cache.hits += 1
                else:
                    hit, recomputed = False, len(history)
                    self.cache.misses += 1
                    ids = np.concatenate([np.asarray([history], np.int64), new_ids], axis=1)
                    past = (self.empty_past(), self.empty_past())
            groups[(past[0].shape[2], ids.shape[1])].append((i, p, sid, history, ids, past, hit, recomputed))
        assemble, compute = time.perf_counter() - t0, 0.0
        for members in groups.values():
            t1 = time.perf_counter()
            feeds = {
                "input_ids": np.concatenate([m[4] for m in members], axis=0),
                "past_key": np.concatenate([m[5][0] for m in members], axis=0),
                "past_value": np.concatenate([m[5][1] for m in members], axis=0),
            }
            names = sorted(set(SEQUENCE_OUTPUTS_DEFAULT) | set(PRESENT) | set(
                n for m in members for n in wanted_outputs(self.model, m[1])))
            t2 = time.perf_counter()
            values = self.model.run(feeds, names)
            t3 = time.perf_counter()
            for row, (i, p, sid, history, ids, past, hit, recomputed) in enumerate(members):
                ctx = p.context
                key, value = (values[n][row:row + 1] for n in PRESENT)
                new_tokens = p.inputs["input_ids"][0].tolist()
                if ctx.get("end"):
                    self.cache.end(sid)
                else:
                    self.cache.store(sid, history + new_tokens, np.ascontiguousarray(key), np.ascontiguousarray(value),
                                     self.model.version)
                asked = p.outputs or SEQUENCE_OUTPUTS_DEFAULT
                outputs[i] = {n: values[n][row:row + 1] for n in asked}
                params[i] = {"sequence_id": sid, "past_length": int(past[0].shape[2]),
                             "kv_cache_hit": hit if hit is not None else False,
                             "sequence_new": hit is None}
                self.meter.add(generated=1, processed=len(new_tokens), recomputed=recomputed)
            assemble += (t2 - t1) + (time.perf_counter() - t3)
            compute += t3 - t2
        return assemble, compute


def sequence_context(model: OnnxModel, params: dict, given: set[str]) -> dict | None:
    """The sequence fields of a request to a decoder, or None for a stateless call."""
    if "sequence_id" not in params:
        return None
    if given & set(PAST):
        raise InvalidArgument("a request with sequence_id takes its past from the server's KV cache; "
                              "send past_key/past_value only without sequence_id")
    sid = params["sequence_id"]
    if isinstance(sid, bool) or not isinstance(sid, (int, str)) or sid in ("", 0):
        raise InvalidArgument(f"sequence_id must be a non-zero integer or a non-empty string, got {sid!r}")
    return {"sequence_id": sid, "start": bool(params.get("sequence_start", False)),
            "end": bool(params.get("sequence_end", False))}
