"""KServe's ModelServer as a peer (kserve_onnx_server.py in .cache/peers/kserve).

Its REST and gRPC servers bind 0.0.0.0 / [::] whatever we ask, so start()
refuses to run it in the host's network namespace: the benchmark enters a
private one (only `lo` up) first.
"""
from __future__ import annotations

import os
import shutil
import tempfile

from benchmarks.peers.common import (HERE, PeerProcess, PeerUnavailable, ensure_venv, installed_version,
                                     server_metadata)

KSERVE_VERSION = "0.21.0"
REQUIREMENTS = [f"kserve=={KSERVE_VERSION}", "onnxruntime", "numpy"]


def interfaces(net_dev: str) -> list[str]:
    """Interface names in a /proc/.../net/dev listing."""
    return [line.split(":")[0].strip() for line in net_dev.splitlines()[2:] if ":" in line]


def in_private_netns() -> bool:
    """True when this thread's network namespace has no interface but `lo`:
    then 0.0.0.0 reaches nothing beyond this machine's loopback."""
    try:
        with open("/proc/thread-self/net/dev") as f:
            return interfaces(f.read()) == ["lo"]
    except OSError:
        return False


class KServePeer:
    label = "kserve"

    def __init__(self, root: str, models: list[dict], http_port: int, grpc_port: int, intra_op_threads: int = 0,
                 workers: int = 1):
        self.venv = ensure_venv(root, "kserve", REQUIREMENTS)
        self.http_port, self.grpc_port = http_port, grpc_port
        self.version = f"KServe ModelServer {installed_version(self.venv, 'kserve')} (onnxruntime, no server batching)"
        self.dir = tempfile.mkdtemp(prefix="kserve-peer-")
        # run from a copy: from benchmarks/peers/ this module would shadow the kserve package
        script = shutil.copy(os.path.join(HERE, "kserve_onnx_server.py"), self.dir)
        argv = [os.path.join(self.venv, "bin", "python"), script,
                "--http_port", str(http_port), "--grpc_port", str(grpc_port), "--workers", str(workers),
                "--intra_op_threads", str(intra_op_threads), "--configure_logging", "false"]
        for m in models:
            argv += ["--model", f"{m['name']}={m['onnx_path']}"]
        ready = f"http://127.0.0.1:{http_port}/v2/models/{models[0]['name']}/ready"
        self.proc = PeerProcess("kserve", argv, ready, os.path.join(self.dir, "kserve.log"), cwd=self.dir)

    def start(self, timeout: float = 120.0) -> "KServePeer":
        if not in_private_netns():
            raise PeerUnavailable("KServe's ModelServer binds 0.0.0.0: start it only inside a private network namespace")
        self.proc.start(timeout)
        meta = server_metadata(f"http://127.0.0.1:{self.http_port}/v2")
        if meta.get("version"):
            self.version += f", server metadata {meta.get('name')} {meta['version']}"
        return self

    def rest_url(self, model: str) -> str:
        return f"http://127.0.0.1:{self.http_port}/v2/models/{model}"

    def grpc_url(self, model: str) -> str:
        return f"127.0.0.1:{self.grpc_port}/v2/models/{model}"

    def stop(self) -> None:
        self.proc.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
