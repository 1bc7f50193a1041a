"""`mcpctl serve --instances N` (Triton's instance_group count) end to end:
the server says how many instances it runs where Triton users look
(ModelConfig, over both protocols), each gets its share of the cores, answers
under concurrent load are those of the model, and what cannot be run by
several instances is refused at start-up."""
from __future__ import annotations

import concurrent.futures
import json
import os
import urllib.request

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp

from mcp26.demo.stack.inference_server import InferenceServer
from mcp26.inference import builtin_models

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server():
    with InferenceServer("builtin:mlp", "--instances", "2") as s:
        yield s


def test_config_and_status_say_how_many_instances_run(server):
    assert tgrpc.InferenceServerClient(server.grpc).get_model_config("mlp").config.instance_group[0].count == 2
    assert thttp.InferenceServerClient(server.http).get_model_config("mlp")["instance_group"][0]["count"] == 2
    with urllib.request.urlopen(f"http://127.0.0.1:{server.admin_port}/admin/status", timeout=10) as r:
        status = json.load(r)
    model = next(m for m in status["models"] if m["name"] == "mlp")
    assert model["instances"] == 2
    assert model["intra_op_threads"] == max(1, (os.cpu_count() or 1) // 2)   # each its share of the cores


def test_concurrent_answers_are_the_models_own(server):
    session = ort.InferenceSession(builtin_models.builtin_path("mlp"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    rows = [rng.standard_normal((1, 64)).astype(np.float32) for _ in range(48)]
    want = [session.run(None, {"INPUT0": x})[0] for x in rows]
    client = tgrpc.InferenceServerClient(server.grpc)     # thread-safe (the HTTP client is gevent's)

    def infer(x):
        inp = tgrpc.InferInput("INPUT0", [1, 64], "FP32")
        inp.set_data_from_numpy(x)
        return client.infer("mlp", [inp]).as_numpy("OUTPUT0")

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        got = list(pool.map(infer, rows))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("model, flags, why", [
    ("builtin:mlp", ["--instances", "0"], "--instances must be at least 1"),
    ("builtin:mlp", ["--instances", "100000"], "--instances must be at most 64"),
    # its KV cache is advanced by one run at a time
    ("builtin:tiny-decoder", ["--instances", "2"], "--instances > 1 cannot serve a decoder model"),
])
def test_instances_refuse_what_cannot_run(model, flags, why):
    server = InferenceServer(model, *flags)
    with pytest.raises(RuntimeError, match="exited with 2"):
        server.start(timeout=60)
    assert why in server.log_tail()
    server.stop()
