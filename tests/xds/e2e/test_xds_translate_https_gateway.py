"""HTTPS Gateway servers (certificates from files) and tls.httpsRedirect in real Envoy."""
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
from mcp26.xds.model.type_urls import LISTENER, ROUTE
from mcp26.xds.model.node import ProxyNode

pytestmark = pytest.mark.e2e
HOST = "secure.example.com"

CONFIG = """
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: edge, namespace: default}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: {https}, name: https, protocol: HTTPS}}
    hosts: [{host}]
    tls: {{mode: SIMPLE, serverCertificate: {cert}, privateKey: {key}, minProtocolVersion: TLSV1_2}}
  - port: {{number: {http}, name: http, protocol: HTTP}}
    hosts: [{host}]
    tls: {{httpsRedirect: true}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: app, namespace: default}}
spec:
  hosts: [app.mesh.local]
  ports: [{{number: 80, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints: [{{address: 127.0.0.1, ports: {{http: {up}}}}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: tls-app, namespace: default}}
spec:
  hosts: [tls-app.mesh.local]
  ports: [{{number: 443, name: https, protocol: HTTPS}}]
  resolution: STATIC
  endpoints: [{{address: 127.0.0.1, ports: {{https: {tls_up}}}}}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: tls-app, namespace: default}}
spec:
  host: tls-app.mesh.local
  trafficPolicy:
    tls: {{mode: SIMPLE, sni: {host}, caCertificates: {cert}, subjectAltNames: [{host}]}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: app, namespace: default}}
spec:
  hosts: [{host}]
  gateways: [edge]
  http:
  - match: [{{uri: {{prefix: /tls-upstream}}}}]
    route: [{{destination: {{host: tls-app.mesh.local}}}}]
  - route: [{{destination: {{host: app.mesh.local}}}}]
"""



@pytest.fixture(scope="module")
def gateway():
    certs = tempfile.mkdtemp(prefix="certs-")
    up = EchoUpstream("app").start()
    cert, key = self_signed(certs, [HOST])
    # An upstream that speaks only TLS: reaching it proves the cluster originates TLS.
    tls_up = EchoUpstream("tls-app")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    tls_up.server.socket = server_ctx.wrap_socket(tls_up.server.socket, server_side=True)
    tls_up.start()
    try:
        ports = {"https": free_port(), "http": free_port()}
        text = CONFIG.format(host=HOST, cert=cert, key=key, up=up.port, tls_up=tls_up.port, **ports)
        snap = translate(load_texts({"https.yaml": text}),
                         ProxyNode("router~127.0.0.1~edge.default~default.svc.cluster.local",
                                   labels={"istio": "ingressgateway"}))
        assert f"https.{ports['https']}.https.edge.default" in snap[ROUTE]
        with Envoy(static_bootstrap(snap)):
            yield ports, cert, snap
    finally:
        up.stop()
        tls_up.stop()
        shutil.rmtree(certs, ignore_errors=True)


def https_get(port: int, cafile: str, path: str) -> tuple[int, dict]:
    ctx = ssl.create_default_context(cafile=cafile)
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    # SNI and certificate check against the gateway host, not the loopback address.
    conn.sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname=HOST)
    try:
        conn.request("GET", path, headers={"host": HOST})
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def test_https_server_terminates_tls_and_routes(gateway):
    ports, cert, _ = gateway
    status, seen = https_get(ports["https"], cert, "/hello")
    assert status == 200 and seen["upstream"] == "app"
    assert seen["headers"]["x-forwarded-proto"] == "https"


def test_unknown_sni_gets_no_filter_chain(gateway):
    ports, cert, _ = gateway
    ctx = ssl.create_default_context(cafile=cert)
    ctx.check_hostname = False
    with pytest.raises((ssl.SSLError, ConnectionResetError, OSError)):
        with ctx.wrap_socket(socket.create_connection(("127.0.0.1", ports["https"]), timeout=10),
                             server_hostname="other.example.com") as s:
            s.sendall(b"GET / HTTP/1.1\r\nhost: other.example.com\r\n\r\n")
            if not s.recv(1):
                raise ConnectionResetError("closed")


def test_https_redirect_on_the_plain_server(gateway):
    ports, _, snap = gateway
    conn = http.client.HTTPConnection("127.0.0.1", ports["http"], timeout=10)
    conn.request("GET", "/page", headers={"host": HOST})
    r = conn.getresponse()
    r.read()
    conn.close()
    assert r.status == 301
    assert r.getheader("location") == f"https://{HOST}/page"
    assert set(snap[LISTENER]) == {f"127.0.0.1_{ports['https']}", f"127.0.0.1_{ports['http']}"}


def test_destination_rule_tls_originates_tls_to_the_upstream(gateway):
    ports, cert, _ = gateway
    status, seen = https_get(ports["https"], cert, "/tls-upstream/x")
    assert status == 200 and seen["upstream"] == "tls-app" and seen["path"] == "/tls-upstream/x"
