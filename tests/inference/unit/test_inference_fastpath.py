"""The batcher's fast path (inference-backend/batch_formation.py, "Idle dispatch";
batcher.py, "Deferred submits and inline runs"), through the runtime's threads: a lone
request on an idle instance leaves at once instead of waiting max_queue_delay, a request
being decoded is still waited for, and a cheap model runs a lone request on the caller's
thread. Plain Triton batching (idle_dispatch off) is test_inference_batcher.py."""
from __future__ import annotations

import threading
import time

import numpy as np

from mcp26.mesh.batching_policy import BatcherSettings
from mcp26.inference.batch_queue import Pending
from mcp26.inference.batcher import DynamicBatcher


class Recorder:
    def __init__(self, inline_ok=False):
        self.inline_ok = inline_ok
        self.runs: list[tuple[list[str], str]] = []      # (tags, thread name)
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()

    def run_batch(self, batch):
        self.started.set()
        self.gate.wait(10)
        self.runs.append(([p.context["tag"] for p in batch], threading.current_thread().name))
        return [{"y": p.inputs["x"] * 2} for p in batch], [{} for _ in batch], 0.0, 0.0


def req(tag):
    return Pending(inputs={"x": np.ones((1, 4), np.float32)}, outputs=(), rows=1, key=(4,), context={"tag": tag})


SLOW = dict(max_batch_size=8, preferred_batch_sizes=(8,), max_queue_delay_us=5_000_000)   # a 5 s window


def test_lone_request_on_an_idle_instance_leaves_at_once():
    rec = Recorder()
    b = DynamicBatcher("m", rec, BatcherSettings(**SLOW), idle_dispatch=True)
    t0 = time.monotonic()
    result = b.submit(req("a")).result(5)
    assert time.monotonic() - t0 < 1.0             # not the 5 s window
    assert result.queue_us < 1_000_000 and rec.runs == [(["a"], "batcher-m")]
    b.stop()


def test_without_idle_dispatch_the_same_request_waits_the_window():
    rec = Recorder()
    b = DynamicBatcher("m", rec, BatcherSettings(**dict(SLOW, max_queue_delay_us=300_000)))
    result = b.submit(req("a")).result(5)
    assert result.queue_us >= 300_000
    b.stop()


def test_a_request_being_decoded_is_waited_for_and_joins_the_batch():
    rec = Recorder()
    b = DynamicBatcher("m", rec, BatcherSettings(**SLOW), idle_dispatch=True)
    b.arrived()                       # a front end is decoding a second request
    first = b.submit(req("a"))
    time.sleep(0.2)
    assert rec.runs == []             # waited for it ...
    b.departed(submitting=True)
    second = b.submit(req("b"))
    first.result(5), second.result(5)
    assert rec.runs == [(["a", "b"], "batcher-m")]     # ... and it joined
    b.stop()


def test_a_refused_arrival_releases_the_waiting_batch():
    rec = Recorder()
    b = DynamicBatcher("m", rec, BatcherSettings(**SLOW), idle_dispatch=True)
    b.arrived()
    first = b.submit(req("a"))
    time.sleep(0.1)
    t0 = time.monotonic()
    b.departed()                      # that request was refused (a 400): nothing to wait for
    first.result(5)
    assert time.monotonic() - t0 < 1.0 and rec.runs == [(["a"], "batcher-m")]
    b.stop()


def test_requests_arriving_while_the_instance_computes_batch_together():
    rec = Recorder()
    b = DynamicBatcher("m", rec, BatcherSettings(**SLOW), idle_dispatch=True)
    rec.gate.clear()
    rec.started.clear()
    first = b.submit(req("first"))
    assert rec.started.wait(5)
    rest = [b.submit(req(t)) for t in "abc"]
    rec.gate.set()
    for f in [first, *rest]:
        f.result(5)
    assert [r[0] for r in rec.runs] == [["first"], ["a", "b", "c"]]
    b.stop()


def test_cheap_model_runs_a_turns_requests_as_one_batch_on_the_flushing_thread():
    rec = Recorder(inline_ok=True)
    b = DynamicBatcher("m", rec, BatcherSettings(**SLOW), idle_dispatch=True)
    ps = [req(t) for t in "abc"]
    for p in ps:
        b.submit_deferred(p)
    assert rec.runs == []                       # nothing woken, nothing run yet
    b.flush()                                   # the loop's turn is over
    assert all(p.future.done() for p in ps) and ps[1].future.result().outputs["y"].tolist() == [[2.0] * 4]
    assert rec.runs == [(["a", "b", "c"], threading.current_thread().name)] and b.inline_runs == 1
    b.stop()


def test_deferred_requests_wait_for_the_flush_then_the_compute_thread_takes_them():
    rec = Recorder(inline_ok=False)              # not cheap: the compute thread runs it
    b = DynamicBatcher("m", rec, BatcherSettings(**SLOW), idle_dispatch=True)
    ps = [req(t) for t in "ab"]
    for p in ps:
        b.submit_deferred(p)
    time.sleep(0.2)
    assert rec.runs == []                       # one wake-up per turn, not one per request
    b.flush()
    for p in ps:
        p.future.result(5)
    assert rec.runs == [(["a", "b"], "batcher-m")] and b.inline_runs == 0
    b.stop()


def test_no_inline_run_while_the_instance_is_busy():
    rec = Recorder(inline_ok=True)
    b = DynamicBatcher("m", rec, BatcherSettings(**SLOW), idle_dispatch=True)
    rec.gate.clear()
    rec.started.clear()
    first = b.submit(req("first"))
    assert rec.started.wait(5)
    p = req("a")
    b.submit_deferred(p)
    b.flush()                                   # busy: left to the compute thread
    assert not p.future.done()
    rec.gate.set()
    first.result(5), p.future.result(5)
    assert rec.runs == [(["first"], "batcher-m"), (["a"], "batcher-m")] and b.inline_runs == 0
    b.stop()


def test_json_fast_path_keeps_the_standard_librarys_answers():
    from mcp26.inference import json_codec
    assert json_codec.loads(b'{"data": [NaN, 1.5]}')["data"][1] == 1.5      # NaN: what json.dumps writes
    assert json_codec.output_data(np.array([np.nan], np.float32)) is None     # written as json does
    out = json_codec.output_data(np.array([[0.5, 2.0]], np.float32))
    assert json_codec.loads(json_codec.dumps({"d": out if out is not None else [0.5, 2.0]})) == {"d": [0.5, 2.0]}
