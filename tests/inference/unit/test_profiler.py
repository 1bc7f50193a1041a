"""The profiler's 17 metrics (inference-backend/profiler.py) on real ONNX Runtime sessions
and real perf_event_open counters: each is present or unavailable with a reason (never a
silent 0), and the counters move with the work a batch does."""
from __future__ import annotations

import time

import numpy as np
import pytest

from mcp26.inference import hw_counters, profiler
from mcp26.inference.batcher import Pending
from mcp26.inference.builtin_models import builtin_path
from mcp26.inference.executors import BatchExecutor
from mcp26.inference.runtime import OnnxModel

AVAILABLE, MISSING = hw_counters.probe()


def _batches(prof: profiler.Profiler, executor, model: OnnxModel, rows: int, count: int, level: int = 1):
    spec = next(iter(model.inputs.values()))
    x = np.random.default_rng(0).standard_normal((rows, spec.shape[1])).astype(np.float32)
    for _ in range(count):
        p = Pending({spec.name: x}, (), rows, (), level=level, arrival_ns=time.monotonic_ns())
        executor.run_batch([p])


def _profiled(name: str):
    model = OnnxModel.load(name, "1", builtin_path(name), "cpu", 1, warmup=False)
    prof = profiler.Profiler(model, lambda: 32)
    return model, prof, prof.wrap(BatchExecutor(model))


def test_seventeen_metrics_each_a_value_or_a_reason():
    assert len(profiler.METRICS) == 17 and len(set(profiler.METRIC_KEYS)) == 17
    model, prof, ex = _profiled("mlp")
    try:
        _batches(prof, ex, model, 8, 6)
        prof._sample(prof._last_feeds)              # one twin sample now, not after its first interval
        m = profiler.derive(None, prof.doc())
    finally:
        prof.stop()
    for key in profiler.METRIC_KEYS:
        assert (m[key] is None) == (key in m["reasons"]), key
        if m[key] is None:
            assert m["reasons"][key].strip(), key
    for name, reason in MISSING.items():        # what this kernel refuses is said, with the errno's reason
        assert "perf_event_open" in reason
    assert m["batch_fill_ratio"] == pytest.approx(8 / 32)
    assert m["compute_us_per_row"] > 0 and m["queue_wait_ms"] >= 0
    # ONNX Runtime fused Gemm+Relu into FusedGemm on the CPU provider, in effect; no copies on CPU
    assert m["fusion"]["fused"]["FusedGemm"] == {"count": 3, "providers": ["CPUExecutionProvider"],
                                                 "in_effect": True}
    assert m["fusion"]["removed"] == {"Gemm": 3, "Relu": 3}
    assert m["fused_nodes"] == 3            # 7 source nodes, 4 run
    assert m["memcpy_bytes_per_batch"] == 0
    assert set(m["kernel_by_op"]) == {"FusedGemm", "Gemm"} and m["kernel_ms_by_op_type"] > 0


def test_per_priority_level_rows_split():
    model, prof, ex = _profiled("relu")
    try:
        _batches(prof, ex, model, 4, 3, level=1)
        _batches(prof, ex, model, 4, 5, level=3)
        doc = prof.doc()
    finally:
        prof.stop()
    assert doc["levels"]["all"]["batches"] == 8
    assert doc["levels"]["1"]["batches"] == 3 and doc["levels"]["3"]["batches"] == 5
    assert profiler.derive(None, doc, "3")["batch_fill_ratio"] == pytest.approx(4 / 32)


@pytest.mark.parametrize("counter,metric,scale", [
    ("instructions", "instructions_per_batch", 1), ("task_clock_ns", "cpu_ms_per_batch", 1e6)])
def test_counters_move_with_the_work_of_a_batch(counter, metric, scale):
    """A heavier model (builtin:mlp, 19 M weights) retires more instructions / takes more CPU
    per batch than builtin:relu on the same rows, as the kernel counts them."""
    if counter not in AVAILABLE:
        pytest.skip(f"{counter}: {MISSING.get(counter)} (perf stat -e {counter} true says the same)")
    per = {}
    for name in ("relu", "mlp"):
        model, prof, ex = _profiled(name)
        try:
            _batches(prof, ex, model, 8, 2)          # first runs: arenas, page faults
            before = prof.doc()
            _batches(prof, ex, model, 8, 10)
            per[name] = profiler.derive(before, prof.doc())[metric]
        finally:
            prof.stop()
    assert per["mlp"] > 20 * per["relu"], per


def test_an_unavailable_counter_is_never_reported_as_zero():
    """Where the PMU is missing (this kind of VM) the hardware metrics are None with the reason,
    not 0; where it is there, they are positive."""
    model, prof, ex = _profiled("relu")
    try:
        _batches(prof, ex, model, 4, 3)
        m = profiler.derive(None, prof.doc())
    finally:
        prof.stop()
    for key, needs in profiler.NEEDS.items():
        if all(n in AVAILABLE for n in needs):
            assert m[key] is not None, key
        else:
            assert m[key] is None and ("not supported" in m["reasons"][key] or "not permitted" in m["reasons"][key])


def test_batches_beside_each_other_are_not_counted_as_their_own():
    """Two instances on one session share ONNX Runtime's pool threads: a batch that ran beside
    another is left out of the counter metrics (never both counting the same work); each compute
    thread (model instance) has its own row."""
    import threading
    model = OnnxModel.load("mlp", "1", builtin_path("mlp"), "cpu", 2, warmup=False)
    prof = profiler.Profiler(model, lambda: 32)
    ex = prof.wrap(BatchExecutor(model))
    try:
        workers = [threading.Thread(target=_batches, args=(prof, ex, model, 16, 6)) for _ in range(2)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        _batches(prof, ex, model, 16, 3)          # alone again
        doc = prof.doc()
    finally:
        prof.stop()
    everything = doc["levels"]["all"]
    assert everything["batches"] == 15
    assert 3 <= everything["counted_batches"] < 15
    threads = [k for k in doc["levels"] if k.startswith("thread:")]
    assert len(threads) == 3 and sum(doc["levels"][k]["batches"] for k in threads) == 15
