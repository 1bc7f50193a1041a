"""Run a real `mcpctl serve` subprocess for a test, on free ports."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.processes import stop_process


class InferenceServer:
    """`mcpctl serve --model MODEL ...` with http/grpc/admin on free ports (MODEL "repository:DIR":
    `--model-repository DIR`).

    Waits for the server's `{"event": "ready"}` line; stderr goes to a log
    file whose tail is shown when start-up fails. Always stopped in __exit__.
    """

    def __init__(self, model: str = "builtin:mlp", *args: str, admin: bool = True, env: dict | None = None):
        self.http_port, self.grpc_port = free_port(), free_port()
        self.admin_port = free_port() if admin else None
        self.model = model
        source = ["--model-repository", model[len("repository:"):]] if model.startswith("repository:") \
            else ["--model", model]
        self.args = [sys.executable, "-m", "mcp26.mesh.cli", "serve", *source,
                     "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port), *args]
        if self.admin_port:
            self.args += ["--admin-port", str(self.admin_port)]
        if "--drain-seconds" not in args:   # tests stop at once unless they test the drain
            self.args += ["--drain-seconds", "0"]
        self.env = dict(os.environ, **(env or {}))
        self.log = tempfile.NamedTemporaryFile(prefix="mcp-serve-", suffix=".log", delete=False)
        self.proc: subprocess.Popen | None = None
        self.ready: dict = {}

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self, timeout: float = 90.0) -> "InferenceServer":
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self.log, env=self.env, text=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"mcpctl serve exited with {self.proc.returncode}:\n{self.log_tail()}")
                continue
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if doc.get("event") == "ready":
                self.ready = doc
                return self
        self.stop()
        raise TimeoutError(f"mcpctl serve not ready after {timeout}s:\n{self.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        with open(self.log.name, errors="replace") as fh:
            return fh.read()[-n:]

    def admin(self, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.admin_port}{path}", data=data,
                                     method="POST" if data is not None else "GET",
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{self.http}/metrics", timeout=10) as r:
            return r.read().decode()

    def stop(self) -> None:
        stop_process(self.proc, grace=15)
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()

    def __enter__(self) -> "InferenceServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def requests_served(http_port: int, protocol: str | None = None) -> float:
    """Infer requests a server answered OK (its mcp_inference_requests_total on /metrics),
    of one protocol ("http" or "grpc") or all: which process served a request."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10).read().decode()
    total = 0.0
    for m in re.finditer(r'^mcp_inference_requests_total\{([^}]*)\} ([0-9.e+]+)$', text, re.M):
        if (protocol is None or f'protocol="{protocol}"' in m.group(1)) and 'code="OK"' in m.group(1):
            total += float(m.group(2))
    return total


def read_pool_events(proc: subprocess.Popen, replicas: int, timeout: float = 90.0) -> tuple[list[dict], dict]:
    """From `mcpctl serve --replicas N --envoy-port P` (stdout a text pipe): each
    replica's ready event and the envoy event -> (ready events, envoy event)."""
    ready, envoy = [], None
    deadline = time.monotonic() + timeout
    while (len(ready) < replicas or envoy is None) and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise RuntimeError(f"mcpctl serve --replicas exited with {proc.returncode}")
        if line.startswith("{"):
            doc = json.loads(line)
            if doc.get("event") == "ready":
                ready.append(doc)
            elif doc.get("event") == "envoy":
                envoy = doc
    assert len(ready) == replicas and envoy, (ready, envoy)
    return ready, envoy
