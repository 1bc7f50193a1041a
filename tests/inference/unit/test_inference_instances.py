"""Model instances (`--instances`, Triton's instance_group count): N compute
threads take batches from one queue and run them side by side.

The executor below holds each batch at a gate and records the threads that
are computing at the same moment, so what is asserted is what ran together.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from mcp26.mesh.batching_policy import BatcherSettings
from mcp26.inference.batch_queue import Pending
from mcp26.inference.batcher import DynamicBatcher


class Held:
    """Runs each batch only once the test opens the gate; records who computed at once."""

    concurrent_runs = True

    def __init__(self):
        self.gate = threading.Event()
        self.lock = threading.Lock()
        self.running: set[str] = set()
        self.most_at_once = 0
        self.threads: set[str] = set()
        self.runs: list[list[str]] = []

    def run_batch(self, batch):
        me = threading.current_thread().name
        with self.lock:
            self.running.add(me)
            self.threads.add(me)
            self.most_at_once = max(self.most_at_once, len(self.running))
            self.runs.append([p.context["tag"] for p in batch])
        self.gate.wait(10)
        with self.lock:
            self.running.discard(me)
        return [{"y": p.inputs["x"] * 2} for p in batch], [{} for _ in batch], 0.0, 0.0

    def wait_running(self, n: int, timeout: float = 5.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if len(self.running) >= n:
                    return True
            time.sleep(0.005)
        return False


def req(tag: str) -> Pending:
    return Pending(inputs={"x": np.full((1, 4), float(len(tag)), np.float32)}, outputs=(), rows=1, key=(4,),
                   context={"tag": tag})


def test_two_instances_compute_two_batches_at_the_same_time():
    ex = Held()
    b = DynamicBatcher("m", ex, BatcherSettings(max_batch_size=1, max_queue_delay_us=0), instances=2)
    futures = [b.submit(req(t)) for t in ("a", "b", "c")]
    assert ex.wait_running(2)                      # a and b compute together; c waits for a free instance
    time.sleep(0.1)
    assert ex.most_at_once == 2 and not futures[2].done() and b.in_flight == 2
    ex.gate.set()
    assert [f.result(5).outputs["y"][0, 0] for f in futures] == [2.0, 2.0, 2.0]
    b.stop()
    assert ex.threads == {"batcher-m", "batcher-m-1"} and b.in_flight == 0 and b.completed == 3


def test_one_instance_computes_one_batch_at_a_time():
    """The control: the default, one instance (Triton's count 1)."""
    ex = Held()
    b = DynamicBatcher("m", ex, BatcherSettings(max_batch_size=1, max_queue_delay_us=0))
    futures = [b.submit(req(t)) for t in ("a", "b")]
    assert ex.wait_running(1)
    time.sleep(0.1)
    assert ex.most_at_once == 1 and not futures[1].done()
    ex.gate.set()
    [f.result(5) for f in futures]
    b.stop()
    assert ex.threads == {"batcher-m"}


def test_an_executor_that_cannot_run_concurrently_keeps_to_one_instance():
    class Serial(Held):
        concurrent_runs = False     # e.g. the decoder, whose KV cache takes one run at a time
    ex = Serial()
    b = DynamicBatcher("m", ex, BatcherSettings(max_batch_size=1, max_queue_delay_us=0), instances=3)
    futures = [b.submit(req(t)) for t in ("a", "b", "c")]
    assert ex.wait_running(1)
    time.sleep(0.1)
    assert ex.most_at_once == 1
    ex.gate.set()
    [f.result(5) for f in futures]
    b.stop()
    assert ex.threads == {"batcher-m"} and ex.most_at_once == 1


def test_the_reserved_lane_still_dispatches_at_once_while_the_main_instance_computes():
    """Waiting for company is for main instances: a top-level request on the idle
    lane leaves at once, however long the queue delay."""
    ex = Held()
    delay_us = 2_000_000
    b = DynamicBatcher("m", ex, BatcherSettings(max_batch_size=8, preferred_batch_sizes=(), max_queue_delay_us=delay_us,
                                                reserved_lane_levels=1), idle_dispatch=True)
    low = b.submit(req("low"), qos_class="batch")
    assert ex.wait_running(1)
    high = b.submit(req("high"), qos_class="latency-critical")
    assert ex.wait_running(2)                      # the lane took it beside the held batch (queue_us below)
    ex.gate.set()
    assert high.result(5).queue_us < delay_us / 4 and low.result(5)
    b.stop()
