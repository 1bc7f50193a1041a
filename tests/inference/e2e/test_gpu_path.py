"""The GPU path (TensorRT > CUDA > CPU, I/O binding, CUDA graphs, the TensorRT engine cache):
these run only where onnxruntime offers a GPU provider and nvidia-smi finds a GPU; elsewhere
they skip, saying so. The whole check with its table is benchmarks/gpu_check.sh."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as tgrpc

from mcp26.demo.stack.inference_server import InferenceServer
from mcp26.inference.builtin_models import builtin_path
from mcp26.inference.runtime import OnnxModel

pytestmark = pytest.mark.e2e


def _gpu_reason() -> str | None:
    if not shutil.which("nvidia-smi") or subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode != 0:
        return "no GPU: nvidia-smi finds none"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return (f"no GPU provider in this onnxruntime ({', '.join(ort.get_available_providers())}): "
                "pip uninstall onnxruntime; pip install '.[gpu]'")
    return None


pytestmark = [pytestmark, pytest.mark.skipif(_gpu_reason() is not None, reason=_gpu_reason() or "")]


def _cpu_answer(x):
    return ort.InferenceSession(builtin_path("mlp"), providers=["CPUExecutionProvider"]).run(["OUTPUT0"], {"INPUT0": x})[0]


def test_gpu_session_with_io_binding_answers_as_the_cpu_does():
    model = OnnxModel.load("mlp", "1", builtin_path("mlp"), "cuda:0")
    assert model.provider in ("CUDAExecutionProvider", "TensorrtExecutionProvider")
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    got = model.run({"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]          # run_bound on a GPU provider
    assert np.allclose(got, _cpu_answer(x), rtol=1e-2, atol=1e-3)


def test_cuda_graph_replay_answers_as_the_cpu_does():
    session = ort.InferenceSession(builtin_path("mlp"), providers=[("CUDAExecutionProvider", {"enable_cuda_graph": "1"})])
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    x_dev = ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0)
    y_dev = ort.OrtValue.ortvalue_from_shape_and_type([4, 16], np.float32, "cuda", 0)
    binding = session.io_binding()
    binding.bind_ortvalue_input("INPUT0", x_dev)
    binding.bind_ortvalue_output("OUTPUT0", y_dev)
    session.run_with_iobinding(binding)           # capture
    x2 = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    x_dev.update_inplace(x2)
    session.run_with_iobinding(binding)           # replay on the new input
    assert np.allclose(y_dev.numpy(), _cpu_answer(x2), rtol=1e-2, atol=1e-3)


def test_served_on_the_gpu():
    with InferenceServer("builtin:mlp", "--device", "auto", admin=False) as s:
        assert s.ready["provider"] in ("CUDAExecutionProvider", "TensorrtExecutionProvider")
        client = tgrpc.InferenceServerClient(s.grpc)
        x = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
        inp = tgrpc.InferInput("INPUT0", [2, 64], "FP32")
        inp.set_data_from_numpy(x)
        got = client.infer("mlp", [inp]).as_numpy("OUTPUT0")
    assert np.allclose(got, _cpu_answer(x), rtol=1e-2, atol=1e-3)
