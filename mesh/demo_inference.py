"""The demo's inference-pool step: two `mcpctl serve` replicas registered as the
WorkloadEntries of istio-manifests/examples/inference-pool.yaml, reached through
the gateway Envoy the control plane programs from that file.

Runs after the gateway step of mesh.demo. The replicas take the file's
L7SchedulingPolicy (`--policy-file`); the Istio resources go into the watched
config dir with this run's ports and a Gateway + VirtualService for `/v2/`.
Like the rest of the demo it speaks to the other parts only over the wire.
"""
from __future__ import annotations

import json
import re
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from mesh import headers as H
from mesh.qos import QosClass

POOL = Path(__file__).resolve().parent.parent / "istio-manifests" / "examples" / "inference-pool.yaml"
MODEL = "mlp"
REQUESTS = 200

ROUTES = """\
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: inference-pool-gateway, namespace: default}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: {gateway_port}, name: http-inference, protocol: HTTP}}
    hosts: ["*"]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: inference-pool, namespace: default}}
spec:
  hosts: ["*"]
  gateways: [inference-pool-gateway]
  http:
  - match: [{{uri: {{prefix: /v2/}}}}]
    route:
    - destination: {{host: {host}, port: {{number: {port}}}}}
"""


def _block(n: int) -> int:
    """A base port with n free ports from it (the replicas' layout is base + 2i, base + 1 + 2i)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        try:
            for p in range(base, base + n):
                with socket.socket() as t:
                    t.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
    raise RuntimeError("no block of free ports for the replicas")


def pool_config(http_ports: list[int], grpc_ports: list[int]) -> tuple[str, str, int]:
    """The example's ServiceEntry/WorkloadEntries/DestinationRule with this run's ports
    (-> YAML, the service host, its HTTP port)."""
    docs = [d for d in yaml.safe_load_all(POOL.read_text()) if d and d["kind"] != "L7SchedulingPolicy"]
    entries = sorted((d for d in docs if d["kind"] == "WorkloadEntry"), key=lambda d: d["spec"]["labels"]["replica"])
    for doc, http, grpc in zip(entries, http_ports, grpc_ports):
        doc["spec"]["ports"] = {"http": http, "grpc": grpc}
    se = next(d for d in docs if d["kind"] == "ServiceEntry")
    port = next(p["number"] for p in se["spec"]["ports"] if p["name"] == "http")
    return yaml.safe_dump_all(docs, sort_keys=False), se["spec"]["hosts"][0], port


def _served(http_port: int) -> int:
    text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5).read().decode()
    return int(sum(float(m.group(1)) for m in re.finditer(
        r'^mcp_inference_requests_total\{[^}]*code="OK"[^}]*\} ([0-9.e+]+)$', text, re.M)))


def step_inference_pool(demo) -> list:
    from mesh.demo import Check, _free_port   # here, not at import: mesh.demo imports this module
    base = _block(4)
    http_ports, grpc_ports = [base, base + 2], [base + 1, base + 3]
    demo.start("inference-pool", [str(demo.bin / "mcpctl"), "serve", "--model", f"builtin:{MODEL}", "--replicas", "2",
                                  "--http-port", str(base), "--grpc-port", str(base + 1),
                                  "--policy-file", str(POOL)])

    def replicas_ready():
        for p in http_ports:
            with urllib.request.urlopen(f"http://127.0.0.1:{p}/v2/health/ready", timeout=2) as r:
                if r.status != 200:
                    return False
        return True
    demo.wait("two inference replicas", replicas_ready, timeout=90)

    gateway_port = _free_port()
    pool_yaml, host, port = pool_config(http_ports, grpc_ports)
    before = demo.admin("/debug/configz")["generation"]
    demo.write_config("inference-pool.yaml", pool_yaml + "---\n" + ROUTES.format(
        gateway_port=gateway_port, host=host, port=port))
    status = demo.wait("the inference pool config", lambda: (s := demo.admin("/debug/configz"))["generation"] != before and s)
    if status.get("rejected"):
        raise RuntimeError(f"inference-pool.yaml rejected: {status['rejected']}")
    demo.wait_synced()
    demo.wait("the pool's gateway listener", lambda: socket.create_connection(("127.0.0.1", gateway_port), 1).close() or True)

    demo.urls["inference pool gateway"] = f"http://127.0.0.1:{gateway_port}/v2/models/{MODEL}/infer"
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}).encode()
    url = f"http://127.0.0.1:{gateway_port}/v2/models/{MODEL}/infer"
    before_counts = [_served(p) for p in http_ports]
    statuses: dict[int, int] = {}
    orca = queue_us = None
    started = time.monotonic()
    for i in range(REQUESTS):
        qos = QosClass.LATENCY_CRITICAL if i % 4 == 0 else QosClass.STANDARD
        req = urllib.request.Request(url, data=body, method="POST", headers={H.QOS_CLASS: qos.header_value})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                r.read()
                statuses[r.status] = statuses.get(r.status, 0) + 1
                orca, queue_us = r.headers.get(H.ORCA_LOAD_REPORT), r.headers.get(H.QUEUE_TIME_US)
        except urllib.error.HTTPError as e:
            statuses[e.code] = statuses.get(e.code, 0) + 1
    seconds = time.monotonic() - started
    served = [_served(p) - b for p, b in zip(http_ports, before_counts)]
    print(f"  replicas: http {http_ports}, grpc {grpc_ports} (WorkloadEntries of {host}); gateway 127.0.0.1:{gateway_port}")
    print(f"  {REQUESTS} infers through the gateway in {seconds:.2f}s: {statuses}; per replica {served}")
    print(f"  last answer: {H.QUEUE_TIME_US} {queue_us}, {H.ORCA_LOAD_REPORT}: {orca}")
    return [Check("infers through the gateway", f"{REQUESTS} x 200", str(statuses), statuses == {200: REQUESTS}),
            Check("both replicas serve", "each > 0", str(served), all(n > 0 for n in served) and sum(served) == REQUESTS),
            Check("ORCA load report", "TEXT ... application_utilization", (orca or "-")[:40],
                  bool(orca) and orca.startswith("TEXT ") and "application_utilization" in orca)]
