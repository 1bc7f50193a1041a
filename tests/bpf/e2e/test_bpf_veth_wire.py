"""The marker on a real interface: a veth pair between two namespaces this
test creates. The client namespace's egress carries the tc programs; the
server namespace reads the DSCP of every segment off the wire (AF_PACKET).
"""
from __future__ import annotations

import os
import socket
import ssl

import pytest

from mcp26.bpf import attach, tc
from mcp26.bpf.policy import build_policy
from mcp26.mesh.qos import ALPN_DSCP, QosClass
from harness.bpf_env import (Capture, TcpServer, VethPair, in_netns, netns_socket, remove_stale_namespaces,
                             require_bpf, self_signed_cert, tcp_segments)

pytestmark = pytest.mark.e2e

TLS_PORT, MARKED_PORT, PLAIN_PORT = 8443, 9100, 9200


class Servers:
    """In the server namespace: a TLS (h2-capable) server and two plain TCP
    servers, each answering every message with `ok`, on IPv4 and IPv6."""

    def __init__(self, pair: VethPair, tmp: str):
        cert, key = self_signed_cert(tmp)
        self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.tls.load_cert_chain(cert, key)
        self.tls.set_alpn_protocols(["h2", "http/1.1"])
        self.servers = []
        self.log: list[str] = []           # what the servers saw, for failure messages
        for addr, family in ((pair.V4[1], socket.AF_INET), (pair.V6[1], socket.AF_INET6)):
            for port in (TLS_PORT, MARKED_PORT, PLAIN_PORT):
                s = netns_socket(pair.server_ns, family)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((addr, port))
                s.listen(16)
                tls = port == TLS_PORT
                self.servers.append(TcpServer(s, lambda conn, tls=tls: self._answer(conn, tls)))

    def _answer(self, conn: socket.socket, tls: bool) -> None:
        self.log.append(f"accepted {conn.getpeername()} on {conn.getsockname()} tls={tls}")
        try:
            if tls:
                conn = self.tls.wrap_socket(conn, server_side=True)
            while conn.recv(4096):
                conn.sendall(b"ok")
        except (OSError, ssl.SSLError) as e:
            self.log.append(f"{conn.getsockname()}: {e!r}")
        finally:
            conn.close()

    def close(self) -> None:
        for srv in self.servers:
            srv.close()


@pytest.fixture(scope="module")
def wire(tmp_path_factory):
    require_bpf()
    remove_stale_namespaces()
    pair = VethPair().create()
    servers = None
    try:
        servers = Servers(pair, str(tmp_path_factory.mktemp("tls")))
        with in_netns(pair.client_ns):
            state = attach.attach(pair.client_if, build_policy(ports=[f"{MARKED_PORT}=interactive"], alpn=True))
        assert state["filters"]["egress"], "the egress filter is not on the interface"
        pair.servers = servers
        yield pair
    finally:
        with in_netns(pair.client_ns):
            attach.detach(pair.client_if)
            left = os.path.exists(attach.pin_dir(pair.client_if))
            clsact = tc.has_clsact(pair.client_if)
        if servers:
            servers.close()
        pair.remove()
    assert not left and not clsact, "detach left pins or the qdisc behind"


def exchange(pair: VethPair, server_ip: str, port: int, use_tls: bool, alpn=("h2",)) -> tuple[int, str | None]:
    """Connects from the client namespace, talks, closes. (client port, negotiated ALPN)."""
    family = socket.AF_INET6 if ":" in server_ip else socket.AF_INET
    raw = netns_socket(pair.client_ns, family)
    raw.settimeout(5)
    raw.connect((server_ip, port))
    sport = raw.getsockname()[1]
    conn, negotiated = raw, None
    if use_tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        ctx.set_alpn_protocols(list(alpn))
        try:
            conn = ctx.wrap_socket(raw, server_hostname="backend.mesh.local")
        except ssl.SSLError as e:
            raise AssertionError(f"TLS from port {sport}: {e}; servers saw: {pair.servers.log[-6:]}") from e
        negotiated = conn.selected_alpn_protocol()
    for _ in range(3):
        conn.sendall(b"request")
        assert conn.recv(16) == b"ok"
    conn.close()
    return sport, negotiated


def client_segments(pair: VethPair, server_ip: str, port: int, use_tls: bool, alpn=("h2",)):
    with in_netns(pair.server_ns):
        cap = Capture(pair.server_if, port)
    try:
        try:
            sport, negotiated = exchange(pair, server_ip, port, use_tls, alpn)
        except AssertionError as e:
            seen = [(f[12:14].hex(), tos, hex(flags), n, f[-n:][:12].hex() if n else "")
                    for tos, flags, n, f in tcp_segments(cap.frames(0.3))]
            raise AssertionError(f"{e}; on the wire: {seen}") from None
        segs = tcp_segments(cap.frames(0.3), dport=port, sport=sport)
    finally:
        cap.close()
    assert segs, "nothing captured"
    return segs, negotiated


@pytest.mark.parametrize("family", ["V4", "V6"])
def test_tls_h2_flow_is_marked_ef_after_its_client_hello(wire, family):
    server_ip = getattr(wire, family)[1]
    segs, negotiated = client_segments(wire, server_ip, TLS_PORT, use_tls=True)
    assert negotiated == "h2"
    syn = [s for s in segs if s[1] & 0x02]
    data = [s for s in segs if s[2] > 0]
    assert syn and syn[0][0] >> 2 == 0, "the SYN precedes the ClientHello and is not marked"
    assert data, "no data segments seen"
    assert {tos >> 2 for tos, *_ in data} == {ALPN_DSCP["h2"]} == {QosClass.LATENCY_CRITICAL.dscp}


def test_tls_http11_flow_is_not_marked(wire):
    segs, negotiated = client_segments(wire, wire.V4[1], TLS_PORT, use_tls=True, alpn=("http/1.1",))
    assert negotiated == "http/1.1"
    assert {tos for tos, *_ in segs} == {0}


@pytest.mark.parametrize("family", ["V4", "V6"])
def test_plain_tcp_to_a_listed_port_is_marked_from_the_syn(wire, family):
    segs, _ = client_segments(wire, getattr(wire, family)[1], MARKED_PORT, use_tls=False)
    assert {tos >> 2 for tos, *_ in segs} == {QosClass.INTERACTIVE.dscp}


@pytest.mark.parametrize("family", ["V4", "V6"])
def test_plain_tcp_elsewhere_is_untouched(wire, family):
    segs, _ = client_segments(wire, getattr(wire, family)[1], PLAIN_PORT, use_tls=False)
    assert {tos for tos, *_ in segs} == {0}


def test_server_side_marker_marks_replies_by_the_client_hello_it_received(wire):
    """Attached on the server's interface too: its TLS replies to an h2 client
    are EF, replies to an http/1.1 client unmarked (read on the client's end)."""
    with in_netns(wire.server_ns):
        attach.attach(wire.server_if, build_policy(alpn=True))
    try:
        for alpn, expected in ((("h2",), {ALPN_DSCP["h2"]}), (("http/1.1",), {0})):
            with in_netns(wire.client_ns):
                cap = Capture(wire.client_if, TLS_PORT)
            try:
                sport, _ = exchange(wire, wire.V4[1], TLS_PORT, use_tls=True, alpn=alpn)
                replies = tcp_segments(cap.frames(0.3), sport=TLS_PORT, dport=sport)
            finally:
                cap.close()
            data = [tos for tos, _, n, _ in replies if n > 0]
            assert data, "no replies captured"
            assert {tos >> 2 for tos in data} == expected, alpn
    finally:
        with in_netns(wire.server_ns):
            attach.detach(wire.server_if)
            assert not tc.has_clsact(wire.server_if)


def test_status_lists_the_classified_tls_flows(wire):
    exchange(wire, wire.V4[1], TLS_PORT, use_tls=True)
    with in_netns(wire.client_ns):
        st = attach.status(wire.client_if, max_flows=1000)[0]
    tls = [f for f in st["flows"] if f["flow"].endswith(f":{TLS_PORT}")]
    assert any(f["alpn"] == "h2" and f["dscp"] == ALPN_DSCP["h2"] for f in tls)
    assert st["ports"] == {MARKED_PORT: QosClass.INTERACTIVE.dscp}
