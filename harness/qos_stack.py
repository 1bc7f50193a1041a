"""The seed's QoS rules end to end: a real Envoy configured by the control plane with the header
contract (the Wasm filter signs the class X-LLM-Priority and the caller's tier give), in front of a
real model server that honours only signed classes (`--session-key-file`) and runs the batcher
policy the test gives. Used by tests/inference/e2e/test_qos_rules_envoy.py and
benchmarks/bench_qos_rules.py.

    with QosStack(policy_yaml) as s:
        s.gw_port, s.server (InferenceServer), s.status() (/admin/status), s.spans() (the trace file)
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
import time
import urllib.request

from harness.manifests import documents, manifest, wasm_module
from mcp26.demo.stack.control_plane import GATEWAY_NODE, ControlPlane, mesh_envoy, write_config
from mcp26.demo.stack.inference_server import InferenceServer
from mcp26.demo.stack.ports import free_port
from mcp26.wasm import HEADER_CONTRACT_WASM as WASM

KEY = hashlib.sha256(b"qos rules session key").digest()
POLICY = """apiVersion: scheduling.mcp-mesh.io/v1alpha1
kind: L7SchedulingPolicy
metadata: {{name: qos, namespace: default}}
spec: {spec}
"""


class QosStack:
    def __init__(self, spec: dict, model: str = "builtin:mlp", *server_args: str):
        self.spec, self.model, self.server_args = spec, model, server_args

    def __enter__(self) -> "QosStack":
        self.dir = tempfile.mkdtemp(prefix="mesh-qos-")
        key_file = os.path.join(self.dir, "session.key")
        with open(key_file, "wb") as f:
            f.write(KEY)
        policy = os.path.join(self.dir, "policy.yaml")
        with open(policy, "w") as f:
            f.write(POLICY.format(spec=json.dumps(self.spec)))
        self.trace = os.path.join(self.dir, "spans.jsonl")
        self.server = InferenceServer(self.model, "--session-key-file", key_file, "--policy-file", policy,
                                      "--trace-file", self.trace, *self.server_args).start()
        self.config_dir = os.path.join(self.dir, "mesh")
        os.makedirs(self.config_dir)
        self.gw_port = free_port()
        plugin = {"sessionKey": base64.b64encode(KEY).decode()}
        write_config(self.config_dir, "mesh.yaml", documents(
            manifest("gateway.yaml", gw_port=self.gw_port),
            manifest("service_entry.yaml", name="models", number=80, port_name="http", protocol="HTTP",
                     upstream=self.server.http_port),
            manifest("gateway_route.yaml", name="models", host="models.mesh.local"),
            manifest("header_contract_plugin.yaml", plugin_config=plugin, **wasm_module(WASM))))
        self.cp = ControlPlane(self.config_dir).start()
        self.envoy = mesh_envoy(self.cp, labels={"istio": "ingressgateway"}, namespace="default")
        try:
            self.envoy.start()
            self.cp.wait_synced(GATEWAY_NODE, types=("CDS", "LDS", "ECDS"))
            self._wait_serving()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_serving(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{self.gw_port}/v2/health/ready")
                with urllib.request.urlopen(req, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"gateway not serving:\n{self.envoy.log_tail()}")
            time.sleep(0.1)

    def status(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.server.admin_port}/admin/status", timeout=5) as r:
            return json.load(r)["models"][0]

    def set_policy(self, spec: dict) -> None:
        body = json.dumps({"spec": spec}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.server.admin_port}/admin/policy", data=body,
                                     headers={"content-type": "application/json"})
        urllib.request.urlopen(req, timeout=5).read()

    def spans(self) -> list[dict]:
        """The server's spans so far (its trace file): one infer span per request, its children."""
        time.sleep(0.5)                          # the exporter writes every 200 ms
        with open(self.trace) as f:
            return [json.loads(line) for line in f if line.strip()]

    def __exit__(self, *exc) -> None:
        for stop in (lambda: self.envoy.stop(), lambda: self.cp.close(), lambda: self.server.stop()):
            try:
                stop()
            except Exception:
                pass


def request_windows(spans: list[dict]) -> list[dict]:
    """Per request: its priority level, arrival, batch start (end of queue_wait) and end."""
    by_parent: dict[str, dict] = {}
    for s in spans:
        if s["parent_id"]:
            by_parent.setdefault(s["parent_id"], {})[s["name"]] = s
    out = []
    for s in spans:
        if s["name"] != "infer" or s["span_id"] not in by_parent:
            continue
        kids = by_parent[s["span_id"]]
        out.append({"level": s["attributes"].get("priority_level"), "arrival": s["start_ns"],
                    "start": kids["queue_wait"]["end_ns"], "end": kids["compute"]["end_ns"],
                    "batch_requests": s["attributes"].get("batch_requests")})
    return out


INFER = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 64], "datatype": "FP32",
                                "data": [0.25] * 64}]}).encode()


async def closed_loop(port: int, clients: dict, seconds: float, body: bytes = INFER,
                      path: str = "/v2/models/mlp/infer") -> dict:
    """Closed-loop clients through the gateway for `seconds`: {X-LLM-Priority value (None: no
    header): clients}. -> {value: {"latencies_ms": [...], "statuses": {status: n}}}."""
    import asyncio
    import aiohttp
    out = {k: {"latencies_ms": [], "statuses": {}} for k in clients}
    deadline = asyncio.get_running_loop().time() + seconds
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=30)) as session:
        async def one(priority):
            headers = {"content-type": "application/json", **({"x-llm-priority": priority} if priority else {})}
            rec = out[priority]
            loop = asyncio.get_running_loop()
            while loop.time() < deadline:
                t0 = loop.time()
                try:
                    async with session.post(f"http://127.0.0.1:{port}{path}", data=body, headers=headers) as r:
                        await r.read()
                        status = r.status
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    status = 0
                rec["statuses"][status] = rec["statuses"].get(status, 0) + 1
                if status == 200:
                    rec["latencies_ms"].append((loop.time() - t0) * 1e3)
        await asyncio.gather(*(one(p) for p, n in clients.items() for _ in range(n)))
    return out


def pct(values, q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]
