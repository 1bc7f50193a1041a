"""Triton's perf_analyzer (tritonclient 2.50.0's binary) drives `mcpctl serve` over gRPC and
HTTP, and reads our server-side statistics. Skips, saying why, where perf_analyzer is not
installed (`python -m benchmarks perf_analyzer` installs it; harness/perf_analyzer.py)."""
from __future__ import annotations

import pytest

from harness import perf_analyzer
from mcp26.demo.stack.inference_server import InferenceServer

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def pa():
    try:
        return perf_analyzer.locate()
    except perf_analyzer.Unavailable as e:
        pytest.skip(str(e))


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_perf_analyzer_measures_the_server_with_its_statistics(pa, protocol):
    binary, env = pa
    with InferenceServer("builtin:relu", admin=False) as s:
        url = s.grpc if protocol == "grpc" else s.http
        r = perf_analyzer.run(binary, env, "relu", url, protocol, concurrency=2, window_ms=700)
    assert "Server:" in r["output"], r["output"][-1500:]       # it found the statistics extension and RPC
    assert r["rps"] and r["rps"] > 20
    assert r["server_inference_count"] and r["server_inference_count"] >= r["server_execution_count"] > 0
    srv = r["server_request_us"]
    assert srv and srv["total"] >= srv["compute_infer"] > 0
