"""TCP Fast Open marked on the wire: a connection that opens with data in its SYN is EF from
that first packet (the seed's kernel chapter), both ways; one that opens without is left alone.
Two namespaces joined by a veth pair (created and removed here), TFO switched on in each
(`net.ipv4.tcp_fastopen` is per network namespace); the first connection fetches the server's
cookie, the next ones carry data in the SYN - the kernel's own TFO, read off the wire."""
from __future__ import annotations

import socket
import subprocess

import pytest

from mcp26.bpf import attach
from mcp26.bpf.policy import build_policy
from mcp26.mesh.qos import TFO_CLASS
from harness.bpf_env import (Capture, TcpServer, VethPair, in_netns, netns_socket, remove_stale_namespaces,
                             require_bpf, tcp_segments)

pytestmark = pytest.mark.e2e

PORT = 9300
TCP_FASTOPEN = 23
SYN, ACK = 0x02, 0x10


def sysctl(ns: str, value: int) -> None:
    subprocess.run(["nsenter", f"--net=/run/netns/{ns}", "sysctl", "-qw", f"net.ipv4.tcp_fastopen={value}"],
                   check=True, capture_output=True)


def answer(conn: socket.socket) -> None:
    try:
        while conn.recv(4096):
            conn.sendall(b"ok")
    finally:
        conn.close()


@pytest.fixture(scope="module")
def wire():
    require_bpf()
    remove_stale_namespaces()
    pair = VethPair().create()
    servers = []
    try:
        sysctl(pair.client_ns, 1)            # client side on
        sysctl(pair.server_ns, 2)            # server side on (cookies required: the real exchange)
        for addr, family in ((pair.V4[1], socket.AF_INET), (pair.V6[1], socket.AF_INET6)):
            s = netns_socket(pair.server_ns, family)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.setsockopt(socket.IPPROTO_TCP, TCP_FASTOPEN, 16)
            s.bind((addr, PORT))
            s.listen(16)
            servers.append(TcpServer(s, answer))
        for ns, ifname in ((pair.client_ns, pair.client_if), (pair.server_ns, pair.server_if)):
            with in_netns(ns):
                attach.attach(ifname, build_policy(tfo=True))
        yield pair
    finally:
        for ns, ifname in ((pair.client_ns, pair.client_if), (pair.server_ns, pair.server_if)):
            with in_netns(ns):
                attach.detach(ifname)
        for s in servers:
            s.close()
        pair.remove()


def tfo_exchange(pair: VethPair, server_ip: str) -> tuple[list, list]:
    """One connection opened with sendto(MSG_FASTOPEN), three messages; -> (client's segments
    as the server's end saw them, server's segments as the client's end saw them)."""
    family = socket.AF_INET6 if ":" in server_ip else socket.AF_INET
    with in_netns(pair.server_ns):
        at_server = Capture(pair.server_if, PORT)
    with in_netns(pair.client_ns):
        at_client = Capture(pair.client_if, PORT)
    try:
        c = netns_socket(pair.client_ns, family)
        c.sendto(b"request", socket.MSG_FASTOPEN, (server_ip, PORT))    # blocking: connects, data in the SYN
        c.settimeout(5)
        sport = c.getsockname()[1]
        assert c.recv(16) == b"ok"
        for _ in range(2):
            c.sendall(b"request")
            assert c.recv(16) == b"ok"
        c.close()
        out = tcp_segments(at_server.frames(0.3), dport=PORT, sport=sport)
        back = tcp_segments(at_client.frames(0.3), sport=PORT, dport=sport)
    finally:
        at_server.close()
        at_client.close()
    return out, back


@pytest.mark.parametrize("family", ["V4", "V6"])
def test_a_connection_opened_with_data_in_its_syn_is_ef_from_that_syn_both_ways(wire, family):
    server_ip = getattr(wire, family)[1]
    first, _ = tfo_exchange(wire, server_ip)             # no cookie yet: a plain SYN that asks for one
    syn = [s for s in first if s[1] & (SYN | ACK) == SYN]
    assert syn and syn[0][2] == 0, "the first SYN carried data: the kernel had a cookie already"
    assert {tos for tos, *_ in first} == {0}                     # no TFO, no mark
    out, back = tfo_exchange(wire, server_ip)            # with the cookie: data in the SYN
    syn = [s for s in out if s[1] & (SYN | ACK) == SYN]
    assert syn and syn[0][2] > 0, f"no data in the SYN: {[(hex(f), n) for _, f, n, _ in out]}"
    assert {tos >> 2 for tos, *_ in out} == {TFO_CLASS.dscp}     # from its first packet on
    synack = [s for s in back if s[1] & (SYN | ACK) == (SYN | ACK)]
    assert synack and {tos >> 2 for tos, *_ in back} == {TFO_CLASS.dscp}   # the server's side too


def test_status_lists_the_tfo_flows(wire):
    tfo_exchange(wire, wire.V4[1])
    with in_netns(wire.client_ns):
        st = attach.status(wire.client_if, max_flows=1000)[0]
    assert st["tfo"] == TFO_CLASS.dscp
    assert any(f["state"] == "tfo" and f["dscp"] == TFO_CLASS.dscp for f in st["flows"])
