"""The tc programs run by the kernel on crafted packets (BPF_PROG_TEST_RUN).

Every assertion is on the bytes the kernel hands back: the TOS / traffic
class, the IPv4 header checksum, the TCP checksum, and every other byte.
"""
from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from mcp26.bpf import layout, packets as P
from mcp26.bpf.policy import build_policy
from mcp26.bpf.syscall import prog_test_run
from mcp26.mesh.qos import ALPN_DSCP, DSCP_AF41, DSCP_EF, QosClass
from harness.bpf_env import load_datapath

pytestmark = pytest.mark.e2e

C4, S4 = "10.231.0.1", "10.231.0.2"
C6, S6 = "fd00:231::1", "fd00:231::2"


@pytest.fixture(scope="module")
def datapath():
    dp = load_datapath()
    yield dp
    dp.close()


@pytest.fixture
def run(datapath):
    """run(frame, policy=..., mark=0) -> output frame, after (re)configuring the maps."""
    state = {"policy": None}

    def _run(frame: bytes, policy=None, mark: int = 0) -> bytes:
        if policy is not None and policy is not state["policy"]:
            datapath.configure(policy)
            state["policy"] = policy
        r = prog_test_run(datapath.prog_fds["qos_egress"], frame, mark=mark)
        assert r.retval == 0, "QoS programs must always return TC_ACT_OK"
        assert len(r.data) == len(frame)
        return r.data
    return _run


def dscp(frame: bytes) -> int:
    return P.tos_of(frame) >> 2


def assert_only_tos_changed(before: bytes, after: bytes) -> None:
    """Nothing but the TOS byte (and, IPv4, its header checksum) differs."""
    if before[12:14] == b"\x08\x00":
        changed = {i for i in range(len(before)) if before[i] != after[i]}
        assert changed <= {15, 24, 25}, f"bytes {sorted(changed)} changed"
        assert P.ipv4_header_ok(after), "IPv4 header checksum is wrong after the rewrite"
    else:
        changed = {i for i in range(len(before)) if before[i] != after[i]}
        assert changed <= {14, 15}, f"bytes {sorted(changed)} changed"
        # version and flow label are kept
        assert after[14] >> 4 == 6
        assert struct.unpack_from("!I", after, 14)[0] & 0xFFFFF == struct.unpack_from("!I", before, 14)[0] & 0xFFFFF
    assert P.tcp_checksum_ok(after)


PORTS = build_policy(ports=["8080=latency-critical", "9000=34"])


@pytest.mark.parametrize("src,dst", [(C4, S4), (C6, S6)], ids=["ipv4", "ipv6"])
def test_matching_destination_port_gets_the_class_dscp(run, src, dst):
    frame = P.tcp_frame(src, dst, 40000, 8080, b"GET / HTTP/1.1\r\n\r\n", flow_label=0xABCDE if ":" in src else 0)
    out = run(frame, PORTS)
    assert dscp(out) == QosClass.LATENCY_CRITICAL.dscp == DSCP_EF
    assert_only_tos_changed(frame, out)


@pytest.mark.parametrize("src,dst", [(C4, S4), (C6, S6)], ids=["ipv4", "ipv6"])
def test_other_ports_pass_unchanged(run, src, dst):
    frame = P.tcp_frame(src, dst, 40000, 8081, b"GET / HTTP/1.1\r\n\r\n")
    assert run(frame, PORTS) == frame


def test_source_port_marks_the_servers_responses(run):
    frame = P.tcp_frame(S4, C4, 9000, 40000, b"HTTP/1.1 200 OK\r\n")
    out = run(frame, PORTS)
    assert dscp(out) == DSCP_AF41
    assert_only_tos_changed(frame, out)


@pytest.mark.parametrize("src,dst", [(C4, S4), (C6, S6)], ids=["ipv4", "ipv6"])
def test_ecn_bits_are_kept(run, src, dst):
    frame = P.tcp_frame(src, dst, 40000, 8080, b"x", tos=0x03)
    out = run(frame, PORTS)
    assert P.tos_of(out) == (DSCP_EF << 2) | 0x03
    assert_only_tos_changed(frame, out)


def test_remarking_an_already_marked_packet_fixes_the_checksum(run):
    frame = P.tcp_frame(C4, S4, 40000, 9000, b"x", tos=DSCP_EF << 2)
    out = run(frame, PORTS)
    assert dscp(out) == DSCP_AF41
    assert_only_tos_changed(frame, out)


def test_destination_cidr_ipv4_and_ipv6(run):
    policy = build_policy(cidrs=["10.231.0.0/24=batch", "fd00:231::/64=interactive"])
    out4 = run(P.tcp_frame(C4, S4, 40000, 5555, b"x"), policy)
    out6 = run(P.tcp_frame(C6, S6, 40000, 5555, b"x"), policy)
    other = P.tcp_frame(C4, "10.232.0.2", 40000, 5555, b"x")
    assert (dscp(out4), dscp(out6)) == (QosClass.BATCH.dscp, QosClass.INTERACTIVE.dscp)
    assert run(other, policy) == other


def test_socket_mark_selects_the_class_before_the_port(run):
    policy = build_policy(marks=["0x2e=latency-critical"], ports=["8080=batch"])
    frame = P.tcp_frame(C4, S4, 40000, 8080, b"x")
    assert dscp(run(frame, policy, mark=0x2E)) == DSCP_EF
    assert dscp(run(frame, policy, mark=0x99)) == QosClass.BATCH.dscp   # unknown mark: port decides
    assert dscp(run(frame, policy)) == QosClass.BATCH.dscp


def test_non_ip_and_udp_pass_unchanged(run):
    arp = b"\xff" * 6 + b"\x02" * 6 + b"\x08\x06" + b"\x00" * 28
    assert run(arp, PORTS) == arp
    udp = bytearray(P.tcp_frame(C4, S4, 40000, 8080, b"x"))
    udp[23] = 17
    udp[24:26] = b"\0\0"
    udp[24:26] = struct.pack("!H", P.checksum(bytes(udp[14:34])))
    # UDP to port 8080 is not TCP: ports do not apply, CIDRs would.
    assert run(bytes(udp), PORTS) == bytes(udp)


# --- TLS ALPN -----------------------------------------------------------------

ALPN = build_policy(alpn=True)
_port = iter(range(41000, 60000))


def hello_frame(payload: bytes, v6: bool = False, sport: int | None = None) -> bytes:
    src, dst = (C6, S6) if v6 else (C4, S4)
    return P.tcp_frame(src, dst, sport or next(_port), 443, payload)


def flow_state(datapath, frame: bytes):
    for key, val in datapath.maps["flow_alpn"].items():
        if key.sport == struct.unpack_from("!H", frame, 34 if frame[12:14] == b"\x08\x00" else 54)[0]:
            return layout.ALPN_STATE_NAMES[val.state], val.proto.decode()
    return None


@pytest.mark.parametrize("offered,expected", [
    (["h2"], DSCP_EF),
    (["grpc-exp"], DSCP_AF41),
    (["http/1.1"], None),
    (["h2", "http/1.1"], DSCP_EF),
    (["http/1.1", "grpc-exp", "h2"], DSCP_AF41),   # the client's first classed preference
    (["spdy/3", "acme-tls/1", "http/1.0", "http/1.1", "h3", "h2c", "h2"], DSCP_EF),
    (None, None),                                  # no ALPN extension
])
@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
def test_client_hello_alpn_selects_dscp(run, datapath, offered, expected, v6):
    assert ALPN_DSCP == {"h2": DSCP_EF, "grpc-exp": DSCP_AF41}
    frame = hello_frame(P.client_hello(offered), v6=v6)
    out = run(frame, ALPN)
    if expected is None:
        assert out == frame
    else:
        assert dscp(out) == expected
        assert_only_tos_changed(frame, out)
    state = flow_state(datapath, frame)
    if offered is None:
        assert state == ("no-alpn", "")
    elif expected is None:
        assert state == ("unclassed", offered[0])
    else:
        assert state[0] == "classed"


@pytest.mark.parametrize("offered,expected", [(["h2"], DSCP_EF), (["grpc-exp", "h2"], DSCP_AF41),
                                              (["http/1.1"], None)])
def test_real_openssl_client_hello(run, offered, expected):
    frame = hello_frame(P.openssl_client_hello(offered))
    out = run(frame, ALPN)
    assert (dscp(out) if out != frame else None) == expected


def test_later_packets_of_a_classed_flow_are_marked_and_syn_resets(run):
    sport = next(_port)
    run(hello_frame(P.client_hello(["h2"]), sport=sport), ALPN)
    data = hello_frame(b"\x17\x03\x03\x00\x05hello", sport=sport)
    assert dscp(run(data)) == DSCP_EF
    # A new connection on the same 4-tuple: its first data segment decides afresh.
    syn = P.tcp_frame(C4, S4, sport, 443, flags=P.TCP_SYN)
    assert run(syn) == syn
    plain = hello_frame(b"GET / HTTP/1.1\r\n\r\n", sport=sport)
    assert run(plain) == plain
    assert run(data) == data


def test_only_the_first_data_segment_is_parsed(run):
    sport = next(_port)
    first = hello_frame(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", sport=sport)
    assert run(first, ALPN) == first
    late_hello = hello_frame(P.client_hello(["h2"]), sport=sport)
    assert run(late_hello) == late_hello


def test_alpn_off_leaves_tls_unmarked(run):
    frame = hello_frame(P.client_hello(["h2"]))
    assert run(frame, build_policy(ports=["1=1"])) == frame


def _alpn_offset(hello: bytes) -> int:
    return hello.index(b"\x00\x10\x00")      # extension type 16, then its length


def test_truncated_client_hellos_pass_unchanged(run):
    hello = P.client_hello(["h2", "http/1.1"])
    alpn_end = _alpn_offset(hello) + 4 + struct.unpack_from("!H", hello, _alpn_offset(hello) + 2)[0]
    for cut in range(1, alpn_end):
        frame = hello_frame(hello[:cut])
        assert run(frame, ALPN) == frame, f"cut at {cut} of {len(hello)}"


def test_segment_holding_a_whole_alpn_extension_is_classed(run):
    # Large ClientHellos span segments; the ALPN extension is read if it is
    # wholly in the first one.
    hello = P.client_hello(["h2"])
    alpn_end = _alpn_offset(hello) + 4 + struct.unpack_from("!H", hello, _alpn_offset(hello) + 2)[0]
    assert dscp(run(hello_frame(hello[:alpn_end]), ALPN)) == DSCP_EF


def _mutate(hello: bytes, offset: int, value: bytes) -> bytes:
    return hello[:offset] + value + hello[offset + len(value):]


def test_malformed_client_hellos_pass_unchanged(run):
    hello = P.client_hello(["h2"])
    a = _alpn_offset(hello)
    cases = {
        "alpn list longer than extension": _mutate(hello, a + 4, b"\x00\x09"),
        "alpn list shorter than extension": _mutate(hello, a + 4, b"\x00\x02"),
        "zero-length protocol name": _mutate(hello, a + 6, b"\x00"),
        "protocol name overruns list": _mutate(hello, a + 6, b"\x05"),
        "extension overruns block": _mutate(hello, a + 2, b"\x7f\xff"),
        "not a handshake record": _mutate(hello, 0, b"\x17"),
        "server hello": _mutate(hello, 5, b"\x02"),
        "handshake longer than record": _mutate(hello, 3, b"\x00\x10"),
        # record 5 + handshake 4 + version 2 + random 32 + session id 33 + suites 6 + compression 2
        "extensions length wrong": _mutate(hello, 84, struct.pack("!H", struct.unpack_from("!H", hello, 84)[0] + 1)),
        "session id overruns": _mutate(hello, 43, b"\xff"),
    }
    for name, payload in cases.items():
        frame = hello_frame(payload)
        assert run(frame, ALPN) == frame, name


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_client_hellos_never_break_the_packet(run, data):
    """Any corruption: the packet keeps its length and valid checksums, and is
    marked EF or left alone (never some other class)."""
    hello = bytearray(P.client_hello(["h2"]))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(hello) - 1))
        hello[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(1, len(hello)))
    frame = hello_frame(bytes(hello[:cut]))
    out = run(frame, ALPN)
    assert out == frame or dscp(out) == DSCP_EF
    assert P.ipv4_header_ok(out) and P.tcp_checksum_ok(out)


def test_an_arriving_client_hello_classes_the_servers_replies(run, datapath):
    """Ingress sees the ClientHello; the server's egress replies get its class."""
    sport = next(_port)
    hello = P.tcp_frame(C4, S4, sport, 443, P.client_hello(["grpc-exp"]))
    reply = P.tcp_frame(S4, C4, 443, sport, b"\x16\x03\x03\x00\x05hello")
    run(reply, ALPN)                                         # configure only; no entry yet
    datapath.maps["flow_alpn"].clear()
    r = prog_test_run(datapath.prog_fds["qos_ingress"], hello)
    assert r.retval == 0 and r.data == hello                 # ingress never rewrites
    out = run(reply)
    assert dscp(out) == DSCP_AF41
    assert_only_tos_changed(reply, out)
    # A new connection (SYN arriving) on the same tuple forgets it.
    prog_test_run(datapath.prog_fds["qos_ingress"], P.tcp_frame(C4, S4, sport, 443, flags=P.TCP_SYN))
    plain = P.tcp_frame(S4, C4, 443, sport, b"220 smtp ready\r\n")
    assert run(plain) == plain
