"""benchmarks/bench_peers.py end to end with its quickest peer, Triton
(PyTriton's tritonserver): both servers start in the private namespace, the
load reaches each over REST and gRPC, and the namespace is gone afterwards.
Only when .cache/peers/triton already exists: installing it takes minutes
(`python -m benchmarks peers` does it)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from benchmarks import bench_peers
from benchmarks.peers import common, triton

pytestmark = pytest.mark.e2e


def test_ours_and_triton_answer_every_request_side_by_side(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("bench_peers runs the servers in a network namespace of its own: needs root")
    venv = common.venv_dir(bench_peers.ROOT, "triton")
    if not common.venv_ready(venv, triton.REQUIREMENTS):
        pytest.skip(f"no Triton peer venv at {venv}: `python -m benchmarks peers` installs it (minutes, from PyPI)")
    out = tmp_path / "peers.json"
    p = subprocess.run([sys.executable, "-m", "benchmarks.bench_peers", "--peers", "triton,triton-x2", "--models", "relu",
                        "--concurrency", "1,4", "--seconds", "0.5", "--rounds", "1", "--json", str(out)],
                       cwd=bench_peers.ROOT, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["unavailable"] == {}
    assert "python backend" in result["servers"]["triton"]["relu"]
    # Triton in both of its layouts, each started as what its version line says
    assert "instance_group count 1" in result["servers"]["triton"]["relu"]
    assert "instance_group count 2, 1 intra-op threads" in result["servers"]["triton-x2"]["relu"]
    # ours per protocol: relu over REST as two workers, over gRPC as one
    assert "--workers 2" in result["servers"]["ours"]["relu"] and "--workers 1" in result["servers"]["ours"]["relu"]
    seen = [(pt["protocol"], pt["concurrency"], pt["client"]) for pt in result["points"]]
    assert {s for s in seen if s[2] == "mcp-bench"} == {("rest", 1, "mcp-bench"), ("rest", 4, "mcp-bench"),
                                                      ("grpc", 1, "mcp-bench"), ("grpc", 4, "mcp-bench")}
    # relu gRPC c=1 once more from h2load, where it is installed
    assert [s for s in seen if s[2] != "mcp-bench"] == ([("grpc", 1, "h2load")] if shutil.which("h2load") else [])
    for pt in result["points"]:
        for server in ("ours", "triton", "triton-x2"):
            got = pt["servers"][server]
            assert got["errors"] == 0 and got["rps"] > 0, (server, pt)
    row = re.search(r"^relu\s+grpc\s+4\s.*$", p.stdout, re.M)      # the table's row, with the ratio
    assert row and re.search(r"x\d+\.\d\d", row.group(0)), p.stdout[-1500:]
    created = re.search(r"network namespace (\S+) \(lo only\)", p.stdout)
    assert created, p.stdout[:500]
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    assert created.group(1) not in left
