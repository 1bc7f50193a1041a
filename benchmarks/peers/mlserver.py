"""The peer server of the side-by-side benchmark: MLServer (Seldon) with a
tiny onnxruntime runtime, serving the same ONNX file as `mcpctl serve`.

MLServer's dependencies (FastAPI, pydantic, its own grpcio pins) may clash
with ours, so it lives in its own venv under .cache/peers/mlserver, installed
on first use. Anything that stops it from running here raises PeerUnavailable
with the reason, and the benchmark reports that instead of a number.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request

from benchmarks.peers.common import HERE, PeerUnavailable, ensure_venv  # noqa: F401 - PeerUnavailable is re-exported

MLSERVER_VERSION = "1.7.1"
REQUIREMENTS = [f"mlserver=={MLSERVER_VERSION}",
                # uvloop 0.22 broke MLServer 1.7.1's worker start (get_event_loop in a new process)
                "uvloop<0.22", "onnxruntime", "numpy"]


def peer_venv(root: str) -> str:
    """.cache/peers/mlserver with MLServer in it; created (from PyPI) if missing."""
    return ensure_venv(root, "mlserver", REQUIREMENTS)


class MLServerPeer:
    """`mlserver start` on 127.0.0.1 with one model, `name`, from `onnx_path`.

    `max_batch_size`/`max_batch_time` turn on MLServer's adaptive batching,
    its counterpart of our dynamic batcher; `parallel_workers` is MLServer's
    setting of that name (0: no inference worker processes)."""

    label = "mlserver"

    def __init__(self, root: str, name: str, onnx_path: str, inputs: list[dict], outputs: list[dict],
                 http_port: int, grpc_port: int, metrics_port: int,
                 max_batch_size: int = 0, max_batch_time_s: float = 0.0, intra_op_threads: int = 0,
                 parallel_workers: int = 1):
        self.venv = peer_venv(root)
        self.http_port, self.grpc_port = http_port, grpc_port
        self.version = f"MLServer {MLSERVER_VERSION} (onnxruntime runtime" + (
            f", adaptive batching {max_batch_size} / {max_batch_time_s * 1e6:.0f} us" if max_batch_size > 1 else "") + (
            f", parallel_workers {parallel_workers})")
        self.dir = tempfile.mkdtemp(prefix="mlserver-peer-")
        model_dir = os.path.join(self.dir, name)
        os.makedirs(model_dir)
        shutil.copy(os.path.join(HERE, "mlserver_onnx_runtime.py"), model_dir)
        settings = {"host": "127.0.0.1", "http_port": http_port, "grpc_port": grpc_port,
                    "metrics_port": metrics_port, "debug": False,
                    # 0: inference on the server's own event loop; N: in N worker processes
                    "parallel_workers": parallel_workers,
                    "model_repository_root": self.dir}
        model = {"name": name, "implementation": "mlserver_onnx_runtime.OnnxRuntime",
                 "inputs": inputs, "outputs": outputs,
                 "parameters": {"uri": onnx_path, "extra": {"intra_op_threads": intra_op_threads}}}
        if max_batch_size > 1:
            model.update(max_batch_size=max_batch_size, max_batch_time=max_batch_time_s)
        with open(os.path.join(self.dir, "settings.json"), "w") as f:
            json.dump(settings, f)
        with open(os.path.join(model_dir, "model-settings.json"), "w") as f:
            json.dump(model, f)
        self.name = name
        self.log_path = os.path.join(self.dir, "mlserver.log")
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 90.0) -> "MLServerPeer":
        env = {**os.environ, "PATH": os.path.join(self.venv, "bin") + os.pathsep + os.environ.get("PATH", "")}
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([os.path.join(self.venv, "bin", "mlserver"), "start", self.dir],
                                         stdout=log, stderr=subprocess.STDOUT, cwd=self.dir, env=env,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.http_port}/v2/models/{self.name}/ready"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PeerUnavailable(f"mlserver exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise PeerUnavailable(f"mlserver not ready after {timeout:.0f}s: {self.log_tail()}")

    def rest_url(self, model: str) -> str:
        return f"http://127.0.0.1:{self.http_port}/v2/models/{model}"

    def grpc_url(self, model: str) -> str:
        return f"127.0.0.1:{self.grpc_port}/v2/models/{model}"

    def log_tail(self, n: int = 2000) -> str:
        try:
            with open(self.log_path) as f:
                return f.read()[-n:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            # its own session: the parallel-inference worker goes with it
            try:
                os.killpg(self.proc.pid, 15)
                self.proc.wait(15)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
