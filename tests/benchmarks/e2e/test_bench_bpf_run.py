"""benchmarks/bench_bpf.py end to end with small counts: every per-packet case is timed by
the kernel and every throughput case moved bytes over the veth pair. (It had been broken for
days, a `ROOT =` line pasted into the sender's script, and nothing ran it.)"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks import bench_peers
from harness.bpf_env import require_bpf

pytestmark = pytest.mark.e2e


def test_bpf_benchmark_runs_and_reports_every_case(tmp_path):
    require_bpf()
    out = tmp_path / "bpf.json"
    env = {**os.environ, "BPF_BENCH_REPEAT": "1000", "BPF_BENCH_FLOWS": "200", "BPF_BENCH_SECONDS": "0.2",
           "BPF_BENCH_ROUNDS": "1", "BPF_BENCH_OUT": str(out)}
    p = subprocess.run([sys.executable, "-m", "benchmarks.bench_bpf"], cwd=bench_peers.ROOT, env=env,
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    result = json.loads(out.read_text())
    cases = {r["case"] for r in result["ns_per_packet"]}
    assert "empty program" in cases and "ALPN: parse ClientHello (OpenSSL, h2)" in cases
    assert all(r["ns_per_packet"] > 0 for r in result["ns_per_packet"])
    tput = result["veth_throughput"]
    assert {(r["case"], r["write_size"]) for r in tput} == {
        (c, s) for c in ("no program", "marker (every packet rewritten)", "marker + ALPN + sampler")
        for s in (65536, 1024)}
    assert all(r["gbit_per_s"] > 0 for r in tput)
    assert "veth TCP throughput" in p.stdout
