"""benchmarks/bench_instances.py end to end with our two configurations (no
Triton, which needs its peer venv): both servers answer every request and the
table names each point."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks import bench_peers

pytestmark = pytest.mark.e2e


def test_one_and_two_instances_answer_every_request(tmp_path):
    out = tmp_path / "instances.json"
    p = subprocess.run([sys.executable, "-m", "benchmarks.bench_instances", "--configs", "ours 1x2,ours 2x1",
                        "--protocols", "rest,grpc", "--concurrency", "4", "--seconds", "0.5", "--rounds", "1",
                        "--json", str(out)], cwd=bench_peers.ROOT, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    result = json.loads(out.read_text())
    assert set(result["points"]) == {"rest c=4", "grpc c=4"}
    for point in result["points"].values():
        for label in ("ours 1x2", "ours 2x1"):
            cell = point[label]
            assert cell["errors"] == 0 and cell["rps"] > 0, (label, cell)
    assert "rest c=4" in p.stdout and "2x1 / 1x2" in p.stdout


def test_unknown_configuration_is_refused_by_name():
    p = subprocess.run([sys.executable, "-m", "benchmarks.bench_instances", "--configs", "ours 9x9"],
                       cwd=bench_peers.ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "unknown --configs ours 9x9" in p.stderr
