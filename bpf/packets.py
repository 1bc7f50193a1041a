"""Crafted frames for BPF_PROG_TEST_RUN: Ethernet + IPv4/IPv6 + TCP, and TLS
ClientHellos with chosen ALPN lists. Used by the tests and the benchmark.
"""
from __future__ import annotations

import ipaddress
import os
import ssl
import struct

ETH_P_IP, ETH_P_IPV6 = 0x0800, 0x86DD
TCP_PSH_ACK, TCP_SYN = 0x18, 0x02


def checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def tcp_frame(src: str, dst: str, sport: int, dport: int, payload: bytes = b"",
              flags: int = TCP_PSH_ACK, tos: int = 0, flow_label: int = 0) -> bytes:
    """An Ethernet frame holding one TCP segment, checksums valid."""
    s, d = ipaddress.ip_address(src), ipaddress.ip_address(dst)
    tcp = struct.pack("!HHIIBBHHH", sport, dport, 1, 1, 5 << 4, flags, 65535, 0, 0) + payload
    if s.version == 4:
        pseudo = s.packed + d.packed + struct.pack("!BBH", 0, 6, len(tcp))
        tcp = tcp[:16] + struct.pack("!H", checksum(pseudo + tcp)) + tcp[18:]
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, tos, 20 + len(tcp), 1, 0x4000, 64, 6, 0, s.packed, d.packed)
        ip = ip[:10] + struct.pack("!H", checksum(ip)) + ip[12:]
        ethertype = ETH_P_IP
    else:
        pseudo = s.packed + d.packed + struct.pack("!IxxxB", len(tcp), 6)
        tcp = tcp[:16] + struct.pack("!H", checksum(pseudo + tcp)) + tcp[18:]
        ip = struct.pack("!IHBB16s16s", (6 << 28) | (tos << 20) | flow_label, len(tcp), 6, 64, s.packed, d.packed)
        ethertype = ETH_P_IPV6
    eth = b"\x02\0\0\0\0\x02" + b"\x02\0\0\0\0\x01" + struct.pack("!H", ethertype)
    return eth + ip + tcp


def tos_of(frame: bytes) -> int:
    """The TOS (IPv4) or traffic class (IPv6) byte of an Ethernet frame."""
    ethertype = struct.unpack_from("!H", frame, 12)[0]
    if ethertype == ETH_P_IP:
        return frame[15]
    return (struct.unpack_from("!I", frame, 14)[0] >> 20) & 0xFF


def ipv4_header_ok(frame: bytes) -> bool:
    ihl = (frame[14] & 0xF) * 4
    return checksum(frame[14:14 + ihl]) == 0


def tcp_checksum_ok(frame: bytes) -> bool:
    ethertype = struct.unpack_from("!H", frame, 12)[0]
    if ethertype == ETH_P_IP:
        ihl = (frame[14] & 0xF) * 4
        total = struct.unpack_from("!H", frame, 16)[0]
        tcp = frame[14 + ihl:14 + total]
        pseudo = frame[26:34] + struct.pack("!BBH", 0, 6, len(tcp))
    else:
        plen = struct.unpack_from("!H", frame, 18)[0]
        tcp = frame[54:54 + plen]
        pseudo = frame[22:54] + struct.pack("!IxxxB", len(tcp), 6)
    return checksum(pseudo + tcp) == 0


def _ext(ext_type: int, body: bytes) -> bytes:
    return struct.pack("!HH", ext_type, len(body)) + body


def alpn_extension(protocols: list[bytes]) -> bytes:
    lst = b"".join(bytes([len(p)]) + p for p in protocols)
    return _ext(16, struct.pack("!H", len(lst)) + lst)


def client_hello(alpn: list[str] | None, extra_before: int = 2, session_id: bytes = b"\x11" * 32) -> bytes:
    """A TLS 1.2-framed ClientHello record; ALPN after `extra_before` other extensions."""
    exts = [_ext(0, struct.pack("!HBH", 12, 0, 9) + b"localhost"),   # server_name
            _ext(10, struct.pack("!HHH", 4, 0x1D, 0x17)),            # supported_groups
            _ext(13, struct.pack("!HHH", 4, 0x0403, 0x0804))][:extra_before]
    if alpn is not None:
        exts.append(alpn_extension([p.encode() for p in alpn]))
    exts.append(_ext(43, b"\x02\x03\x04"))                          # supported_versions
    ext_block = b"".join(exts)
    body = (b"\x03\x03" + os.urandom(32) + bytes([len(session_id)]) + session_id
            + struct.pack("!H", 4) + b"\x13\x01\x13\x02" + b"\x01\x00"
            + struct.pack("!H", len(ext_block)) + ext_block)
    hs = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + struct.pack("!H", len(hs)) + hs


def openssl_client_hello(alpn: list[str] | None) -> bytes:
    """The ClientHello this machine's OpenSSL (Python's ssl) sends."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if alpn:
        ctx.set_alpn_protocols(alpn)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    conn = ctx.wrap_bio(incoming, outgoing, server_hostname="backend.mesh.local")
    try:
        conn.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()
