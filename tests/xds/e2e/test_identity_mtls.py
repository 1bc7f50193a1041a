"""Zero-trust identity through real Envoys: app A -> A's sidecar -> mTLS -> B's sidecar -> app B.

The control plane's mesh CA issues each sidecar a SPIFFE certificate over
SDS; A's outbound cluster is ISTIO_MUTUAL (DestinationRule), B's Sidecar
ingress port is an inbound listener whose chains follow PeerAuthentication.
What is asserted is what B received, the status, or the certificate B's
sidecar presented.
"""
from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import tempfile
import time

import pytest

from mcp26.demo.stack.envoy import Envoy
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.demo.stack.control_plane import ControlPlane, write_config
from mcp26.xds.bootstrap import envoy_bootstrap
from mcp26.xds.ca import MeshCA, node_token_from_dir

pytestmark = pytest.mark.e2e

NS = "shop"
HOST = f"b.{NS}.svc.cluster.local"
A_NODE = f"sidecar~127.0.0.1~a-1.{NS}~{NS}.svc.cluster.local"
B_NODE = f"sidecar~127.0.0.1~b-1.{NS}~{NS}.svc.cluster.local"

MESH = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: b, namespace: shop}}
spec:
  hosts: [{host}]
  ports: [{{number: {svc_port}, name: http, protocol: HTTP}}]
  resolution: STATIC
  subjectAltNames: ["spiffe://cluster.local/ns/shop/sa/b"]
  endpoints: [{{address: 127.0.0.1, ports: {{http: {b_in}}}}}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: b, namespace: shop}}
spec:
  host: {host}
  trafficPolicy:
    tls: {{mode: {tls}}}
    # new upstream connections keep coming, so a rotated certificate is used on the wire
    connectionPool: {{http: {{maxRequestsPerConnection: 20}}}}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: a, namespace: shop}}
spec:
  workloadSelector: {{labels: {{app: a}}}}
  egress: [{{hosts: ["shop/{host}"]}}]
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: b, namespace: shop}}
spec:
  workloadSelector: {{labels: {{app: b}}}}
  ingress:
  - port: {{number: {b_in}, protocol: HTTP, name: http}}
    defaultEndpoint: 127.0.0.1:{app_b}
  egress: [{{hosts: ["~/*"]}}]
"""

PEER_AUTH = """
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{name: default, namespace: shop}}
spec:
  mtls: {{mode: {mode}}}
"""


class Stack:
    """Control plane with a CA, A's and B's sidecars, app B (an echo server)."""

    def __init__(self, ttl: str = "24h"):
        self.dir = tempfile.mkdtemp(prefix="identity-")
        self.config_dir = os.path.join(self.dir, "config")
        self.ca_dir = os.path.join(self.dir, "ca")
        os.makedirs(self.config_dir)
        self.svc_port, self.b_in = free_port(), free_port()
        self.app_b = EchoUpstream("b").start()
        self.write_mesh("ISTIO_MUTUAL")
        self.set_mode("STRICT", wait=False)
        self.ttl = ttl
        self.cp = self._control_plane().start()
        self.a = self._sidecar(A_NODE, "a").start()
        self.b = self._sidecar(B_NODE, "b").start()
        self.wait_serving()

    def write_mesh(self, tls: str) -> None:
        write_config(self.config_dir, "mesh.yaml", MESH.format(host=HOST, svc_port=self.svc_port, b_in=self.b_in,
                                                               app_b=self.app_b.port, tls=tls))

    def restart_control_plane(self) -> None:
        """SIGKILL the control plane and start another on the same ports and CA dir."""
        port, admin = self.cp.port, self.cp.admin_port
        self.cp.kill()
        self.cp.close()
        self.cp = self._control_plane(port=port, admin_port=admin).start()

    def _control_plane(self, **kw) -> ControlPlane:
        return ControlPlane(self.config_dir, extra_args=["--ca-dir", self.ca_dir, "--workload-cert-ttl", self.ttl], **kw)

    def _sidecar(self, node_id: str, app: str) -> Envoy:
        admin = free_port()
        token = node_token_from_dir(self.ca_dir, node_id, NS, app)
        boot = envoy_bootstrap(node_id=node_id, xds_address=self.cp.address, admin_port=admin, labels={"app": app},
                               service_account=app, identity_token=token)
        return Envoy(boot, admin_port=admin)

    def set_mode(self, mode: str, wait: bool = True) -> None:
        before = self.cp.configz()["generation"] if wait else ""
        write_config(self.config_dir, "peer.yaml", PEER_AUTH.format(mode=mode))
        if wait:
            self.cp.wait_generation_change(before)
            time.sleep(1.0)        # Envoy drains the old inbound listener into the new one

    def wait_serving(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.call()[0] == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"A -> B never answered 200\nA:\n{self.a.log_tail()}\nB:\n{self.b.log_tail()}")
            time.sleep(0.2)

    def call(self, headers: dict | None = None, conn=None) -> tuple[int, dict]:
        own = conn is None
        conn = conn or http.client.HTTPConnection("127.0.0.1", self.svc_port, timeout=5)
        try:
            conn.request("GET", "/who", headers={"host": HOST, **(headers or {})})
            resp = conn.getresponse()
            body = resp.read()
            return resp.status, (json.loads(body) if resp.status == 200 else {"body": body.decode(errors="replace")})
        finally:
            if own:
                conn.close()

    def close(self) -> None:
        for p in (self.a, self.b, self.cp, self.app_b):
            try:
                p.close() if hasattr(p, "close") else p.stop()
            except Exception:
                pass


@pytest.fixture(scope="module")
def stack():
    s = Stack()
    try:
        yield s
    finally:
        s.close()


def _direct(stack, context: ssl.SSLContext | None) -> str:
    """Talk to B's inbound listener without A's sidecar; what came back (status line or error)."""
    raw = socket.create_connection(("127.0.0.1", stack.b_in), timeout=5)
    try:
        sock = context.wrap_socket(raw, server_hostname="b") if context else raw
        sock.sendall(f"GET /direct HTTP/1.1\r\nhost: {HOST}\r\nconnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        return data.decode(errors="replace").split("\r\n", 1)[0] or "closed"
    except (ssl.SSLError, OSError) as e:
        return f"refused: {type(e).__name__}"
    finally:
        raw.close()


def test_b_sees_a_spiffe_identity(stack):
    status, seen = stack.call()
    assert status == 200, seen
    headers = seen["headers"]
    assert headers["x-envoy-downstream-service-cluster"] == "spiffe://cluster.local/ns/shop/sa/a"
    assert 'URI=spiffe://cluster.local/ns/shop/sa/a' in headers["x-forwarded-client-cert"]


def test_client_sent_identity_headers_never_reach_b(stack):
    forged = {"x-forwarded-client-cert": 'By=spiffe://cluster.local/ns/shop/sa/b;URI=spiffe://cluster.local/ns/x/sa/admin',
              "x-envoy-downstream-service-cluster": "spiffe://cluster.local/ns/x/sa/admin"}
    status, seen = stack.call(forged)
    assert status == 200
    assert "admin" not in seen["headers"]["x-forwarded-client-cert"]
    assert seen["headers"]["x-envoy-downstream-service-cluster"] == "spiffe://cluster.local/ns/shop/sa/a"


def test_b_presents_its_svid_from_the_mesh_root(stack):
    """What B's sidecar presents to a client holding A's certificate: chains to the CA dir's root, SAN sa/b."""
    from cryptography import x509
    ca = MeshCA.load_or_create(stack.ca_dir)
    cert = ca.issue(NS, "a", 300)
    with tempfile.TemporaryDirectory() as d:
        chain, key, root = (os.path.join(d, n) for n in ("chain.pem", "key.pem", "root.pem"))
        for path, data in ((chain, cert.cert_chain_pem), (key, cert.key_pem), (root, ca.root_pem())):
            with open(path, "wb") as f:
                f.write(data)
        ctx = ssl.create_default_context(cafile=root)
        ctx.check_hostname = False
        ctx.load_cert_chain(chain, key)
        raw = socket.create_connection(("127.0.0.1", stack.b_in), timeout=5)
        with ctx.wrap_socket(raw, server_hostname="b") as s:
            der = s.getpeercert(binary_form=True)
    peer = x509.load_der_x509_certificate(der)
    sans = peer.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(u.value) for u in sans] == ["spiffe://cluster.local/ns/shop/sa/b"]
    assert peer.issuer == ca.root.subject


def test_strict_refuses_plaintext_and_foreign_ca_permissive_accepts_plaintext(stack):
    from harness.certs import self_signed
    stack.set_mode("STRICT")
    assert _direct(stack, None).startswith("refused") or _direct(stack, None) == "closed"
    with tempfile.TemporaryDirectory() as d:
        cert, key = self_signed(d, ["a.shop"])                 # a certificate from another CA
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        ctx.load_cert_chain(cert, key)
        forged = _direct(stack, ctx)
    assert not forged.startswith("HTTP/1.1 200"), forged
    assert stack.call()[0] == 200                            # the mesh client still passes
    stack.set_mode("PERMISSIVE")
    try:
        line = _direct(stack, None)
        assert line.startswith("HTTP/1.1 200"), line
        seen = stack.app_b.requests[-1]
        assert seen["path"] == "/direct"
        assert "x-envoy-downstream-service-cluster" not in seen["headers"]   # no verified peer: no identity
        assert stack.call()[0] == 200
    finally:
        stack.set_mode("STRICT")


def _switch(stack, tls: str, mode: str) -> float:
    """Write the DestinationRule's tls and the PeerAuthentication mode at once; seconds from the
    control plane taking them until A -> B answers 200 again on a new connection."""
    before = stack.cp.configz()["generation"]
    stack.write_mesh(tls)
    write_config(stack.config_dir, "peer.yaml", PEER_AUTH.format(mode=mode))
    stack.cp.wait_generation_change(before)
    start = time.monotonic()
    while time.monotonic() - start < 20:
        try:
            if stack.call()[0] == 200:
                return time.monotonic() - start
        except OSError:
            pass
        time.sleep(0.05)
    return float("inf")


def test_switching_between_plaintext_and_mtls_settles_at_once(stack):
    """DISABLE <-> ISTIO_MUTUAL/STRICT: A's updated cluster warms on the endpoints it already had
    (the control plane sends them again after CDS); it used to wait out Envoy's 15 s initial fetch
    timeout, keeping the old transport meanwhile: 503 'connection termination' from B's new listener."""
    try:
        for tls, mode in (("DISABLE", "DISABLE"), ("ISTIO_MUTUAL", "STRICT")):
            took = _switch(stack, tls, mode)
            assert took < 3.0, f"{tls}/{mode}: A -> B answered 200 only after {took:.1f} s"
            time.sleep(0.5)
            sent, failures, _ = _stream(stack, 1.5, 100)
            assert failures == [] and sent >= 100, failures[:3]
            status, seen = stack.call()
            peer = seen["headers"].get("x-envoy-downstream-service-cluster")
            assert peer == ("spiffe://cluster.local/ns/shop/sa/a" if tls == "ISTIO_MUTUAL" else None)
    finally:
        stack.write_mesh("ISTIO_MUTUAL")
        stack.set_mode("STRICT")
        stack.wait_serving()


def test_auto_mtls_to_tls_mode_istio_endpoints_with_sans_from_service_accounts(stack):
    """No DestinationRule tls: the endpoint labelled security.istio.io/tlsMode=istio gets
    ISTIO_MUTUAL (transport_socket_matches), its SAN checked against the endpoint's serviceAccount."""
    def mesh(sa: str) -> str:
        text = MESH.format(host=HOST, svc_port=stack.svc_port, b_in=stack.b_in, app_b=stack.app_b.port, tls="X")
        text = text.replace("    tls: {mode: X}\n", "").replace('  subjectAltNames: ["spiffe://cluster.local/ns/shop/sa/b"]\n', "")
        return text.replace("endpoints: [{address: 127.0.0.1, ",
                            f"endpoints: [{{address: 127.0.0.1, serviceAccount: {sa}, "
                            "labels: {security.istio.io/tlsMode: istio}, ")
    try:
        for sa, ok in (("b", True), ("someone-else", False)):
            before = stack.cp.configz()["generation"]
            write_config(stack.config_dir, "mesh.yaml", mesh(sa))
            stack.cp.wait_generation_change(before)
            time.sleep(1.0)
            status, seen = stack.call()
            if ok:       # B's listener is STRICT: only mTLS passes, and B saw A's identity
                assert status == 200, seen
                assert seen["headers"]["x-envoy-downstream-service-cluster"] == "spiffe://cluster.local/ns/shop/sa/a"
            else:        # B presents sa/b, not the endpoint's declared account: A refuses it
                assert status == 503, seen
    finally:
        stack.write_mesh("ISTIO_MUTUAL")
        time.sleep(1.0)
        stack.wait_serving()


def test_debug_certs_shows_certificates_not_keys(stack):
    status, text = stack.cp.get("/debug/certs")
    assert status == 200
    certs = json.loads(text)
    assert certs["nodes"][A_NODE]["spiffe_id"] == "spiffe://cluster.local/ns/shop/sa/a"
    assert certs["nodes"][B_NODE]["chain"][0]["san"] == ["spiffe://cluster.local/ns/shop/sa/b"]
    assert "PRIVATE KEY" not in text and "BEGIN" not in text


@pytest.fixture(scope="module")
def short_lived():
    s = Stack(ttl="4s")
    try:
        yield s
    finally:
        s.close()


def _stream(stack, seconds: float, rate: float) -> tuple[int, list, set]:
    """Requests at a fixed rate over one keep-alive connection to A's sidecar:
    (sent, failures, the client-certificate hashes B saw in XFCC)."""
    conn = http.client.HTTPConnection("127.0.0.1", stack.svc_port, timeout=5)
    sent, failures, hashes = 0, [], set()
    start = time.monotonic()
    try:
        while (now := time.monotonic()) - start < seconds:
            try:
                status, seen = stack.call(conn=conn)
            except (OSError, http.client.HTTPException) as e:
                status, seen = 0, {"error": repr(e)}
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", stack.svc_port, timeout=5)
            sent += 1
            if status != 200:
                failures.append((status, seen))
            else:
                xfcc = seen["headers"].get("x-forwarded-client-cert", "")
                hashes.update(p for p in xfcc.split(";") if p.startswith("Hash="))
            time.sleep(max(0.0, start + sent / rate - time.monotonic()))
    finally:
        conn.close()
    return sent, failures, hashes


def _load(stack, seconds: float, rate: float, workers: int) -> tuple[int, list, set]:
    """`rate` req/s in all, spread over `workers` keep-alive connections (threads)."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(workers) as pool:
        parts = list(pool.map(lambda _: _stream(stack, seconds, rate / workers), range(workers)))
    return (sum(p[0] for p in parts), [f for p in parts for f in p[1]], set().union(*(p[2] for p in parts)))


ROTATION_RATE = 200     # req/s, as issue 13 asks


def test_rotation_under_load_drops_nothing(short_lived):
    stack = short_lived
    serial = lambda: json.loads(stack.cp.get("/debug/certs")[1])["nodes"][A_NODE]["chain"][0]["serial"]
    first = serial()
    seconds = 6.0
    sent, failures, hashes = _load(stack, seconds, ROTATION_RATE, workers=4)
    assert sent >= 0.9 * ROTATION_RATE * seconds, f"only {sent / seconds:.0f} req/s were sent"
    assert failures == []
    assert serial() != first                       # the control plane re-issued A's certificate...
    assert len(hashes) >= 2, hashes                # ...and B saw A present more than one certificate


@pytest.fixture()
def restartable():
    # Its own stack with the default 24 h lifetime: with the rotation test's 4 s certificates,
    # a restart slower than their lifetime (a loaded machine) lets them expire before the new
    # control plane re-issues them -- an outage Istio has too, not what this test is about.
    s = Stack()
    try:
        yield s
    finally:
        s.close()


def test_ca_state_survives_a_control_plane_restart(restartable):
    stack = restartable
    root = lambda: json.loads(stack.cp.get("/debug/certs")[1])["root"][0]["sha256"]
    before = root()
    stack.restart_control_plane()
    assert root() == before                        # the same root, read back from --ca-dir
    stack.wait_serving()
    sent, failures, _ = _stream(stack, 2.0, 50)    # certificates issued before and after chain to it
    assert failures == [] and sent >= 80
