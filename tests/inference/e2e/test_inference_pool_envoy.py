"""`mcpctl serve --replicas 2 --envoy-port P`: the real Envoy in front of two replicas; REST and gRPC (tritonclient)
reach both replicas, balanced by client-side weighted round robin on the ORCA
reports the replicas send; timing and ORCA headers come through Envoy."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp

from mcp26.inference.builtin_models import builtin_path
from mcp26.inference.load_report import parse_text_report
from mcp26.inference.envoy_bootstrap import replica_ports
from mcp26.mesh import headers as H
from mcp26.demo.stack.inference_server import read_pool_events, requests_served
from mcp26.demo.stack.ports import free_port, free_port_block

pytestmark = pytest.mark.e2e


class PoolEnvoy:
    """The Envoy `mcpctl serve --envoy-port` started, seen through its admin port."""

    def __init__(self, admin_port: int):
        self.admin_port = admin_port

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, ""

    def stats(self, pattern: str) -> dict:
        doc = json.loads(self.get(f"/stats?format=json&filter={pattern}")[1])
        return {s["name"]: s["value"] for s in doc.get("stats", []) if "value" in s}


@pytest.fixture(scope="module")
def pool():
    base, listen, envoy_admin = free_port_block(4), free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mcp26.mesh.cli", "serve", "--model", "builtin:mlp", "--replicas", "2",
                             "--http-port", str(base), "--grpc-port", str(base + 1),
                             "--envoy-port", str(listen), "--envoy-admin-port", str(envoy_admin)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 90
        ready, envoy_event = read_pool_events(proc, replicas=2)
        assert len(ready) == 2 and envoy_event["port"] == listen
        http_ports = sorted(r["http_port"] for r in ready)
        grpc_ports = sorted(r["grpc_port"] for r in ready)
        # replica i on base + 2i (the documented port layout)
        assert [{"http": h, "grpc": g} for h, g in zip(http_ports, grpc_ports)] == replica_ports(base, base + 1, 2) \
            == envoy_event["replicas"] == [{"http": base, "grpc": base + 1}, {"http": base + 2, "grpc": base + 3}]
        envoy = PoolEnvoy(envoy_admin)
        while envoy.get("/ready")[0] != 200:
            assert time.monotonic() < deadline, "envoy not ready"
            time.sleep(0.1)
        yield {"envoy": envoy, "listen": listen, "http_ports": http_ports, "grpc_ports": grpc_ports}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def test_rest_and_grpc_through_envoy_reach_both_replicas(pool):
    local = ort.InferenceSession(builtin_path("mlp"), providers=["CPUExecutionProvider"])
    addr = f"127.0.0.1:{pool['listen']}"
    http = thttp.InferenceServerClient(addr)
    grpc_client = tgrpc.InferenceServerClient(addr)
    for i in range(40):
        x = np.random.default_rng(i).standard_normal((1, 64)).astype(np.float32)
        hin = thttp.InferInput("INPUT0", [1, 64], "FP32")
        hin.set_data_from_numpy(x)
        np.testing.assert_allclose(http.infer("mlp", [hin]).as_numpy("OUTPUT0"),
                                   local.run(None, {"INPUT0": x})[0], rtol=1e-5, atol=1e-6)
        gin = tgrpc.InferInput("INPUT0", [1, 64], "FP32")
        gin.set_data_from_numpy(x)
        np.testing.assert_allclose(grpc_client.infer("mlp", [gin]).as_numpy("OUTPUT0"),
                                   local.run(None, {"INPUT0": x})[0], rtol=1e-5, atol=1e-6)
    for protocol in ("http", "grpc"):
        counts = [requests_served(p, protocol) for p in pool["http_ports"]]
        assert all(c >= 5 for c in counts), (protocol, counts)
    stats = pool["envoy"].stats("upstream_rq_2xx")
    assert stats.get("cluster.inference-pool-http.upstream_rq_2xx", 0) >= 40
    assert stats.get("cluster.inference-pool-grpc.upstream_rq_2xx", 0) >= 40


def test_timing_and_orca_headers_pass_through_envoy(pool):
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 64], "datatype": "FP32", "data": [0.1] * 64}]})
    req = urllib.request.Request(f"http://127.0.0.1:{pool['listen']}/v2/models/mlp/infer", data=body.encode(),
                                 method="POST", headers={H.QOS_CLASS: "interactive"})
    with urllib.request.urlopen(req, timeout=30) as r:
        headers = {k.lower(): v for k, v in r.headers.items()}
        doc = json.loads(r.read())
    assert int(headers[H.QUEUE_TIME_US]) == doc["parameters"]["queue_time_us"]
    assert doc["parameters"]["priority_level"] == 2
    assert "application_utilization" in parse_text_report(headers[H.ORCA_LOAD_REPORT])
    # Envoy took the ORCA-driven balancer as configured
    dump = pool["envoy"].get("/config_dump")[1]
    assert "client_side_weighted_round_robin" in dump
