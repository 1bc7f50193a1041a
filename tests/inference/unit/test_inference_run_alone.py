"""A lone request run on the caller's thread without entering a queue
(DynamicBatcher.run_alone, ServedModel.submit's `run_now`: the gRPC lane's unary
ModelInfer), and the cheaper pieces of the per-request path beside it: the
telemetry histograms, the raw-input plans, to_raw, the trailers' metadata block, a unary
answer's one write (H2Connection.send_answer).
Each check is on what comes out (the run's thread, the future, the exposition
text, the bytes), against the slower form it replaced where there is one."""
from __future__ import annotations

import threading

import numpy as np
import prometheus_client
import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from mcp26.serving.grpc.server import metadata_block
from mcp26.serving.h2.hpack_encoder import literal
from mcp26.mesh.batching_policy import BatcherSettings
from mcp26.inference import datatypes, runtime
from mcp26.inference.batch_queue import Pending
from mcp26.inference.batcher import DynamicBatcher, Settled
from mcp26.inference.builtin_models import builtin_path
from mcp26.inference.errors import InvalidArgument
from mcp26.inference.telemetry import LATENCY_BUCKETS_S, _Histogram

SLOW = dict(max_batch_size=8, preferred_batch_sizes=(8,), max_queue_delay_us=5_000_000)


class Recorder:
    def __init__(self, inline_ok=True, fail=None):
        self.inline_ok, self.fail = inline_ok, fail
        self.runs: list[tuple[list[str], str]] = []      # (tags, thread name)

    def run_batch(self, batch):
        self.runs.append(([p.context["tag"] for p in batch], threading.current_thread().name))
        if self.fail:
            raise self.fail
        return [{"y": p.inputs["x"] * 2} for p in batch], [{} for _ in batch], 0.0, 0.0


def req(tag):
    return Pending(inputs={"x": np.ones((1, 4), np.float32)}, outputs=(), rows=1, key=(4,), context={"tag": tag})


def batcher(rec):
    return DynamicBatcher("m", rec, BatcherSettings(**SLOW), idle_dispatch=True)


def test_a_lone_request_runs_on_the_callers_thread_and_never_enters_a_queue():
    rec = Recorder()
    b = batcher(rec)
    p = req("a")
    assert b.run_alone(p) is True
    assert rec.runs == [(["a"], threading.current_thread().name)]
    assert isinstance(p.future, Settled) and p.future.done()
    result = p.future.result()
    assert result.outputs["y"].tolist() == [[2.0] * 4] and result.batch_size == 1 and result.batch_requests == 1
    assert b.inline_runs == 1 and b.completed == 1 and b.total_queued() == 0 and b.in_flight == 0
    assert b.instance_free()                 # the instance is given back
    b.stop()


def test_a_model_failure_reaches_the_caller_through_the_settled_future():
    b = batcher(Recorder(fail=RuntimeError("boom")))
    p = req("a")
    assert b.run_alone(p) is True
    with pytest.raises(Exception, match="boom"):
        p.future.result()
    assert b.instance_free()
    b.stop()


@pytest.mark.parametrize("why", ["queued", "not cheap"])
def test_run_alone_declines_and_does_nothing_when_a_flush_would_not_run_it_alone_now(why):
    """The formation's reasons (busy, decoding, regrouping, ...) are test_batch_formation.py's;
    here: what the runtime adds (a model not cheap enough), and that a declined request still
    joins the turn's batch."""
    rec = Recorder(inline_ok=why != "not cheap")
    b = batcher(rec)
    if why == "queued":
        b.submit_deferred(req("before"))
    p = req("a")
    assert b.run_alone(p) is False
    assert p.future is None and rec.runs == [] and b.inline_runs == 0
    if why == "queued":                       # it still joins the turn's batch
        b.submit_deferred(p)
        b.flush()
        assert rec.runs == [(["before", "a"], threading.current_thread().name)]
        assert p.future.result(5).batch_requests == 2
    b.stop()


def test_run_alone_refuses_what_submit_refuses():
    b = batcher(Recorder())
    big = Pending(inputs={"x": np.ones((9, 4), np.float32)}, outputs=(), rows=9, key=(4,), context={"tag": "big"})
    with pytest.raises(InvalidArgument, match="exceeds max_batch_size"):
        b.run_alone(big)
    b.stop()


def test_histogram_exposition_is_prometheus_clients_to_the_byte():
    reference = CollectorRegistry()
    theirs = prometheus_client.Histogram("hot_path_ref_seconds", "doc", ("model", "level"),
                                         buckets=LATENCY_BUCKETS_S, registry=reference)
    ours = _Histogram("hot_path_ours_seconds", "doc", ("model", "level"), LATENCY_BUCKETS_S)
    values = [0.0, 0.0005, 0.00050001, 0.001, 0.0123, 5.0, 7.5, 1e-9]     # on a bound, past the last
    for i, v in enumerate(values):
        theirs.labels(model="m", level=str(1 + i % 2)).observe(v)
        ours.labels(model="m", level=str(1 + i % 2)).observe(v)

    def lines(registry, name):     # (the server turns *_created off: Telemetry)
        return [line.replace(name, "X") for line in generate_latest(registry).decode().splitlines()
                if name in line and f"{name}_created" not in line]
    want = lines(reference, "hot_path_ref_seconds")
    assert lines(REGISTRY, "hot_path_ours_seconds") == want
    # le is inclusive: level 2 saw 0.0005 itself and 1e-9 at or under it
    assert 'X_bucket{le="0.0005",level="2",model="m"} 2.0' in want
    REGISTRY.unregister(ours)


def test_raw_plans_check_once_and_still_refuse_what_they_refused():
    model = runtime.OnnxModel.load("relu", "1", builtin_path("relu"), "cpu", 1)
    assert model.raw_plan("INPUT0", "FP32", [2, 256]) == ((2, 256), 2 * 256 * 4)
    assert ("INPUT0", "FP32", (2, 256)) in model._raw_plans
    with pytest.raises(InvalidArgument, match="does not match"):
        model.raw_plan("INPUT0", "FP32", [2, 255])
    with pytest.raises(InvalidArgument, match="datatype FP64"):
        model.raw_plan("INPUT0", "FP64", [1, 256])
    with pytest.raises(InvalidArgument, match="negative"):
        model.raw_plan("INPUT0", "FP32", [-2, 256])
    for n in range(1, runtime.RAW_PLANS + 20):     # remembered up to a bound, checked past it
        model.raw_plan("INPUT0", "FP32", [n, 256])
    assert len(model._raw_plans) == runtime.RAW_PLANS


def test_to_raw_is_little_endian_c_order_whatever_the_array():
    a = np.arange(12, dtype="<f4").reshape(3, 4)
    want = a.tobytes()
    assert datatypes.to_raw(a.astype(">f4")) == want                    # big-endian in
    assert datatypes.to_raw(np.asfortranarray(a)) == want               # not C-contiguous
    assert datatypes.to_raw(a.T) == np.ascontiguousarray(a.T).tobytes()
    assert datatypes.to_raw(np.array([1, 0], "?")) == b"\x01\x00"


def test_metadata_block_encodes_as_literals_with_bin_values_base64():
    pairs = [("X-Mcp-Queue-Time-Us", "12"), ("trace-bin", b"\x00\xff"), ("x-big", "v" * 300)] * 2
    want = b"".join(literal(b"x-mcp-queue-time-us", b"12") + literal(b"trace-bin", b"AP8")
                    + literal(b"x-big", b"v" * 300) for _ in range(2))
    assert metadata_block(pairs) == want and metadata_block(()) == b"" and metadata_block(None) == b""
