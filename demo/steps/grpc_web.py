"""The inference backend behind the gateway, reached with gRPC-Web as a browser does,
and the console (`mcpctl console`) serving its page. See xds-server/console/README.md.

The requests are written by hand (a ModelMetadataRequest is one string field),
framed by demo.stack.grpcweb as a browser's client would.
"""
from __future__ import annotations

import json
import time
import urllib.request

from mcp26.demo.framework import Check, Demo, Step
from mcp26.demo.stack.grpcweb import GrpcWebClient
from mcp26.demo.stack.ports import wait_port

MODEL = "mlp"
CONSOLE_PORT = 15100          # mcpctl console's default, when free
SERVICE = "/inference.GRPCInferenceService"
METADATA_REQUEST = b"\x0a" + bytes([len(MODEL)]) + MODEL.encode()     # ModelMetadataRequest{name: MODEL}
TRUNCATED_FRAME = b"\x00\x00\x00\x10\x00" + b"\x0a\x03mlp"          # says 4096 bytes, 5 follow

CONFIG = """\
# gRPC-Web to the inference backend, on a gateway port of its own.
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: inference-gateway, namespace: default}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: {gateway_port}, name: http-grpc-web, protocol: HTTP}}
    hosts: ["*"]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: inference, namespace: default}}
spec:
  hosts: [inference.demo.local]
  location: MESH_INTERNAL
  ports: [{{number: 8001, name: grpc, protocol: GRPC}}]
  resolution: STATIC
  endpoints:
  - {{address: 127.0.0.1, ports: {{grpc: {grpc_port}}}}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: inference-grpc-web, namespace: default}}
spec:
  hosts: ["*"]
  gateways: [inference-gateway]
  http:
  - match: [{{uri: {{prefix: {service}/}}}}]
    corsPolicy:
      allowOrigins: [{{exact: "{origin}"}}]
      allowMethods: [POST, OPTIONS]
      allowHeaders: [content-type, x-grpc-web, x-user-agent, grpc-timeout, x-llm-priority]
      exposeHeaders: [grpc-status, grpc-message, grpc-status-details-bin]
      maxAge: 10m
    route:
    - destination: {{host: inference.demo.local, port: {{number: 8001}}}}
"""


def run(demo: Demo) -> list[Check]:
    http_port, grpc_port, gateway_port = demo.port(), demo.port(), demo.port()
    console_port = demo.port(CONSOLE_PORT)
    console = f"http://127.0.0.1:{console_port}"

    demo.start("backend", [demo.mcpctl, "serve", "--model", f"builtin:{MODEL}",
                           "--http-port", str(http_port), "--grpc-port", str(grpc_port)])

    def backend_ready():
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=2) as r:
            return r.status == 200
    demo.wait("the inference backend", backend_ready, timeout=60)

    demo.apply("grpc-web.yaml", CONFIG.format(gateway_port=gateway_port, grpc_port=grpc_port,
                                              service=SERVICE, origin=console))
    wait_port(gateway_port, timeout=30)

    demo.start("console", [demo.mcpctl, "console", "--port", str(console_port),
                           "--control-plane", f"127.0.0.1:{demo.admin_port}",
                           "--backend", f"http://127.0.0.1:{http_port}",
                           "--grpc-web", f"http://127.0.0.1:{gateway_port}",
                           "--envoy-admin", f"http://127.0.0.1:{demo.envoy_admin_port}", "--model", MODEL])
    demo.wait("the console", lambda: json.loads(urllib.request.urlopen(f"{console}/api/config", timeout=2).read()))
    demo.urls["console"] = f"{console}/"
    demo.urls["gRPC-Web gateway"] = f"http://127.0.0.1:{gateway_port}{SERVICE}/"
    demo.urls["inference backend"] = f"http://127.0.0.1:{http_port}/v2/models/{MODEL}"

    # As the page does: a CORS preflight from the console's origin, then the call.
    client = GrpcWebClient("127.0.0.1", gateway_port)
    pre_status, pre = client.preflight(f"{SERVICE}/ModelMetadata", console, "content-type,x-grpc-web,x-user-agent")
    allowed = pre.get("access-control-allow-origin") or "-"

    metadata = client.unary(f"{SERVICE}/ModelMetadata", METADATA_REQUEST, {"origin": console})
    metadata_ok = metadata.status == 0 and bool(metadata.messages) and b"INPUT0" in metadata.messages[0]

    started = time.monotonic()
    bad = client.call(f"{SERVICE}/ModelInfer", raw_body=TRUNCATED_FRAME, metadata={"origin": console})
    bad_s = time.monotonic() - started

    mesh = json.loads(urllib.request.urlopen(f"{console}/api/mesh", timeout=5).read())
    endpoint = f"127.0.0.1:{grpc_port}"
    health = next((e["health"] for c in mesh["clusters"] for e in c["endpoints"] if e["address"] == endpoint), "absent")

    print(f"  backend: KServe v2 gRPC 127.0.0.1:{grpc_port}; gRPC-Web via the gateway on 127.0.0.1:{gateway_port}")
    print(f"  preflight from {console}: {pre_status}, allow-origin {allowed}")
    print(f"  ModelMetadata over gRPC-Web: grpc-status {metadata.status}, {len(metadata.messages)} message(s)")
    print(f"  truncated frame: grpc-status {bad.status} in {bad_s * 1e3:.0f} ms: {bad.message}")
    print(f"  console: {console}/   (proxies, routes, endpoints, latency per QoS class, ModelInfer from the browser)")
    return [Check("CORS preflight", f"200, allow-origin {console}", f"{pre_status}, {allowed}",
                  pre_status == 200 and allowed == console),
            Check("ModelMetadata over gRPC-Web", "grpc-status 0, INPUT0", f"grpc-status {metadata.status}",
                  metadata_ok),
            Check("malformed frame", "grpc-status 3, no hang", f"grpc-status {bad.status} in {bad_s:.1f} s",
                  bad.status == 3 and bad_s < 5),
            Check("console sees the backend", "HEALTHY", health, health == "HEALTHY")]


STEP = Step(80, "gRPC-Web to the inference backend, console", run)
