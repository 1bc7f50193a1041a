"""benchmarks/bench_split.py end to end with our two configurations (no Triton,
which needs its peer venv): both answer every request, their CPU is counted,
and the table names each server (that the split one splits under this load is
tests/inference/e2e/test_model_split_under_load.py's)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks import bench_peers

pytestmark = pytest.mark.e2e


def test_wide_and_split_answer_every_request(tmp_path):
    out = tmp_path / "split.json"
    p = subprocess.run([sys.executable, "-m", "benchmarks.bench_split", "--servers", "wide,split",
                        "--concurrency", "64", "--seconds", "1", "--rounds", "1", "--json", str(out)],
                       cwd=bench_peers.ROOT, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    result = json.loads(out.read_text())
    for label in ("wide c=64", "split c=64"):
        (run,) = result["rounds"][label]
        assert run["errors"] == 0 and run["rps"] > 0 and run["server_us"] > 0, (label, run)
    table = p.stdout.split("\n")
    assert any(line.split()[:2] == ["64", "split"] for line in table if line.strip())


def test_unknown_server_is_refused_by_name():
    p = subprocess.run([sys.executable, "-m", "benchmarks.bench_split", "--servers", "wide,nine"],
                       cwd=bench_peers.ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--servers: nine" in p.stderr


@pytest.mark.parametrize("args, why", [(["--concurrency", "x"], "--concurrency 'x': comma-separated integers"),
                                       (["--rounds", "0"], "--rounds >= 1"),
                                       (["--concurrency", "0"], "concurrency >= 1")])
def test_bad_arguments_are_refused_in_one_line(args, why):
    p = subprocess.run([sys.executable, "-m", "benchmarks.bench_split", *args],
                       cwd=bench_peers.ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and why in p.stderr and "Traceback" not in p.stderr
