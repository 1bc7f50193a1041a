"""The dynamic batcher's runtime (inference-backend/batcher.py): its threads run the
batches the formation forms, with an executor that records each run. The rules
themselves, with explicit times, are test_batch_formation.py and test_batch_queue.py.

The executor computes a real function of its input (x * 2 + row index is not
used: each request's rows come back doubled), so a mixed-up split would show.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from mcp26.mesh.batching_policy import BatcherSettings, QueuePolicy
from mcp26.inference.batch_queue import Pending
from mcp26.inference.batcher import DynamicBatcher
from mcp26.inference.errors import Internal, InvalidArgument, Overloaded


class Recorder:
    """Doubles its input; records which requests ran together; can be held shut."""

    def __init__(self):
        self.runs: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()
        self.fail_next = False

    def run_batch(self, batch):
        self.started.set()
        self.gate.wait(10)
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("boom")
        self.runs.append([p.context["tag"] for p in batch])
        x = np.concatenate([p.inputs["x"] for p in batch])
        y = x * 2
        out, off = [], 0
        for p in batch:
            out.append({"y": y[off:off + p.rows]})
            off += p.rows
        return out, [{} for _ in batch], 0.0, 0.0


def req(tag, rows=1, width=4, timeout_us=None):
    x = np.full((rows, width), float(hash(tag) % 1000), np.float32)
    return Pending(inputs={"x": x}, outputs=(), rows=rows, key=(width,), timeout_us=timeout_us,
                   context={"tag": tag})


@pytest.fixture
def rec():
    return Recorder()


def make(rec, **kw):
    return DynamicBatcher("m", rec, BatcherSettings(**kw))


def hold_first(b, rec):
    """Occupy the compute thread with one request so the next ones queue."""
    rec.gate.clear()
    rec.started.clear()
    f = b.submit(req("first"))
    assert rec.started.wait(5)
    return f


def test_priority_order_is_level_then_arrival(rec):
    b = make(rec, max_batch_size=1, level_weights=None, freeze_levels=())     # Triton's strict order
    first = hold_first(b, rec)
    futures = [b.submit(req(tag), priority=level) for tag, level in
               [("c3", 3), ("a1", 1), ("d4", 4), ("b1", 1), ("e2", 2), ("f3", 3)]]
    rec.gate.set()
    for f in [first, *futures]:
        f.result(5)
    b.stop()
    assert [r[0] for r in rec.runs] == ["first", "a1", "b1", "e2", "c3", "f3", "d4"]


def test_each_request_gets_its_own_rows_back(rec):
    b = make(rec, max_batch_size=16, max_queue_delay_us=50_000)
    reqs = [req(f"r{i}", rows=1 + i % 3) for i in range(6)]
    futures = [b.submit(r) for r in reqs]
    results = [f.result(5) for f in futures]
    b.stop()
    assert len(rec.runs) == 1 and results[0].batch_size == sum(r.rows for r in reqs)
    for r, res in zip(reqs, results):
        np.testing.assert_array_equal(res.outputs["y"], r.inputs["x"] * 2)


def test_max_queue_delay_holds_a_lone_request_then_sends_it(rec):
    b = make(rec, max_batch_size=8, max_queue_delay_us=30_000)
    t0 = time.monotonic()
    res = b.submit(req("alone")).result(5)
    waited = time.monotonic() - t0
    b.stop()
    assert 0.025 <= waited < 1.0 and res.batch_size == 1 and res.queue_us >= 25_000


def test_preferred_batch_size_goes_without_waiting_for_the_delay(rec):
    # 1 is preferred too, so the lone first request leaves at once (else it waits the 5 s)
    b = make(rec, max_batch_size=8, preferred_batch_sizes=(1, 4), max_queue_delay_us=5_000_000)
    first = hold_first(b, rec)
    futures = [b.submit(req(f"p{i}")) for i in range(5)]
    t0 = time.monotonic()
    rec.gate.set()
    first.result(5)
    sizes = [f.result(10).batch_size for f in futures[:4]]
    assert time.monotonic() - t0 < 2.0          # not the 5 s delay
    assert sizes == [4, 4, 4, 4]                # the largest preferred size the queue reached
    assert futures[4].result(5).batch_size == 1
    b.stop()
    assert rec.runs[1] == ["p0", "p1", "p2", "p3"] and rec.runs[2] == ["p4"]


class Rejects:
    """An observer that records the batcher's refusals."""

    def __init__(self):
        self.rejects: list[tuple[int, str]] = []

    def on_reject(self, level, reason):
        self.rejects.append((level, reason))

    def on_batch(self, *a, **kw):
        pass


def test_refusals_reach_the_observer_and_the_caller(rec):
    seen = Rejects()
    b = DynamicBatcher("m", rec, BatcherSettings(max_batch_size=1, queue_policies={
        3: QueuePolicy(max_queue_size=1, default_timeout_us=20_000)}), observer=seen)
    first = hold_first(b, rec)
    doomed = b.submit(req("late"))
    with pytest.raises(Overloaded, match="priority level 3 queue of model 'm' is full"):
        b.submit(req("full"))
    with pytest.raises(Overloaded, match="timed out"):
        doomed.result(2)                        # the reaper, while the compute thread is held
    rec.gate.set()
    first.result(5)
    b.stop()
    assert seen.rejects == [(3, "queue_full"), (3, "timeout")] and b.total_queued() == 0
    assert rec.runs == [["first"]]              # neither ran


def test_a_batch_is_reported_to_the_formation_before_its_answers_go(rec):
    """Regrouping learns how soon a batch's requests come back from when it ended: the compute
    thread must tell the formation (`computed`) before any answer can bring a request back."""
    b = make(rec, max_batch_size=4, max_queue_delay_us=5_000_000)     # leaves when full
    rec.gate.clear()
    rec.started.clear()
    futures = [b.submit(req(f"g{i}")) for i in range(4)]
    seen = []
    for f in futures:
        f.add_done_callback(lambda _: seen.append((b.formation._done_requests, b.formation._since_done)))
    assert rec.started.wait(5)
    time.sleep(0.02)                            # the batch computes for at least 20 ms
    rec.gate.set()
    [f.result(5) for f in futures]
    b.stop()
    assert seen == [(4, 0)] * 4
    assert b.formation._batch_ns >= 20_000_000 and b.formation._row_ns == b.formation._batch_ns // 4


def test_model_failure_fails_its_batch_and_the_batcher_keeps_going(rec):
    b = make(rec, max_batch_size=4)
    rec.fail_next = True
    with pytest.raises(Internal, match="RuntimeError: boom"):
        b.submit(req("bad")).result(5)
    assert b.submit(req("good")).result(5).outputs["y"].shape == (1, 4)
    b.stop()


def test_settings_update_applies_to_the_next_batch(rec):
    b = make(rec, max_batch_size=1)
    first = hold_first(b, rec)
    futures = [b.submit(req(f"u{i}")) for i in range(4)]
    b.update_settings(BatcherSettings(max_batch_size=4))
    rec.gate.set()
    first.result(5)
    assert {f.result(5).batch_size for f in futures} == {4}
    b.stop()


def test_cancelled_requests_are_dropped_from_the_queue(rec):
    b = make(rec, max_batch_size=1)
    first = hold_first(b, rec)
    gone = b.submit(req("gone"))
    stay = b.submit(req("stay"))
    assert gone.cancel()
    rec.gate.set()
    first.result(5), stay.result(5)
    b.stop()
    assert ["gone"] not in rec.runs


def test_a_poisoned_batch_is_rerun_one_by_one(rec):
    class Poisoned(Recorder):
        def run_batch(self, batch):
            if any(p.context["tag"] == "poison" for p in batch):
                raise type("InvalidArgument", (Exception,), {})("index out of range")
            return super().run_batch(batch)
    ex = Poisoned()
    b = DynamicBatcher("m", ex, BatcherSettings(max_batch_size=8, max_queue_delay_us=50_000))
    futures = {t: b.submit(req(t)) for t in ("a", "poison", "b")}
    with pytest.raises(InvalidArgument, match="rejected the input: index out of range"):
        futures["poison"].result(5)
    assert futures["a"].result(5).batch_size == 1 and futures["b"].result(5).batch_size == 1
    b.stop()
    assert sorted(ex.runs) == [["a"], ["b"]]


class GatedByTag:
    """Like Recorder, but only a batch holding a request tagged `slow*` waits at the
    gate: a long low-priority batch, held computing for as long as the test likes."""

    concurrent_runs = True

    def __init__(self):
        self.runs: list[list[str]] = []
        self.finished: list[str] = []          # tags, in the order their batch completed
        self.gate = threading.Event()
        self.slow_started = threading.Event()
        self.lock = threading.Lock()

    def run_batch(self, batch):
        tags = [p.context["tag"] for p in batch]
        with self.lock:
            self.runs.append(tags)
        if any(t.startswith("slow") for t in tags):
            self.slow_started.set()
            self.gate.wait(10)
        with self.lock:
            self.finished.extend(tags)
        return [{"y": p.inputs["x"] * 2} for p in batch], [{} for _ in batch], 0.0, 0.0


def _lane_scenario(reserved_lane_levels: int, **rules):
    """A low-priority batch of 4 is computing (held); then a level-1 request and
    two more low ones arrive. -> (the high request's future, executor, batcher)."""
    ex = GatedByTag()
    b = DynamicBatcher("m", ex, BatcherSettings(max_batch_size=4, reserved_lane_levels=reserved_lane_levels, **rules))
    slow = [b.submit(req(f"slow{i}"), qos_class="batch") for i in range(4)]
    assert ex.slow_started.wait(5)
    more_low = [b.submit(req(f"low{i}"), qos_class="batch") for i in range(2)]
    high = b.submit(req("high"), qos_class="latency-critical")
    return high, slow + more_low, ex, b


def test_reserved_lane_runs_a_high_request_beside_a_running_low_batch():
    """With a reserved lane for level 1 the high request completes while the low
    batch is still computing (it never waits behind it), in a batch of its own:
    the waiting low requests are not back-filled into the lane."""
    high, lows, ex, b = _lane_scenario(reserved_lane_levels=1)
    try:
        res = high.result(5)                   # the slow batch is still held at the gate
        assert not any(f.done() for f in lows)
        assert ex.finished == ["high"] and res.batch_requests == 1 and res.level == 1
    finally:
        ex.gate.set()
    for f in lows:
        assert f.result(5).level == 4
    b.stop()
    assert ex.finished[0] == "high" and sorted(ex.finished[1:5]) == [f"slow{i}" for i in range(4)]
    assert ["low0", "low1"] in ex.runs         # the main instance served the rest as usual


def test_without_the_lane_a_high_request_waits_for_the_running_batch():
    """The control: one instance (plain Triton) - the high request is served only
    after the low batch that was computing when it arrived, and is back-filled."""
    high, lows, ex, b = _lane_scenario(reserved_lane_levels=0, freeze_levels=())
    time.sleep(0.2)
    assert not high.done()
    ex.gate.set()
    res = high.result(5)
    b.stop()
    assert ex.finished[:4] == [f"slow{i}" for i in range(4)] and ex.finished[4] == "high"
    assert res.batch_requests == 3             # Triton's rule: lower levels fill the rest


def test_reserved_lane_stays_off_for_an_executor_that_cannot_run_concurrently():
    class OneAtATime(GatedByTag):
        concurrent_runs = False
    ex = OneAtATime()
    b = DynamicBatcher("m", ex, BatcherSettings(max_batch_size=4, reserved_lane_levels=1))
    slow = b.submit(req("slow0"), qos_class="batch")
    assert ex.slow_started.wait(5)
    high = b.submit(req("high"), qos_class="latency-critical")
    time.sleep(0.2)
    assert not high.done()
    ex.gate.set()
    high.result(5), slow.result(5)
    b.stop()
    assert ex.finished == ["slow0", "high"]


def test_reserved_lane_can_be_switched_on_and_off_by_a_policy_update():
    high, lows, ex, b = _lane_scenario(reserved_lane_levels=0)
    b.update_settings(BatcherSettings(max_batch_size=4, reserved_lane_levels=1))
    try:
        high.result(5)                          # served by the lane that just started
        assert not any(f.done() for f in lows)
    finally:
        ex.gate.set()
    [f.result(5) for f in lows]
    b.update_settings(BatcherSettings(max_batch_size=4, reserved_lane_levels=0))
    ex.gate.clear()
    ex.slow_started.clear()
    slow = b.submit(req("slow9"), qos_class="batch")
    assert ex.slow_started.wait(5)
    late = b.submit(req("high2"), qos_class="latency-critical")
    time.sleep(0.2)
    assert not late.done()                      # the lane is off again
    ex.gate.set()
    late.result(5), slow.result(5)
    b.stop()
