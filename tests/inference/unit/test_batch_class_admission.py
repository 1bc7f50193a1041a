"""The batcher's admission hook and the decoder's KV admission of the batch class
(inference.decoder: what the decision loop's standard -> batch remap relies on),
and the policy-change record /admin/status reports (when the first batch under a new
policy formed)."""
from __future__ import annotations

import threading

import numpy as np

from mcp26.mesh.qos import QosClass
from mcp26.mesh.batching_policy import BatcherSettings
from mcp26.inference.batch_queue import Pending
from mcp26.inference.batcher import DynamicBatcher
from mcp26.inference.decoder import KV_ADMIT_FRACTION, DecoderExecutor
from mcp26.inference.kv_blocks import KVCache

BATCH = QosClass.BATCH.header_value
HIGH = QosClass.LATENCY_CRITICAL.header_value


class Gated:
    """Records runs; `admits` refuses requests tagged "wait" while `room` is clear."""

    def __init__(self):
        self.runs, self.room = [], threading.Event()
        self.hold, self.started = threading.Event(), threading.Event()
        self.hold.set()

    def admits(self, p, taking, head):
        return None if p.context["tag"].startswith("wait") and not self.room.is_set() else 0

    def run_batch(self, batch):
        self.started.set()
        self.hold.wait(10)
        self.runs.append([p.context["tag"] for p in batch])
        return [{"y": p.inputs["x"]} for p in batch], [{} for _ in batch], 0.0, 0.0


def req(tag):
    return Pending(inputs={"x": np.zeros((1, 2), np.float32)}, outputs=(), rows=1, key=(2,), context={"tag": tag})


def test_a_request_the_executor_does_not_admit_waits_in_place_and_others_pass_it():
    ex = Gated()
    b = DynamicBatcher("m", ex, BatcherSettings(max_batch_size=1))
    try:
        waiting = b.submit(req("wait-1"), BATCH)
        passing = b.submit(req("go-1"), BATCH)
        assert passing.result(5) and not waiting.done()
        ex.room.set()                    # room made outside the queue: picked up without a new submit
        assert waiting.result(5)
        assert ex.runs == [["go-1"], ["wait-1"]]
    finally:
        b.stop()


def _decoder(capacity_bytes: int) -> DecoderExecutor:
    ex = object.__new__(DecoderExecutor)        # the hook needs only the cache and the per-token size
    ex.cache = KVCache(capacity_bytes)
    ex._token_bytes = 512
    return ex


def _step(level: int, tokens: int, start: bool = True) -> Pending:
    return Pending(inputs={"input_ids": np.zeros((1, tokens), np.int64)}, outputs=("logits",), rows=1,
                   key=("sequence",), level=level, context={"sequence_id": ("t", tokens), "start": start})


def test_decoder_admits_a_batch_class_prompt_only_while_the_kv_budget_has_room(monkeypatch):
    ex = _decoder(1 << 20)
    batch, high = QosClass.BATCH.priority_level, QosClass.LATENCY_CRITICAL.priority_level
    prompt = _step(batch, 600)
    assert ex.admits(prompt, 0, None) == 600 * 512              # an empty cache: room
    used = int(KV_ADMIT_FRACTION * (1 << 20)) - 600 * 512 + 1
    monkeypatch.setattr(ex.cache, "used_bytes", lambda: used)
    assert ex.admits(prompt, 0, None) is None                   # would pass 90 %: waits
    assert ex.admits(_step(high, 600), 0, None) == 0            # a higher class is not held back
    assert ex.admits(_step(batch, 1, start=False), 0, None) == 0   # a running sequence's step goes on
    monkeypatch.setattr(ex.cache, "used_bytes", lambda: 0)
    assert ex.admits(prompt, used, None) is None                # what the batch being formed takes counts
    # a batch-class step never rides in a batch a higher class heads (separate runs here)
    assert ex.admits(_step(batch, 1, start=False), 0, _step(high, 1)) is None


def test_policy_change_records_when_the_first_batch_under_it_formed():
    ex = Gated()
    b = DynamicBatcher("m", ex, BatcherSettings(max_batch_size=1))
    try:
        ex.hold.clear()
        first = b.submit(req("first"))
        assert ex.started.wait(5)                      # a batch under the old policy is running
        b.update_settings(BatcherSettings(max_batch_size=4, preferred_batch_sizes=(4,)))
        rec = b.policy_changes[-1]
        assert rec["generation"] == b.policy_generation == 1 and rec["first_batch_at"] is None
        nxt = b.submit(req("next"))
        ex.hold.set()
        first.result(5), nxt.result(5)
        assert rec["first_batch_at"] is not None and rec["first_batch_at"] >= rec["applied_at"]
    finally:
        b.stop()
