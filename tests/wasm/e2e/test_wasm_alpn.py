"""The QoS class from the client's TLS ALPN, end to end, as the control plane pushes it.

`mcpctl xds serve` translates an HTTPS Gateway (one filter chain per ALPN of
mesh.qos.ALPN_CLASSES, matched on application_protocols, each setting
x-mcp-downstream-alpn before any filter runs), a plain HTTP server, a
RequestAuthentication (inline JWKS) and the header-contract WasmPlugin; a real
Envoy gets them over ADS (the Wasm filter over ECDS) and proxies to an echo
upstream, which shows the headers the contract left. HTTP/2 is spoken by a
minimal client here (preface, SETTINGS, one HEADERS frame, DATA back), so the
test controls the ALPN list the client offers.
"""
import base64
import hashlib
import http.client
import json
import os
import shutil
import socket
import ssl
import struct
import tempfile
import time

import pytest

from mcp26.mesh import headers as H
from mcp26.mesh.qos import ALPN_CLASSES, DEFAULT_QOS_CLASS, QosClass
from mcp26.mesh.session import verify_session
from harness.certs import self_signed
from mcp26.wasm import HEADER_CONTRACT_WASM as WASM
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.tokens import Issuer
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.demo.stack.control_plane import GATEWAY_NODE, ControlPlane, mesh_envoy, write_config
from harness.manifests import documents, manifest, wasm_module

pytestmark = pytest.mark.e2e

KEY = hashlib.sha256(b"e2e alpn session key").digest()
HOST = "models.example.com"
ISSUER, AUDIENCE = "https://issuer.mesh.test", "mesh-gateway"
DEFAULT = DEFAULT_QOS_CLASS.header_value



def mesh_yaml(https_port, http_port, up, cert, key, jwks) -> dict[str, str]:
    plugin = {"sessionKey": base64.b64encode(KEY).decode(),
              "qos": {"tiers": {"free": "standard", "gold": "latency-critical"}}}
    return {
        "mesh.yaml": documents(
            f"""apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: edge, namespace: default}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: {https_port}, name: https, protocol: HTTPS}}
    hosts: [{HOST}]
    tls: {{mode: SIMPLE, serverCertificate: {cert}, privateKey: {key}}}
  - port: {{number: {http_port}, name: http, protocol: HTTP}}
    hosts: [{HOST}]
""",
            manifest("service_entry.yaml", name="app", number=80, port_name="http", protocol="HTTP", upstream=up),
            f"""apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: app, namespace: default}}
spec:
  hosts: [{HOST}]
  gateways: [edge]
  http:
  - route: [{{destination: {{host: app.mesh.local}}}}]
"""),
        "authn.yaml": manifest("gateway_jwt.yaml", issuer=ISSUER, audience=AUDIENCE, jwks=jwks),
        "wasm.yaml": manifest("header_contract_plugin.yaml", plugin_config=plugin, **wasm_module(WASM)),
    }


# -- a minimal HTTP/2 client (RFC 9113 framing, HPACK literals without indexing) --

def _hpack_int(n: int, prefix_bits: int = 7) -> bytes:
    limit = (1 << prefix_bits) - 1
    if n < limit:
        return bytes([n])
    out, n = bytearray([limit]), n - limit
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _hpack(headers: list[tuple[str, str]]) -> bytes:
    out = bytearray()
    for k, v in headers:
        kb, vb = k.encode(), v.encode()
        out += b"\x00" + _hpack_int(len(kb)) + kb + _hpack_int(len(vb)) + vb
    return bytes(out)


def _frame(ftype: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", stream) + payload


def _read_exact(sock, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed mid-frame")
        buf += chunk
    return buf


def h2_get(sock, path: str, headers: dict) -> bytes:
    """One GET on stream 1; the response body (the status is not decoded: HPACK)."""
    sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0))
    req = [(":method", "GET"), (":scheme", "https"), (":path", path), (":authority", HOST)]
    req += [(k.lower(), v) for k, v in headers.items()]
    sock.sendall(_frame(1, 0x5, 1, _hpack(req)))          # HEADERS, END_STREAM | END_HEADERS
    body = b""
    while True:
        head = _read_exact(sock, 9)
        length, ftype, flags = int.from_bytes(head[:3], "big"), head[3], head[4]
        stream = struct.unpack(">I", head[5:])[0] & 0x7FFFFFFF
        payload = _read_exact(sock, length)
        if ftype == 4 and not flags & 1:
            sock.sendall(_frame(4, 1, 0))                    # SETTINGS ACK
        elif ftype == 6 and not flags & 1:
            sock.sendall(_frame(6, 1, 0, payload))           # PING ACK
        elif ftype in (3, 7):
            raise ConnectionError(f"stream reset / GOAWAY: {payload!r}")
        elif stream == 1 and ftype in (0, 1):
            if ftype == 0:
                body += payload
            if flags & 1:                                    # END_STREAM
                return body


def tls_connect(port: int, cafile: str, alpn: list[str] | None) -> ssl.SSLSocket:
    ctx = ssl.create_default_context(cafile=cafile)
    if alpn:
        ctx.set_alpn_protocols(alpn)
    return ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname=HOST)


def seen_over(port: int, cafile: str, alpn: list[str] | None, headers: dict | None = None) -> tuple[str, dict]:
    """(the negotiated ALPN, the request headers the upstream saw) over TLS offering `alpn`."""
    sock = tls_connect(port, cafile, alpn)
    negotiated = sock.selected_alpn_protocol()
    try:
        if negotiated == "h2":
            return negotiated, json.loads(h2_get(sock, "/infer", headers or {}))["headers"]
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10)
        conn.sock = sock
        conn.request("GET", "/infer", headers={"host": HOST, **(headers or {})})
        r = conn.getresponse()
        assert r.status == 200, r.read()
        return negotiated or "", json.loads(r.read())["headers"]
    finally:
        sock.close()


class Stack:
    pass


@pytest.fixture(scope="module")
def stack():
    if not os.path.exists(WASM):
        pytest.skip("run `make wasm` first")
    s = Stack()
    s.issuer = Issuer("alpn-1", ISSUER, AUDIENCE)
    s.dir, s.certs = tempfile.mkdtemp(prefix="mesh-alpn-"), tempfile.mkdtemp(prefix="certs-")
    s.cert, key = self_signed(s.certs, [HOST])
    s.https, s.http = free_port(), free_port()
    s.up = EchoUpstream("app").start()
    for name, text in mesh_yaml(s.https, s.http, s.up.port, s.cert, key, s.issuer.jwks).items():
        write_config(s.dir, name, text)
    s.cp = ControlPlane(s.dir).start()
    s.envoy = mesh_envoy(s.cp, labels={"istio": "ingressgateway"}, namespace="default")
    try:
        s.envoy.start()
        s.cp.wait_synced(GATEWAY_NODE, types=("CDS", "LDS", "ECDS"))
        deadline = time.monotonic() + 20
        while True:
            try:
                if H.QOS_CLASS in seen_over(s.https, s.cert, ["http/1.1"])[1]:
                    break
            except (OSError, AssertionError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError("gateway never served HTTPS:\n" + s.cp.log_tail())
            time.sleep(0.2)
        yield s
    finally:
        s.envoy.stop()
        s.cp.close()
        s.up.stop()
        shutil.rmtree(s.dir, ignore_errors=True)
        shutil.rmtree(s.certs, ignore_errors=True)


def token(s, **claims) -> str:
    return s.issuer.token(**{"sub": "u", **claims})


def _find(node, key):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                yield v
            yield from _find(v, key)
    elif isinstance(node, list):
        for v in node:
            yield from _find(v, key)


def test_envoy_took_an_alpn_chain_per_qos_alpn(stack):
    """Envoy's own config dump: the listener it accepted has the chains."""
    conn = http.client.HTTPConnection("127.0.0.1", stack.envoy.admin_port, timeout=10)
    conn.request("GET", "/config_dump?resource=dynamic_listeners")
    dump = json.loads(conn.getresponse().read())
    conn.close()
    [lis] = [lis for lis in _find(dump, "active_state") if lis["listener"]["name"] == f"127.0.0.1_{stack.https}"]
    matches = [c.get("filter_chain_match", {}) for c in lis["listener"]["filter_chains"]]
    assert [m.get("application_protocols") for m in matches] == [[a] for a in ALPN_CLASSES] + [None]
    assert all(m["server_names"] == [HOST] for m in matches)


@pytest.mark.parametrize("alpn, negotiated, want", [
    (["grpc-exp", "h2"], "h2", ALPN_CLASSES["grpc-exp"].header_value),   # interactive, though HTTP/2 runs
    (["h2"], "h2", ALPN_CLASSES["h2"].header_value),                      # latency-critical
    (["h2", "grpc-exp"], "h2", ALPN_CLASSES["h2"].header_value),          # the client's order decides
    (["h2", "http/1.1"], "h2", ALPN_CLASSES["h2"].header_value),
    (["grpc-exp", "http/1.1"], "http/1.1", ALPN_CLASSES["grpc-exp"].header_value),
    (["http/1.1"], "http/1.1", DEFAULT),                                  # no class for http/1.1
    (None, "", DEFAULT),                                                  # no ALPN at all: the default chain
])
def test_qos_class_follows_the_offered_alpn(stack, alpn, negotiated, want):
    got_alpn, seen = seen_over(stack.https, stack.cert, alpn)
    assert got_alpn == negotiated
    assert seen[H.QOS_CLASS] == want
    assert H.DOWNSTREAM_ALPN not in seen                     # read by the contract, never passed on
    assert verify_session(seen, KEY, method="GET").signed[H.QOS_CLASS] == want


@pytest.mark.parametrize("alpn, spoof, want", [
    (["h2"], "grpc-exp", ALPN_CLASSES["h2"].header_value),
    (["grpc-exp", "h2"], "h2", ALPN_CLASSES["grpc-exp"].header_value),
    (["http/1.1"], "h2", DEFAULT),
    (["http/1.1"], "grpc-exp", DEFAULT),
])
def test_a_client_sent_alpn_header_has_no_effect(stack, alpn, spoof, want):
    _, seen = seen_over(stack.https, stack.cert, alpn, {H.DOWNSTREAM_ALPN: spoof})
    assert seen[H.QOS_CLASS] == want and H.DOWNSTREAM_ALPN not in seen


def test_a_client_sent_alpn_header_has_no_effect_on_plaintext(stack):
    conn = http.client.HTTPConnection("127.0.0.1", stack.http, timeout=10)
    conn.request("GET", "/infer", headers={"host": HOST, H.DOWNSTREAM_ALPN: "h2"})
    r = conn.getresponse()
    seen = json.loads(r.read())["headers"]
    conn.close()
    assert r.status == 200 and seen[H.QOS_CLASS] == DEFAULT and H.DOWNSTREAM_ALPN not in seen


@pytest.mark.parametrize("alpn, priority, tier, want", [
    (["grpc-exp", "h2"], "critical", None, QosClass.LATENCY_CRITICAL),       # X-LLM-Priority comes first
    (["h2"], "low", None, QosClass.BATCH),
    (["h2"], None, "free", QosClass.STANDARD),                           # the tier claim caps the ALPN's class
    (["h2"], "high", "free", QosClass.STANDARD),
    (["grpc-exp", "h2"], None, "gold", QosClass.INTERACTIVE),
    (["http/1.1"], "critical", "gold", QosClass.LATENCY_CRITICAL),
    (["h2"], "high", None, QosClass.INTERACTIVE),                        # High: the weight x3 class
])
def test_priority_and_tier_rules_still_apply(stack, alpn, priority, tier, want):
    hdrs = {}
    if priority:
        hdrs[H.LLM_PRIORITY] = priority
    if tier:
        hdrs["authorization"] = "Bearer " + token(stack, tier=tier)
    _, seen = seen_over(stack.https, stack.cert, alpn, hdrs)
    assert seen[H.QOS_CLASS] == want.header_value
    verify_session(seen, KEY, method="GET")
