"""Two `mcpctl serve` replicas, each with its priority worker, registered as the
WorkloadEntries of the operator example istio-manifests/examples/inference-pool.yaml
(harness.paths.EXAMPLES) and reached through the gateway Envoy the control plane
programs from that file; latency-critical requests go to the priority workers'
port, as the file's VirtualService sends them.

The replicas take the file's L7SchedulingPolicy (`--policy-file`); the Istio
resources go into the watched config dir with this run's ports and a Gateway +
VirtualService for `/v2/`.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import yaml

from mcp26.demo.framework import Check, Demo, Step
from mcp26.demo.stack.inference_server import requests_served
from mcp26.manifests import EXAMPLES
from mcp26.demo.stack.ports import wait_port
from mcp26.mesh import headers as H
from mcp26.mesh.qos import QosClass

POOL = EXAMPLES / "inference-pool.yaml"
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
  - name: latency-critical
    match: [{{uri: {{prefix: /v2/}}, headers: {{x-mcp-qos-class: {{exact: latency-critical}}}}}}]
    route:
    - destination: {{host: {host}, port: {{number: {priority_port}}}}}
  - match: [{{uri: {{prefix: /v2/}}}}]
    route:
    - destination: {{host: {host}, port: {{number: {port}}}}}
"""


def pool_config(layout: list[dict]) -> tuple[str, str, int, int]:
    """The example's ServiceEntry/WorkloadEntries/DestinationRule/VirtualService with this
    run's ports (layout: one dict of ports per replica)
    -> YAML, the service host, its HTTP port and its priority HTTP port."""
    docs = [d for d in yaml.safe_load_all(POOL.read_text()) if d and d["kind"] != "L7SchedulingPolicy"]
    entries = sorted((d for d in docs if d["kind"] == "WorkloadEntry"), key=lambda d: d["spec"]["labels"]["replica"])
    for doc, ports in zip(entries, layout):
        doc["spec"]["ports"] = {"http": ports["http"], "grpc": ports["grpc"],
                                "http-priority": ports["priority_http"], "grpc-priority": ports["priority_grpc"]}
    se = next(d for d in docs if d["kind"] == "ServiceEntry")
    number = {p["name"]: p["number"] for p in se["spec"]["ports"]}
    return yaml.safe_dump_all(docs, sort_keys=False), se["spec"]["hosts"][0], number["http"], number["http-priority"]


def _served(http_port: int) -> int:
    return int(requests_served(http_port))


def run(demo: Demo) -> list[Check]:
    base = demo.port_block(8)
    # `--replicas 2` puts replica i on every base port + 4i (the span of the four base ports + 1).
    layout = [{"http": base + 4 * i, "grpc": base + 1 + 4 * i, "priority_http": base + 2 + 4 * i,
               "priority_grpc": base + 3 + 4 * i} for i in range(2)]
    http_ports = [p["http"] for p in layout]
    worker_ports = [p["priority_http"] for p in layout]
    demo.start("inference-pool", [demo.mcpctl, "serve", "--model", f"builtin:{MODEL}", "--replicas", "2",
                                  "--http-port", str(base), "--grpc-port", str(base + 1),
                                  "--priority-http-port", str(base + 2), "--priority-grpc-port", str(base + 3),
                                  "--policy-file", str(POOL)])

    def replicas_ready():
        for p in http_ports:     # a replica is ready once its priority worker is
            with urllib.request.urlopen(f"http://127.0.0.1:{p}/v2/health/ready", timeout=2) as r:
                if r.status != 200:
                    return False
        return True
    demo.wait("two inference replicas and their priority workers", replicas_ready, timeout=90)

    gateway_port = demo.port()
    pool_yaml, host, port, priority_port = pool_config(layout)
    demo.apply("inference-pool.yaml", pool_yaml + "---\n" + ROUTES.format(
        gateway_port=gateway_port, host=host, port=port, priority_port=priority_port))
    wait_port(gateway_port, timeout=30)

    url = f"http://127.0.0.1:{gateway_port}/v2/models/{MODEL}/infer"
    demo.urls["inference pool gateway"] = url
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}).encode()
    before_counts = [_served(p) for p in http_ports]
    before_workers = [_served(p) for p in worker_ports]
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
    by_workers = [_served(p) - b for p, b in zip(worker_ports, before_workers)]
    top = sum(1 for i in range(REQUESTS) if i % 4 == 0)
    print(f"  replicas: {layout} (WorkloadEntries of {host}); gateway 127.0.0.1:{gateway_port}")
    print(f"  {REQUESTS} infers through the gateway in {seconds:.2f}s: {statuses}; per replica {served}, "
          f"per priority worker {by_workers} ({top} sent as latency-critical)")
    print(f"  last answer: {H.QUEUE_TIME_US} {queue_us}, {H.ORCA_LOAD_REPORT}: {orca}")
    return [Check("infers through the gateway", f"{REQUESTS} x 200", str(statuses), statuses == {200: REQUESTS}),
            Check("both replicas serve", f"each > 0, {REQUESTS - top} in all", str(served),
                  all(n > 0 for n in served) and sum(served) == REQUESTS - top),
            Check("latency-critical to the priority workers", f"{top} in all", str(by_workers),
                  sum(by_workers) == top),
            Check("ORCA load report", "TEXT ... application_utilization", (orca or "-")[:40],
                  bool(orca) and orca.startswith("TEXT ") and "application_utilization" in orca)]


STEP = Step(90, "inference pool: two replicas through the gateway", run)
