"""Triton's ModelConfig, ModelStatistics and repository RPCs (gRPC and HTTP) against a live
`mcpctl serve`, with the real tritonclient: the values after a known number of inferences."""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from mcp26.demo.stack.inference_server import InferenceServer

pytestmark = pytest.mark.e2e
POLICY = ("--qos-policy", "balanced", "--max-batch", "16", "--max-queue-delay-us", "1500")


@pytest.fixture(scope="module")
def server():
    with InferenceServer("builtin:relu", *POLICY, "--model-control-mode", "explicit") as s:
        yield s


def _input(module, rows: int):
    x = module.InferInput("INPUT0", [rows, 256], "FP32")
    x.set_data_from_numpy(np.linspace(-1, 1, rows * 256, dtype=np.float32).reshape(rows, 256))
    return x


def _grpc_stats(client) -> dict:
    return client.get_inference_statistics("relu", as_json=True)["model_stats"][0]


def test_config_describes_the_model_and_its_batcher(server):
    g = tgrpc.InferenceServerClient(server.grpc)
    h = thttp.InferenceServerClient(server.http)
    cfg = g.get_model_config("relu").config            # the protobuf message, as perf_analyzer reads it
    assert cfg.name == "relu" and cfg.platform == "onnxruntime_onnx" and cfg.max_batch_size == 16
    assert [(i.name, i.data_type, list(i.dims)) for i in cfg.input] == [("INPUT0", 11, [256])]   # TYPE_FP32
    assert [(o.name, list(o.dims)) for o in cfg.output] == [("OUTPUT0", [256])]
    db = cfg.dynamic_batching
    assert list(db.preferred_batch_size) == [8, 16]      # balanced's 8, 16, 32 within --max-batch 16
    assert db.max_queue_delay_microseconds == 1500
    assert db.priority_levels == 4 and db.default_priority_level == 3
    level4 = db.priority_queue_policy[4]                 # balanced: batch class delayed after 1 s, 1024 deep
    assert level4.timeout_action == 1 and level4.default_timeout_microseconds == 1_000_000 \
        and level4.max_queue_size == 1024                # DELAY
    assert cfg.instance_group[0].kind == 2 and cfg.instance_group[0].count == 1      # KIND_CPU
    doc = h.get_model_config("relu")
    assert doc["max_batch_size"] == 16 and doc["input"][0]["data_type"] == "TYPE_FP32"
    assert doc["dynamic_batching"]["priority_queue_policy"]["4"]["timeout_action"] == "DELAY"
    with pytest.raises(InferenceServerException, match="unknown model"):
        g.get_model_config("no-such-model")


def test_statistics_count_what_ran(server):
    g = tgrpc.InferenceServerClient(server.grpc)
    h = thttp.InferenceServerClient(server.http)
    before = _grpc_stats(g)
    base_inf = int(before.get("inference_count", 0))
    base_exec = int(before.get("execution_count", 0))
    base_ok = int(before["inference_stats"].get("success", {}).get("count", 0))
    t0 = time.time()
    for _ in range(5):                      # one at a time: 5 runs of 2 rows each, per protocol
        g.infer("relu", [_input(tgrpc, 2)])
        h.infer("relu", [_input(thttp, 2)])
    with pytest.raises(InferenceServerException):       # wrong width: refused, counted as a failure
        bad = tgrpc.InferInput("INPUT0", [1, 3], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 3), np.float32))
        g.infer("relu", [bad])
    s = _grpc_stats(g)
    st = s["inference_stats"]
    assert int(s["inference_count"]) == base_inf + 20             # rows, not requests
    assert int(s["execution_count"]) == base_exec + 10
    assert int(st["success"]["count"]) == base_ok + 10
    assert int(st["fail"]["count"]) >= 1
    for key in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert int(st[key]["count"]) == base_ok + 10
    assert int(st["success"]["ns"]) > int(st["compute_infer"]["ns"]) > 0
    by_size = {int(b["batch_size"]): b for b in s["batch_stats"]}
    assert int(by_size[2]["compute_infer"]["count"]) >= 10
    assert abs(int(s["last_inference"]) / 1000 - t0) < 60
    doc = h.get_inference_statistics("relu")["model_stats"][0]    # HTTP: the same numbers, JSON numbers
    assert doc["inference_count"] == int(s["inference_count"]) and doc["execution_count"] == int(s["execution_count"])
    assert h.get_inference_statistics()["model_stats"][0]["name"] == "relu"      # all models


def test_repository_index_unload_and_load(server):
    g = tgrpc.InferenceServerClient(server.grpc)
    h = thttp.InferenceServerClient(server.http)
    assert g.get_model_repository_index(as_json=True)["models"] == [{"name": "relu", "version": "1", "state": "READY"}]
    g.unload_model("relu")
    try:
        assert not g.is_model_ready("relu") and not h.is_model_ready("relu")
        assert h.get_model_repository_index() == [
            {"name": "relu", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}]
        with pytest.raises(InferenceServerException, match="unloaded"):
            g.infer("relu", [_input(tgrpc, 1)])
        assert g.get_model_config("relu").config.name == "relu"     # still known
    finally:
        h.load_model("relu")
    assert g.is_model_ready("relu")
    assert g.infer("relu", [_input(tgrpc, 1)]).as_numpy("OUTPUT0").shape == (1, 256)
    with pytest.raises(InferenceServerException, match="unknown model"):
        g.load_model("no-such-model")
    with pytest.raises(InferenceServerException, match="not supported"):
        h.load_model("relu", config=json.dumps({"max_batch_size": 4}))


def test_load_and_unload_are_refused_without_explicit_model_control():
    with InferenceServer("builtin:relu", admin=False) as s:
        g = tgrpc.InferenceServerClient(s.grpc)
        with pytest.raises(InferenceServerException, match="model control mode is none"):
            g.unload_model("relu")
        req = urllib.request.Request(f"http://{s.http}/v2/repository/models/relu/unload", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=5)
        assert e.value.code == 400
        assert g.is_model_ready("relu")
