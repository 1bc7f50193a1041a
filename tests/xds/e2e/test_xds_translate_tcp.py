"""TCP and TLS-passthrough Gateway servers (VirtualService tcp:/tls:) in real Envoy."""
import http.client
import json
import shutil
import socket
import ssl
import tempfile

import pytest

from mcp26.mesh.change_set import load_texts
from harness.certs import self_signed
from mcp26.demo.stack.envoy import Envoy
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.xds.translate import translate
from mcp26.xds.translate.static import static_bootstrap
from mcp26.xds.model.node import ProxyNode

pytestmark = pytest.mark.e2e
NAMES = ("a.example.com", "b.example.com")

CONFIG = """
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: l4, namespace: default}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: {tcp}, name: tcp, protocol: TCP}}
    hosts: ["*"]
  - port: {{number: {tls}, name: tls, protocol: TLS}}
    hosts: ["*.example.com"]
    tls: {{mode: PASSTHROUGH}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: backends, namespace: default}}
spec:
  hosts: [plain.mesh.local]
  ports: [{{number: 9000, name: tcp, protocol: TCP}}]
  resolution: STATIC
  endpoints: [{{address: 127.0.0.1, ports: {{tcp: {plain}}}}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: tls-a, namespace: default}}
spec:
  hosts: [tls-a.mesh.local]
  ports: [{{number: 443, name: tls, protocol: TLS}}]
  resolution: STATIC
  endpoints: [{{address: 127.0.0.1, ports: {{tls: {a}}}}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: tls-b, namespace: default}}
spec:
  hosts: [tls-b.mesh.local]
  ports: [{{number: 443, name: tls, protocol: TLS}}]
  resolution: STATIC
  endpoints: [{{address: 127.0.0.1, ports: {{tls: {b}}}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: l4, namespace: default}}
spec:
  hosts: ["*"]
  gateways: [l4]
  tcp:
  - match: [{{port: {tcp}}}]
    route: [{{destination: {{host: plain.mesh.local, port: {{number: 9000}}}}}}]
  tls:
  - match: [{{port: {tls}, sniHosts: [a.example.com]}}]
    route: [{{destination: {{host: tls-a.mesh.local, port: {{number: 443}}}}}}]
  - match: [{{port: {tls}, sniHosts: [b.example.com]}}]
    route: [{{destination: {{host: tls-b.mesh.local, port: {{number: 443}}}}}}]
"""



def tls_upstream(name: str, cert: str, key: str) -> EchoUpstream:
    up = EchoUpstream(name)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    up.server.socket = ctx.wrap_socket(up.server.socket, server_side=True)
    return up.start()


@pytest.fixture(scope="module")
def gateway():
    certs = tempfile.mkdtemp(prefix="certs-")
    cert, key = self_signed(certs, NAMES)
    ups = [EchoUpstream("plain").start(), tls_upstream("tls-a", cert, key), tls_upstream("tls-b", cert, key)]
    try:
        ports = {"tcp": free_port(), "tls": free_port()}
        text = CONFIG.format(plain=ups[0].port, a=ups[1].port, b=ups[2].port, **ports)
        snap = translate(load_texts({"l4.yaml": text}),
                         ProxyNode("router~127.0.0.1~l4.default~default.svc.cluster.local",
                                   labels={"istio": "ingressgateway"}))
        with Envoy(static_bootstrap(snap)):
            yield ports, cert
    finally:
        for u in ups:
            u.stop()
        shutil.rmtree(certs, ignore_errors=True)


def test_tcp_server_proxies_bytes_to_the_tcp_route(gateway):
    ports, _ = gateway
    conn = http.client.HTTPConnection("127.0.0.1", ports["tcp"], timeout=10)
    conn.request("GET", "/raw", headers={"host": "whatever"})
    seen = json.loads(conn.getresponse().read())
    conn.close()
    assert seen["upstream"] == "plain" and seen["path"] == "/raw"
    assert "x-request-id" not in seen["headers"]     # L4: no HTTP connection manager touched it


@pytest.mark.parametrize("sni,upstream", [("a.example.com", "tls-a"), ("b.example.com", "tls-b")])
def test_tls_passthrough_routes_by_sni_without_terminating(gateway, sni, upstream):
    ports, cert = gateway
    ctx = ssl.create_default_context(cafile=cert)     # the upstream's certificate: Envoy holds none
    with ctx.wrap_socket(socket.create_connection(("127.0.0.1", ports["tls"]), timeout=10),
                         server_hostname=sni) as s:
        s.sendall(f"GET /sni HTTP/1.1\r\nhost: {sni}\r\nconnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert json.loads(data.split(b"\r\n\r\n", 1)[1])["upstream"] == upstream
