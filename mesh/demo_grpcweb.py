"""The demo's gRPC-Web step: the inference backend behind the gateway, reached with
gRPC-Web as a browser does, and the console (`mcpctl console`) serving its page.

Runs after the gateway step of mesh.demo (it needs the control plane and the
gateway Envoy). Like the rest of the demo it drives the other parts as
subprocesses and speaks to them only over the wire: the gRPC-Web frames
below are written by hand (a ModelMetadataRequest is one string field).
See xds-server/console/README.md.
"""
from __future__ import annotations

import http.client
import json
import socket
import struct
import time
import urllib.request

MODEL = "mlp"
CONSOLE_PORT = 15100          # mcpctl console's default, when free
SERVICE = "/inference.GRPCInferenceService"

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _frame(payload: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(payload)) + payload


def _grpc_web(port: int, method: str, body: bytes, origin: str) -> tuple[dict, list[bytes], dict]:
    """POST a gRPC-Web body; (response headers, message payloads, trailers)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", f"{SERVICE}/{method}", body=body, headers={
            "content-type": "application/grpc-web+proto", "x-grpc-web": "1", "origin": origin})
        resp = conn.getresponse()
        headers = {k.lower(): v for k, v in resp.getheaders()}
        data = resp.read()
    finally:
        conn.close()
    messages, trailers, pos = [], {}, 0
    while pos + 5 <= len(data):
        flags, n = struct.unpack_from(">BI", data, pos)
        payload = data[pos + 5:pos + 5 + n]
        pos += 5 + n
        if flags & 0x80:
            for line in payload.decode("latin-1").split("\r\n"):
                k, _, v = line.partition(":")
                if k:
                    trailers[k.strip().lower()] = v.strip()
        else:
            messages.append(payload)
    for k in ("grpc-status", "grpc-message"):   # a trailers-only answer
        if k in headers:
            trailers.setdefault(k, headers[k])
    return headers, messages, trailers


def step_grpc_web_console(demo) -> list:
    from mesh.demo import Check, _pick   # here, not at import: mesh.demo imports this module
    mcpctl = str(demo.bin / "mcpctl")
    http_port, grpc_port, gateway_port = _free_port(), _free_port(), _free_port()
    console_port = _pick(CONSOLE_PORT, {http_port, grpc_port, gateway_port})
    console = f"http://127.0.0.1:{console_port}"

    demo.start("backend", [mcpctl, "serve", "--model", f"builtin:{MODEL}",
                           "--http-port", str(http_port), "--grpc-port", str(grpc_port)])

    def backend_ready():
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=2) as r:
            return r.status == 200
    demo.wait("the inference backend", backend_ready, timeout=60)

    before = demo.admin("/debug/configz")["generation"]
    demo.write_config("grpc-web.yaml", CONFIG.format(gateway_port=gateway_port, grpc_port=grpc_port,
                                                    service=SERVICE, origin=console))
    status = demo.wait("the gRPC-Web config", lambda: (s := demo.admin("/debug/configz"))["generation"] != before and s)
    if status.get("rejected"):
        raise RuntimeError(f"grpc-web.yaml rejected: {status['rejected']}")
    demo.wait_synced()
    demo.wait("the gRPC-Web listener", lambda: socket.create_connection(("127.0.0.1", gateway_port), 1).close() or True)

    demo.start("console", [mcpctl, "console", "--port", str(console_port),
                           "--xds-admin", f"http://127.0.0.1:{demo.admin_port}",
                           "--backend", f"http://127.0.0.1:{http_port}",
                           "--grpc-web", f"http://127.0.0.1:{gateway_port}",
                           "--envoy-admin", f"http://127.0.0.1:{demo.envoy_admin_port}", "--model", MODEL])
    demo.wait("the console", lambda: json.loads(urllib.request.urlopen(f"{console}/api/config", timeout=2).read()))
    demo.urls["console"] = f"{console}/"
    demo.urls["gRPC-Web gateway"] = f"http://127.0.0.1:{gateway_port}{SERVICE}/"
    demo.urls["inference backend"] = f"http://127.0.0.1:{http_port}/v2/models/{MODEL}"

    # As the page does: a CORS preflight from the console's origin, then the call.
    conn = http.client.HTTPConnection("127.0.0.1", gateway_port, timeout=10)
    conn.request("OPTIONS", f"{SERVICE}/ModelMetadata", headers={
        "origin": console, "access-control-request-method": "POST",
        "access-control-request-headers": "content-type,x-grpc-web,x-user-agent"})
    pre = conn.getresponse()
    pre.read()
    conn.close()
    allowed = pre.getheader("access-control-allow-origin") or "-"

    headers, messages, trailers = _grpc_web(gateway_port, "ModelMetadata", _frame(b"\x0a" + bytes([len(MODEL)]) + MODEL.encode()), console)
    metadata_ok = trailers.get("grpc-status") == "0" and bool(messages) and b"INPUT0" in messages[0]

    started = time.monotonic()
    _, _, bad = _grpc_web(gateway_port, "ModelInfer", b"\x00\x00\x00\x10\x00" + b"\x0a\x03mlp", console)
    bad_s = time.monotonic() - started

    mesh = json.loads(urllib.request.urlopen(f"{console}/api/mesh", timeout=5).read())
    endpoint = f"127.0.0.1:{grpc_port}"
    health = next((e["health"] for c in mesh["clusters"] for e in c["endpoints"] if e["address"] == endpoint), "absent")

    print(f"  backend: KServe v2 gRPC 127.0.0.1:{grpc_port}; gRPC-Web via the gateway on 127.0.0.1:{gateway_port}")
    print(f"  preflight from {console}: {pre.status}, allow-origin {allowed}")
    print(f"  ModelMetadata over gRPC-Web: grpc-status {trailers.get('grpc-status')}, {len(messages)} message(s)")
    print(f"  truncated frame: grpc-status {bad.get('grpc-status')} in {bad_s * 1e3:.0f} ms: {bad.get('grpc-message', '')}")
    print(f"  console: {console}/   (proxies, routes, endpoints, latency per QoS class, ModelInfer from the browser)")
    return [Check("CORS preflight", f"200, allow-origin {console}", f"{pre.status}, {allowed}",
                  pre.status == 200 and allowed == console),
            Check("ModelMetadata over gRPC-Web", "grpc-status 0, INPUT0", f"grpc-status {trailers.get('grpc-status')}",
                  metadata_ok),
            Check("malformed frame", "grpc-status 3, no hang", f"grpc-status {bad.get('grpc-status')} in {bad_s:.1f} s",
                  bad.get("grpc-status") == "3" and bad_s < 5),
            Check("console sees the backend", "HEALTHY", health, health == "HEALTHY")]
