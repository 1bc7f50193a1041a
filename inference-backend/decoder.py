"""Autoregressive decoding with a server-side KV cache keyed by sequence id.

A model is a decoder when it takes `past_key`/`past_value` and returns
`present_key`/`present_value` (builtin:tiny-decoder, or any ONNX export in the
same form). A request that carries the `sequence_id` parameter (Triton's name;
with `sequence_start` / `sequence_end`) and no past tensors gets its past from
the cache (inference.kv_blocks: blocks shared by token prefix). The
cache is bounded: a continuing sequence whose entry was evicted is a miss, and
the server rebuilds the entry by running the sequence's token history (less
what prefix blocks are still cached) - slower, never wrong. Blocks are tagged
with the model version that computed them, so after a hot reload a sequence
continues (as a miss, recomputed) on the new weights. Hits, misses and tokens
per second are therefore real measurements of the cache. The OpenAI API's
generations (inference.generation) are sequences too, with ids of their own.

KV admission of the batch class (`DecoderExecutor.admits`): past the budget, every
continuing step of an evicted sequence recomputes its whole history, so admitting more
sequences than the budget holds collapses the replica's goodput (measured: 1,400 tokens/s
at 1-2 concurrent 650-token generations in 1 MB, ~115 at 4 or more). A new sequence of the
batch class (the lowest level: what the mesh sheds first, and what the decision loop turns
standard traffic into when memory passes 90 %) therefore starts only while the sequences
already live, plus its prompt, fit in KV_ADMIT_FRACTION of the budget; it waits in its
place in the queue until they do (or until no sequence is live), and its steps are not
back-filled into a batch a higher class heads. Higher classes are admitted as before.
"""
from __future__ import annotations

import collections
import threading
import time

import numpy as np

from mcp26.inference.batch_queue import Pending
from mcp26.inference.errors import InvalidArgument
from mcp26.inference.executors import BatchExecutor, wanted_outputs
from mcp26.inference.kv_blocks import KVCache  # noqa: F401  (re-exported: its home before blocks)
from mcp26.inference.runtime import OnnxModel
from mcp26.mesh.qos import QosClass

PAST = ("past_key", "past_value")
PRESENT = ("present_key", "present_value")
SEQUENCE_OUTPUTS_DEFAULT = ("logits", "next_token")
# Longest context (past + new tokens) a request may make the model attend over:
# attention is quadratic in it, and one huge request must not exhaust memory.
MAX_CONTEXT = 2048
KV_GATED_LEVEL = QosClass.BATCH.priority_level    # this level and below wait for KV room to start
KV_ADMIT_FRACTION = 0.9                           # the seed's memory threshold


def is_decoder(model: OnnxModel) -> bool:
    return all(n in model.inputs for n in PAST) and all(n in model.outputs for n in PRESENT) \
        and "input_ids" in model.inputs


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
        heads, head_dim = (d if isinstance(d, int) and d > 0 else 0 for d in (spec[1], spec[3]))
        self._token_bytes = 2 * heads * head_dim * 4          # keys + values, float32, per token

    def admits(self, p: Pending, taking: int, head: Pending | None) -> int | None:
        """The batcher's admission hook: the KV bytes `p` will take if it joins the batch being
        formed (0: not counted), or None when it must wait. `taking`: what that batch already
        takes; `head`: its first request. A batch-class step never rides in a higher class's
        batch: steps of different lengths are separate runs here, so the higher class would
        wait for each (Triton's back-fill is free only for rows that share one run)."""
        if p.level < KV_GATED_LEVEL:
            return 0
        if head is not None and head.level < KV_GATED_LEVEL:
            return None
        if not p.context.get("start") or self.cache.capacity_bytes <= 0:
            return 0
        need = p.inputs["input_ids"].shape[1] * self._token_bytes
        used = self.cache.used_bytes() + taking
        if used == 0 or used + need <= KV_ADMIT_FRACTION * self.cache.capacity_bytes:
            return need
        return None

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
        empty = self.empty_past()
        for i, p in items:
            ctx = p.context
            on_start = ctx.get("on_start")
            if on_start is not None:
                on_start()            # a generation's load accounting (inference.generation)
            plan = self.cache.plan(ctx["sequence_id"], p.inputs["input_ids"][0].tolist(), bool(ctx.get("start")),
                                   self.model.version, empty)
            groups[(plan.past_length, plan.ids.shape[1])].append((i, p, plan))
        assemble, compute = time.perf_counter() - t0, 0.0
        pending_groups = list(groups.values())
        try:
            while pending_groups:
                members = pending_groups[0]
                t1 = time.perf_counter()
                feeds = {
                    "input_ids": np.concatenate([m[2].ids for m in members], axis=0),
                    "past_key": np.concatenate([m[2].past_key for m in members], axis=0),
                    "past_value": np.concatenate([m[2].past_value for m in members], axis=0),
                }
                names = sorted(set(SEQUENCE_OUTPUTS_DEFAULT) | set(PRESENT) | set(
                    n for m in members for n in wanted_outputs(self.model, m[1])))
                t2 = time.perf_counter()
                values = self.model.run(feeds, names)
                t3 = time.perf_counter()
                pending_groups.pop(0)
                for row, (i, p, plan) in enumerate(members):
                    key, value = (values[n][row:row + 1] for n in PRESENT)
                    self.cache.commit(plan, key, value, bool(p.context.get("end")))
                    asked = p.outputs or SEQUENCE_OUTPUTS_DEFAULT
                    outputs[i] = {n: values[n][row:row + 1] for n in asked}
                    params[i] = {"sequence_id": plan.sid, "past_length": plan.past_length,
                                 "kv_cache_hit": bool(plan.hit), "sequence_new": plan.hit is None,
                                 "prefix_cached_tokens": plan.reused}
                    self.meter.add(generated=1, processed=len(plan.new), recomputed=plan.recomputed)
                assemble += (t2 - t1) + (time.perf_counter() - t3)
                compute += t3 - t2
        except BaseException:
            for members in pending_groups:       # not run: give their blocks back
                for _, _, plan in members:
                    self.cache.abort(plan)
            raise
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
