"""The batching benchmark's method: throughput of each server within a common
p99 bound, the larger of the two servers' p99 at their own peak."""
from __future__ import annotations

from benchmarks.bench_inference import compare_at_p99


def pt(c, rps, p99, errors=0):
    return {"concurrency": c, "rps": rps, "p99_ms": p99, "p50_ms": p99 / 2, "errors": errors}


def test_each_server_gets_its_best_throughput_within_the_larger_peak_p99():
    flat = [pt(1, 300, 4), pt(4, 420, 12), pt(16, 400, 60)]            # peak 420 at p99 12
    dyn = [pt(1, 200, 8), pt(16, 1200, 30), pt(64, 1500, 90)]           # peak 1500 at p99 90
    out = compare_at_p99(dyn, flat)
    assert out["common_bound"]["slo_p99_ms"] == 90
    assert out["common_bound"]["batched"]["rps"] == 1500
    assert out["common_bound"]["unbatched"]["rps"] == 420             # its peak, not its c=16 point
    assert out["ratio"] == round(1500 / 420, 2)
    # the tighter bound (12 ms) leaves the batched server only its c=1 point
    assert out["tight_bound"]["batched"]["rps"] == 200 and out["tight_bound"]["ratio"] == round(200 / 420, 2)


def test_points_with_errors_do_not_count_and_no_point_means_no_ratio():
    flat = [pt(1, 300, 50)]
    dyn = [pt(1, 100, 10), pt(8, 5000, 20, errors=3)]                   # the fast point failed requests
    out = compare_at_p99(dyn, flat)
    assert out["common_bound"]["batched"]["rps"] == 100
    # the peak that sets a bound is the best error-free one: 100/s at p99 10 ms
    assert out["tight_bound"]["slo_p99_ms"] == 10 and out["tight_bound"]["unbatched"] is None
    assert out["tight_bound"]["ratio"] is None
