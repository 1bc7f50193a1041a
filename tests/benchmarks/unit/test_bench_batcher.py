"""benchmarks/bench_batcher.py, briefly: every path runs beside another revision's batcher, what it
measures behaves as the batcher does (a flush of 16 costs each request less than a flush of 1),
and a revision without a batcher.py is refused in one line."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks import bench_batcher

pytestmark = pytest.mark.slow


def test_every_path_runs_beside_another_revision_and_a_turn_shares_the_flush(tmp_path):
    out = tmp_path / "batcher.json"
    p = subprocess.run([sys.executable, "-m", "benchmarks.bench_batcher", "--rounds", "1", "--scale", "0.2",
                        "--against", "HEAD", "--json", str(out)],
                       cwd=bench_batcher.ROOT, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    us = json.loads(out.read_text())["us_per_request"]
    assert set(us) == {f"{path} {tree}" for path in bench_batcher.PATHS for tree in ("this tree", "HEAD")}
    assert all(v[0] > 0 for v in us.values())
    assert us["turn16 this tree"][0] < us["turn1 this tree"][0]
    assert "lone    cpu" in p.stdout and "ratio" in p.stdout


def test_a_revision_without_a_batcher_is_refused_in_one_line():
    p = subprocess.run([sys.executable, "-m", "benchmarks.bench_batcher", "--rounds", "1", "--against", "no-such-rev"],
                       cwd=bench_batcher.ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert p.stderr.strip().startswith("--against no-such-rev: no inference-backend/batcher.py there")
