"""Triton Inference Server as a peer: the `tritonserver` binary PyTriton
(nvidia-pytriton) ships, run directly on a model repository of our own.

That build carries only the python backend, so each ONNX model is served by
a python-backend model.py running onnxruntime (triton_onnx_model.py), behind
Triton's own HTTP/gRPC front ends and dynamic batcher. Running the binary
ourselves, not through PyTriton's Python API, keeps PyTriton's extra proxy
hop (stub -> ZeroMQ -> the user's process) out of Triton's figures.

What it needs here: LD_LIBRARY_PATH to the wheel's bundled libraries and to
the interpreter's libpython (the stub embeds Python), the stub built for this
Python copied beside the backend, and the venv's site-packages on PYTHONPATH.
"""
from __future__ import annotations

import os
import shutil
import sysconfig
import tempfile

from benchmarks.peers.common import (HERE, PeerProcess, PeerUnavailable, ensure_venv, installed_version,
                                     server_metadata, site_packages)

PYTRITON_VERSION = "0.7.0"
REQUIREMENTS = [f"nvidia-pytriton=={PYTRITON_VERSION}", "onnxruntime", "numpy"]

_TYPES = {"FP32": "TYPE_FP32", "FP16": "TYPE_FP16", "FP64": "TYPE_FP64", "INT64": "TYPE_INT64",
          "INT32": "TYPE_INT32", "INT8": "TYPE_INT8", "UINT8": "TYPE_UINT8", "BOOL": "TYPE_BOOL"}


def model_config(name: str, onnx_path: str, inputs: list[dict], outputs: list[dict], max_batch: int,
                 max_queue_delay_us: int, intra_op_threads: int = 0, instances: int = 1) -> str:
    """config.pbtxt for one model. Shapes are given with the batch dimension
    first (-1); Triton's dims leave it out when max_batch_size > 0."""
    def tensors(specs: list[dict]) -> str:
        return ",\n".join(f'  {{ name: "{s["name"]}" data_type: {_TYPES[s["datatype"]]} '
                          f'dims: [ {", ".join(str(d) for d in (s["shape"][1:] if max_batch > 0 else s["shape"]))} ] }}'
                          for s in specs)
    out = [f'name: "{name}"', 'backend: "python"', f"max_batch_size: {max_batch}",
           f"input [\n{tensors(inputs)}\n]", f"output [\n{tensors(outputs)}\n]",
           f"instance_group [ {{ kind: KIND_CPU count: {instances} }} ]",
           f'parameters {{ key: "onnx_path" value: {{ string_value: "{onnx_path}" }} }}',
           f'parameters {{ key: "intra_op_threads" value: {{ string_value: "{intra_op_threads}" }} }}']
    if max_batch > 0:
        out.append(f"dynamic_batching {{ max_queue_delay_microseconds: {max_queue_delay_us} }}")
    return "\n".join(out) + "\n"


class TritonPeer:
    """tritonserver on 127.0.0.1 serving `models` (dicts: name, onnx_path,
    inputs, outputs, max_batch, max_queue_delay_us)."""

    label = "triton"

    def __init__(self, root: str, models: list[dict], http_port: int, grpc_port: int, metrics_port: int,
                 intra_op_threads: int = 0):
        self.venv = ensure_venv(root, "triton", REQUIREMENTS)
        self.http_port, self.grpc_port = http_port, grpc_port
        self.version = f"PyTriton {installed_version(self.venv, 'nvidia_pytriton')}"
        # the instance layout, in the version line: a run compares two of them
        self.layout = "; ".join(
            f"{m['name']}: instance_group count {m.get('instances', 1)}, "
            f"{m.get('intra_op_threads', intra_op_threads) or 'default'} intra-op threads each" for m in models)
        sp = site_packages(self.venv)
        dist = os.path.join(sp, "pytriton", "tritonserver")
        v = sysconfig.get_config_var("py_version_short")
        stub = os.path.join(dist, "python_backend_stubs", v, "triton_python_backend_stub")
        if not os.path.exists(stub):
            raise PeerUnavailable(f"PyTriton {PYTRITON_VERSION} ships no python-backend stub for Python {v}")
        self.dir = tempfile.mkdtemp(prefix="triton-peer-")
        backends = os.path.join(self.dir, "backends")
        shutil.copytree(os.path.join(dist, "backends"), backends)
        shutil.copy(stub, os.path.join(backends, "python", "triton_python_backend_stub"))
        repo = os.path.join(self.dir, "models")
        for m in models:
            os.makedirs(os.path.join(repo, m["name"], "1"))
            shutil.copy(os.path.join(HERE, "triton_onnx_model.py"), os.path.join(repo, m["name"], "1", "model.py"))
            with open(os.path.join(repo, m["name"], "config.pbtxt"), "w") as f:
                f.write(model_config(m["name"], m["onnx_path"], m["inputs"], m["outputs"], m["max_batch"],
                                     m["max_queue_delay_us"], m.get("intra_op_threads", intra_op_threads),
                                     m.get("instances", 1)))
        libs = [os.path.join(sp, "nvidia_pytriton.libs"), sysconfig.get_config_var("LIBDIR")]
        env = {**os.environ,
               "LD_LIBRARY_PATH": os.pathsep.join(libs + [os.environ.get("LD_LIBRARY_PATH", "")]).rstrip(os.pathsep),
               "PATH": os.path.join(self.venv, "bin") + os.pathsep + os.environ.get("PATH", ""),
               "PYTHONPATH": sp}
        argv = [os.path.join(dist, "bin", "tritonserver"), "--model-repository", repo,
                "--backend-directory", backends, "--cache-directory", os.path.join(dist, "caches"),
                "--http-address", "127.0.0.1", "--http-port", str(http_port),
                "--grpc-address", "127.0.0.1", "--grpc-port", str(grpc_port),
                "--metrics-address", "127.0.0.1", "--metrics-port", str(metrics_port), "--allow-metrics", "false",
                "--log-verbose", "0", "--log-info", "false", "--exit-on-error", "true",
                # a shm region name of our own: two runs (or a PyTriton user) never share one
                "--backend-config", f"python,shm-region-prefix-name=mcppeer{os.getpid()}x{http_port}"]
        ready = f"http://127.0.0.1:{http_port}/v2/health/ready"
        self.proc = PeerProcess("tritonserver", argv, ready, os.path.join(self.dir, "tritonserver.log"), env=env)

    def start(self, timeout: float = 120.0) -> "TritonPeer":
        self.proc.start(timeout)
        # the core's own version, from its server metadata (GET /v2)
        meta = server_metadata(f"http://127.0.0.1:{self.http_port}/v2")
        self.version = (f"Triton {meta.get('version', '?')} ({self.version}'s tritonserver, python backend + "
                        f"onnxruntime; {self.layout})")
        return self

    def rest_url(self, model: str) -> str:
        return f"http://127.0.0.1:{self.http_port}/v2/models/{model}"

    def grpc_url(self, model: str) -> str:
        return f"127.0.0.1:{self.grpc_port}/v2/models/{model}"

    def stop(self) -> None:
        self.proc.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
