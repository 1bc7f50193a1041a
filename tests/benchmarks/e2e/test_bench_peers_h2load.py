"""bench_peers' C-client point: h2load sends a serialized ModelInferRequest to
`mcpctl serve`'s gRPC port as a gRPC call, and each call it counts reached the
model (the server's own statistics say so); a call the server refuses is an
error, not a figure."""
from __future__ import annotations

import json
import shutil
import urllib.request

import pytest

from benchmarks import bench_peers

pytestmark = pytest.mark.e2e


def inference_count(server) -> int:
    with urllib.request.urlopen(server.rest_url("relu") + "/stats", timeout=10) as r:
        return json.load(r)["model_stats"][0]["inference_count"]


def test_h2load_grpc_calls_reach_the_model_and_refusals_are_errors():
    if not shutil.which("h2load"):
        pytest.skip("h2load (Debian nghttp2-client, `make deps`) is not installed")
    model = bench_peers.model_spec("relu", bench_peers.model_files()["relu"])
    server = bench_peers.make_server("ours", model, "grpc").start()
    try:
        authority = server.grpc_url("relu").split("/")[0]
        before = inference_count(server)
        got = bench_peers.run_h2load_grpc(authority, bench_peers.grpc_message(model), 1.0)
        assert got["errors"] == 0 and got["rps"] > 100 and got["p50_ms"] > 0, got
        # every call h2load counted was computed (its warm-up second adds more)
        assert inference_count(server) - before >= got["calls"] > 0
        refused = bench_peers.run_h2load_grpc(authority, bench_peers.grpc_message({"name": "absent"}), 1.0)
        assert refused["rps"] == 0 and refused["errors"] >= 1
        assert "NOT_FOUND" in refused["error_classes"]["grpc"], refused
    finally:
        server.stop()
