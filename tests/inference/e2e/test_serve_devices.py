"""The design document's command, `mcpctl serve --model resnet50.mcp26bin --enable-profiler
--device npu:0,gpu:1 --qos-policy latency-critical`: its device part is refused in one line
listing this machine's devices (not a Python exception text), before any model is read;
`--device cpu` serves, and the model's metadata and config say where it runs."""
from __future__ import annotations

import json
import subprocess
import urllib.request

import numpy as np
import pytest

from mcp26.demo.stack.inference_server import InferenceServer
from mcp26.demo.stack.ports import free_port
from mcp26.inference import devices
from mcp26.serving.executables import executable

pytestmark = pytest.mark.e2e


def test_the_documents_command_names_the_missing_device():
    if "npu" in {d.kind for d in devices.devices()}:
        pytest.skip("an NPU is here")
    p = subprocess.run([executable("mcpctl"), "serve", "--model", "resnet50.mcp26bin", "--enable-profiler",
                        "--device", "npu:0,gpu:1", "--qos-policy", "latency-critical",
                        "--http-port", str(free_port()), "--grpc-port", str(free_port())],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr and "invalid literal" not in p.stderr, p.stderr
    here = devices.listing(devices.devices())
    assert p.stderr.strip() == f"mcpctl serve: --device npu:0: no NPU here; devices: {here}", p.stderr


def test_device_cpu_serves_and_reports_where():
    with InferenceServer("builtin:relu", "--device", "cpu", "--qos-policy", "latency-critical") as s:
        with urllib.request.urlopen(f"http://{s.http}/v2/models/relu/config") as r:
            config = json.load(r)
        group = config["instance_group"][0]
        assert group["kind"] == "KIND_CPU"
        assert json.loads(config["parameters"]["placement"]["string_value"]) == [devices.devices()[0].describe()]
        body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 256],
                                       "data": np.linspace(-1, 1, 256).tolist()}]}).encode()
        req = urllib.request.Request(f"http://{s.http}/v2/models/relu/infer", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req) as r:
            out = json.load(r)["outputs"][0]["data"]
        assert min(out) == 0 and max(out) == pytest.approx(1.0)


def test_a_partitioned_model_serves_the_unsplit_answer(tmp_path):
    import onnxruntime as ort
    import tritonclient.http as thttp
    from mcp26.inference.examples.build_repository import build
    path = f"{build(str(tmp_path / 'mm'))}/vision/1/model.onnx"
    x = np.random.default_rng(1).standard_normal((3, 3, 32, 32)).astype(np.float32)
    expected = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"IMAGE": x})[0]
    with InferenceServer(path, "--partition", "stages=2;devices=cpu,cpu;micro=2") as s:
        c = thttp.InferenceServerClient(s.http)
        i = thttp.InferInput("IMAGE", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        assert np.abs(c.infer("model", [i]).as_numpy("EMBEDDING") - expected).max() <= 1e-5
        stages = json.loads(c.get_model_config("model")["parameters"]["placement"]["string_value"])
        assert [st["stage"] for st in stages] == [0, 1] and stages[0]["cut_after"]
