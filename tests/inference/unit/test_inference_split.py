"""Split under load (`DynamicBatcher(split=N)`, `mcpctl serve --split-under-load`):
one wide instance while the load fits a batch, N narrow ones at background CPU
priority while more than a batch waits, and back. These are the runtime's part - which
thread runs a batch, at which priority, side by side; the decision itself (thresholds,
settle time, full batches while a narrow instance computes) is test_batch_formation.py.

The executor below records, for every run, which thread ran it, whether it was
asked to run narrow, how many runs were computing at that moment and the
scheduling policy the kernel reports for the running thread, so the assertions
are about what ran, where and at which priority.
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from mcp26.mesh.batching_policy import BatcherSettings
from mcp26.inference.batch_queue import Pending
from mcp26.inference.batcher import DynamicBatcher

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")


class Recorder:
    concurrent_runs = True

    def __init__(self, hold: bool = False, seconds: float = 0.0):
        self.gate = threading.Event()
        if not hold:
            self.gate.set()
        self.seconds = seconds
        self.lock = threading.Lock()
        self.running = 0
        self.runs: list[dict] = []

    def run_batch(self, batch, narrow: bool = False):
        with self.lock:
            self.running += 1
            self.runs.append({"thread": threading.current_thread().name, "narrow": narrow, "rows": len(batch),
                              "at_once": self.running, "policy": os.sched_getscheduler(0)})
        self.gate.wait(10)
        time.sleep(self.seconds)
        with self.lock:
            self.running -= 1
        return [{"y": p.inputs["x"] * 2} for p in batch], [{} for _ in batch], 0.0, 0.0


def req(v: float = 1.0) -> Pending:
    return Pending(inputs={"x": np.full((1, 4), v, np.float32)}, outputs=(), rows=1, key=(4,))


def one_at_a_time(b: DynamicBatcher, n: int) -> None:
    for i in range(n):
        assert b.submit(req(i)).result(5).outputs["y"][0, 0] == 2 * i


def test_light_load_stays_on_the_wide_instance():
    ex = Recorder()
    b = DynamicBatcher("m", ex, BatcherSettings(max_batch_size=4, max_queue_delay_us=100), split=2)
    one_at_a_time(b, 100)
    b.stop()
    assert not b.split and b.split_changes == 0 and b.narrow_batches == 0
    assert {(r["thread"], r["narrow"], r["policy"]) for r in ex.runs} == {("batcher-m", False, os.SCHED_OTHER)}


def test_a_backlog_moves_the_batches_to_narrow_instances_at_idle_priority_and_back():
    ex = Recorder(hold=True, seconds=0.002)
    b = DynamicBatcher("m", ex, BatcherSettings(max_batch_size=4, max_queue_delay_us=1000), split=2)
    futures = [b.submit(req(i)) for i in range(60)]     # the wide instance holds the first batch
    assert b.split                                        # 56 waiting: well over 1.25 batches of 4
    ex.gate.set()
    assert [f.result(10).outputs["y"][0, 0] for f in futures] == [2 * i for i in range(60)]
    narrow = [r for r in ex.runs if r["narrow"]]
    assert narrow and {r["thread"] for r in narrow} == {"batcher-m-1", "batcher-m-2"}
    assert {r["policy"] for r in narrow} == {os.SCHED_IDLE}          # the kernel's word, per thread
    assert max(r["at_once"] for r in narrow) == 2                     # two narrow batches side by side
    assert all(not r["narrow"] for r in ex.runs if r["thread"] == "batcher-m")
    assert b.narrow_batches == len(narrow)
    # The load goes away: arrivals find the server empty, the average falls under one batch,
    # stays there for SPLIT_SETTLE_NS, and the wide instance takes the batches again.
    deadline = time.monotonic() + 5
    while b.split and time.monotonic() < deadline:
        one_at_a_time(b, 1)
    assert not b.split and b.split_changes == 2
    before = len(ex.runs)
    one_at_a_time(b, 5)
    assert [(r["thread"], r["narrow"]) for r in ex.runs[before:]] == [("batcher-m", False)] * 5
    b.stop()


def test_split_needs_two_threads_to_mean_anything():
    b = DynamicBatcher("m", Recorder(), BatcherSettings(max_batch_size=4), split=1)
    assert b.split_width == 0 and len(b._threads) == 1
    b.stop()


def test_a_one_thread_session_computes_at_idle_priority_without_split():
    """A one-thread CPU session (executor.yields_cpu) leaves its core to the front end as a
    narrow instance does; the control above (no such attribute) stays SCHED_OTHER."""
    ex = Recorder()
    ex.yields_cpu = True
    b = DynamicBatcher("m", ex, BatcherSettings(max_batch_size=4, max_queue_delay_us=100))
    one_at_a_time(b, 5)
    assert {(r["thread"], r["policy"]) for r in ex.runs} == {("batcher-m", os.SCHED_IDLE)}
    # a hot reload to a session of more threads: the same thread computes at normal priority
    # again (root here; unprivileged, Linux allows that only within RLIMIT_NICE)
    wide = Recorder()
    b.set_executor(wide)
    one_at_a_time(b, 3)
    b.stop()
    if os.geteuid() == 0:
        assert {(r["thread"], r["policy"]) for r in wide.runs} == {("batcher-m", os.SCHED_OTHER)}
