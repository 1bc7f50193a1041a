"""`mcpctl epp serve` as a process, for tests, benchmarks and the demo: its ports from the
ready line, its `/stats`, and a wait on them.

    picker = PickerProcess(directory, "--metrics-interval-ms", "20")   # pool inference/decoders
    picker.wait(lambda s: all(e["ready"] for e in s["endpoints"].values()))
    picker.stop()

`pool_yaml` / `write_pool`: the pool such a picker serves; `headers_request`: what Envoy's
ext_proc filter sends it first.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2

from mcp26.demo.stack.processes import stop_process
from mcp26.mesh import endpoint_picker as epp


class PickerProcess:
    def __init__(self, directory: str | None, *extra: str, pool: str = "inference/decoders", grpc_port: int = 0):
        """`directory`: the pool's directory; None: `extra` names the source (`--kubeconfig F`)."""
        # stderr to a file, not a pipe: a picker logging for minutes would fill a pipe and block
        self._stderr = tempfile.TemporaryFile(mode="w+")
        where = ["--config-dir", directory] if directory is not None else []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mcp26.mesh.cli", "epp", "serve", *where, "--pool", pool,
             "--grpc-port", str(grpc_port), "--admin-port", "0", "--log-level", "WARNING", *extra],
            stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(5)
            self._stderr.seek(0)
            raise RuntimeError(f"mcpctl epp serve exited with {self.proc.returncode}: {self._stderr.read()}")
        self.ready = json.loads(line)
        self.port, self.admin = self.ready["grpc_port"], self.ready["admin_port"]

    def stats(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}/stats", timeout=5) as r:
            return json.load(r)

    def wait(self, predicate, timeout: float = 10.0) -> dict:
        """/stats once `predicate(stats)` holds; AssertionError with the last stats after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.stats()
            if predicate(s):
                return s
            if time.monotonic() > deadline:
                raise AssertionError(f"the picker's stats never matched: {s}")
            time.sleep(0.02)

    def stop(self) -> None:
        stop_process(self.proc)
        self._stderr.close()


def headers_request(headers: dict, end_of_stream: bool, subset=None) -> pb.ProcessingRequest:
    """The request_headers message Envoy's ext_proc filter sends the picker; `subset`: the
    endpoints Envoy's metadata offers (the GIE subset hint)."""
    req = pb.ProcessingRequest()
    for k, v in headers.items():
        req.request_headers.headers.headers.add(key=k, raw_value=v.encode())
    req.request_headers.end_of_stream = end_of_stream
    if subset is not None:
        s = struct_pb2.Struct()
        s.update({epp.SUBSET_KEY: list(subset)})
        req.metadata_context.filter_metadata[epp.SUBSET_NAMESPACE].CopyFrom(s)
    return req


def pool_yaml(port: int, hosts, picker_port: int = 9002) -> str:
    """InferencePool inference/decoders over `port` (its picker `epp`, FailClose) and one
    WorkloadEntry per replica address, as a Pod per replica would be."""
    return "---\n".join([f"""apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {{name: decoders, namespace: inference}}
spec:
  selector: {{matchLabels: {{app: decoder}}}}
  targetPorts: [{{number: {port}}}]
  endpointPickerRef: {{name: epp, port: {{number: {picker_port}}}, failureMode: FailClose}}
"""] + [f"""apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: decoder-{i}, namespace: inference}}
spec: {{address: {h}, labels: {{app: decoder}}}}
""" for i, h in enumerate(hosts)])


def write_pool(directory: str, hosts, port: int) -> None:
    """`directory`/pool.yaml: `pool_yaml`, what `PickerProcess(directory)` serves."""
    with open(os.path.join(directory, "pool.yaml"), "w") as f:
        f.write(pool_yaml(port, hosts))
