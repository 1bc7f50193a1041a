"""benchmarks/bench_gemm.py end to end, briefly: every layout runs, and what it
measures behaves as a memory-bound model does (a batch of one row reads all
77 MB of weights for that row, a batch of 64 shares them)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks import bench_peers

pytestmark = pytest.mark.e2e


@pytest.mark.slow      # a ratio of CPU a row between batch sizes
def test_every_layout_runs_and_batching_shares_the_weights(tmp_path):
    out = tmp_path / "gemm.json"
    p = subprocess.run([sys.executable, "-m", "benchmarks.bench_gemm", "--seconds", "0.3", "--json", str(out)],
                       cwd=bench_peers.ROOT, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    result = json.loads(out.read_text())
    rows = {r["label"]: r for r in result["rows"]}
    assert len(rows) == 9 and all(r["rows_per_s"] > 0 for r in rows.values())
    assert rows["1 thread, batch 1"]["cpu_us_per_row"] > 3 * rows["1 thread, batch 64"]["cpu_us_per_row"]
    assert round(result["mflop_per_row"], 1) == 38.2
    assert "1 x 2 threads, batch 64 + front end, SCHED_IDLE" in p.stdout


def test_seconds_must_be_positive():
    p = subprocess.run([sys.executable, "-m", "benchmarks.bench_gemm", "--seconds", "0"],
                       cwd=bench_peers.ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--seconds > 0" in p.stderr
