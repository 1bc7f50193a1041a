"""Start a real `mcpctl serve` for a benchmark or an end-to-end test."""
from __future__ import annotations

import os
import subprocess
import tempfile
import time
import urllib.request

from mcp26.serving.executables import executable


class ServeProcess:
    """`mcpctl serve --model builtin:NAME ...` on 127.0.0.1, ready when its
    REST /v2/health/ready answers 200."""

    def __init__(self, model: str, http_port: int, grpc_port: int, *extra: str):
        self.model, self.http_port, self.grpc_port = model, http_port, grpc_port
        self.args = [executable("mcpctl"), "serve", "--model", model, "--http-port", str(http_port),
                     "--grpc-port", str(grpc_port), *extra]
        self.log = tempfile.NamedTemporaryFile(prefix="mcpctl-serve-", suffix=".log", delete=False)
        self.proc: subprocess.Popen | None = None

    @property
    def name(self) -> str:
        return self.model.removeprefix("builtin:")

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/v2/models/{self.name}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}/v2/models/{self.name}"

    def start(self, timeout: float = 60.0) -> "ServeProcess":
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{' '.join(self.args)} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/v2/health/ready", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"{' '.join(self.args)} not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def log_tail(self, n: int = 3000) -> str:
        try:
            with open(self.log.name) as f:
                return f.read()[-n:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self.log.close()
        try:
            os.unlink(self.log.name)
        except OSError:
            pass

    def __enter__(self) -> "ServeProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
