"""What the EPP benchmarks stand up: decoder replicas on their own loopback addresses and one
shared port (as Pods), their InferencePool and WorkloadEntries in a directory, and
`mcpctl epp serve` for it. Shared by bench_epp (chat sessions) and epp_overhead."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time
import urllib.request

from harness.endpoint_picker import PickerProcess
from mcp26.demo.stack.ports import free_port, port_free_on_all
from mcp26.demo.stack.processes import stop_processes

ROOT = pathlib.Path(__file__).resolve().parent.parent
IDLE_METRICS = {"vllm:num_requests_waiting": 0, "vllm:num_requests_running": 0, "vllm:kv_cache_usage_perc": 0.0}


def replica_hosts(n: int) -> list[str]:
    return [f"127.0.0.{2 + i}" for i in range(n)]


def _get_json(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.load(r)


def _read_ready(proc: subprocess.Popen, what: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}")
            continue
        if line.startswith("{"):
            doc = json.loads(line)
            if doc.get("event") == "ready":
                return doc
    raise TimeoutError(f"{what} not ready after {timeout}s")


class Replicas:
    """`mcpctl serve --model builtin:tiny-decoder` on 127.0.0.2, .3, ... and one shared HTTP port."""

    def __init__(self, n: int, kv_cache_mb: float, threads: int):
        self.hosts = replica_hosts(n)
        self.port = port_free_on_all(self.hosts)
        self.procs = []
        for h in self.hosts:
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "mcp26.mesh.cli", "serve", "--model", "builtin:tiny-decoder", "--host", h,
                 "--http-port", str(self.port), "--grpc-port", str(free_port(h)), "--drain-seconds", "0",
                 "--kv-cache-mb", str(kv_cache_mb), "--intra-op-threads", str(threads), "--log-level", "ERROR"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT))
        try:
            for h, p in zip(self.hosts, self.procs):
                _read_ready(p, f"replica {h}")
        except Exception:
            self.stop()
            raise

    @property
    def endpoints(self) -> list[tuple[str, int]]:
        return [(h, self.port) for h in self.hosts]

    def loads(self) -> list[dict]:
        return [_get_json(f"http://{h}:{self.port}/v1/load") for h in self.hosts]

    def stop(self) -> None:
        stop_processes(self.procs, grace=5)


class Picker(PickerProcess):
    """`mcpctl epp serve` for the pool in `directory`; ready once every endpoint has been scraped."""

    def __init__(self, directory: str, endpoints: int, metrics_interval_ms: float | None = None, *extra: str):
        interval = ["--metrics-interval-ms", str(metrics_interval_ms)] if metrics_interval_ms else []
        super().__init__(directory, *interval, *extra)
        try:
            self.wait(lambda s: len(s["endpoints"]) == endpoints and all(e["ready"] for e in s["endpoints"].values()),
                      timeout=20)
        except Exception:
            self.stop()
            raise
