"""The seed's QoS rules in the batcher's runtime (inference-backend/batcher.py): real compute
threads and an executor that takes time, fed by closed-loop clients (each answer sends the
next request). The rules with explicit times are test_batch_qos_rules.py."""
from __future__ import annotations

import collections
import threading
import time

import numpy as np

from mcp26.mesh import qos as Q
from mcp26.mesh.batching_policy import BatcherSettings
from mcp26.inference.batch_queue import Pending
from mcp26.inference.batcher import DynamicBatcher

HIGH, MEDIUM, LOW, CRITICAL = (Q.LLM_PRIORITY_CLASSES[n].header_value for n in ("high", "medium", "low", "critical"))


class Timed:
    """Takes `batch_s` per batch (a gated tag waits for the gate); records each batch's
    classes and when it started and ended."""

    concurrent_runs = True

    def __init__(self, batch_s: float = 0.002):
        self.batch_s = batch_s
        self.log: list[tuple[float, float, list[str]]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.running = 0
        self.most_running = 0
        self.lock = threading.Lock()

    def run_batch(self, batch):
        start = time.monotonic()
        with self.lock:
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        if any(p.context.get("gated") for p in batch):
            self.gate.wait(10)
        time.sleep(self.batch_s)
        with self.lock:
            self.running -= 1
            self.log.append((start, time.monotonic(), [p.context["cls"] for p in batch]))
        return [{"y": p.inputs["x"]} for p in batch], [{} for _ in batch], 0.0, self.batch_s


def req(cls: str, **context) -> Pending:
    return Pending(inputs={"x": np.zeros((1, 4), np.float32)}, outputs=(), rows=1, key=(4,),
                   context={"cls": cls, **context})


def closed_loop(b: DynamicBatcher, cls: str, clients: int, stop: threading.Event) -> None:
    """`clients` requests of `cls` always outstanding: each answer submits the next."""
    def again(_future):
        if not stop.is_set():
            b.submit(req(cls), qos_class=cls).add_done_callback(again)
    for _ in range(clients):
        b.submit(req(cls), qos_class=cls).add_done_callback(again)


def test_high_takes_three_slots_to_mediums_one_on_the_running_batcher():
    ex = Timed()
    b = DynamicBatcher("m", ex, BatcherSettings(max_batch_size=8, max_queue_delay_us=0), idle_dispatch=True)
    stop = threading.Event()
    closed_loop(b, HIGH, 16, stop)
    closed_loop(b, MEDIUM, 16, stop)
    time.sleep(1.0)
    stop.set()
    b.stop()
    slots = collections.Counter(c for _, _, classes in ex.log for c in classes)
    assert slots[HIGH] + slots[MEDIUM] >= 400, slots          # enough batches to judge a share
    assert abs(slots[HIGH] / slots[MEDIUM] - 3.0) <= 0.3, slots


def test_no_low_batch_starts_while_a_high_request_waits():
    ex = Timed(batch_s=0.003)
    b = DynamicBatcher("m", ex, BatcherSettings(max_batch_size=4, max_queue_delay_us=0), idle_dispatch=True)
    stop = threading.Event()
    closed_loop(b, LOW, 16, stop)                              # Low saturates the instance
    highs = []
    for _ in range(20):
        time.sleep(0.01)
        sent = time.monotonic()
        highs.append((sent, b.submit(req(HIGH), qos_class=HIGH)))
    done = [(sent, f.result(5)) for sent, f in highs]
    stop.set()
    b.stop()
    for sent, result in done:
        started = sent + result.queue_us / 1e6                 # when its batch began
        overlapping = [classes for s, _, classes in ex.log if sent < s < started - 0.0005]
        assert not any(LOW in c for c in overlapping), (sent, started, overlapping)
    assert b.formation.freezes >= 1
    assert not any(HIGH in c and LOW in c for _, _, c in ex.log)


def test_the_lane_of_two_threads_is_held_while_a_critical_request_lives_and_no_longer():
    ex = Timed(batch_s=0.0)
    b = DynamicBatcher("m", ex, BatcherSettings(max_batch_size=4, reserved_lane_levels=1), idle_dispatch=True)
    ex.gate.clear()
    low = b.submit(req(LOW, gated=True), qos_class=LOW)        # the main instance is held busy
    time.sleep(0.05)
    assert b.reserved_threads() == 0
    crit = []
    for running in (2, 3):                                     # the second comes while the first computes
        crit.append(b.submit(req(CRITICAL, gated=True), qos_class=CRITICAL))
        deadline = time.monotonic() + 5
        while ex.running < running and time.monotonic() < deadline:
            time.sleep(0.005)
    assert ex.running == 3                                     # both Critical requests compute at once, beside Low
    assert b.reserved_threads() == 2
    ex.gate.set()
    for f in crit:
        assert f.result(5).level == 1
    low.result(5)
    assert b.reserved_threads() == 0                           # released as the requests ended: no hold
    assert b.lane_batches == 2
    b.stop()
