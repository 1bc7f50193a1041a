"""The C programs' map layouts and flags, defined once here.

The constants are handed to the compiler as -D flags (see program.py) and the
ctypes structures mirror the C structs in c/*.h field for field, so user space
and the kernel read the same bytes.
"""
from __future__ import annotations

import ctypes as ct
import ipaddress

from mcp26.mesh import flow_ring

# qos_config.flags
CFG_ALPN = 1                # classify flows by TLS ALPN
CFG_SAMPLE = 2              # run the latency sampler
CFG_SAMPLE_LISTED_ONLY = 4  # sample only the listed service ports
CFG_TFO = 8                 # mark connections opened with TCP Fast Open (data in the SYN)

# qos_config.owner_flags: user space's own bookkeeping, kept with the maps so
# that a later `mcpctl bpf detach` knows what `attach` did.
OWNER_CREATED_QDISC = 1

# What the first data segment of a flow told the ALPN classifier.
ALPN_NOT_CLIENT_HELLO = 0   # not a ClientHello, or truncated / malformed
ALPN_NO_EXTENSION = 1       # a ClientHello without ALPN
ALPN_UNCLASSED = 2          # ALPN offered, no protocol of it has a class
ALPN_CLASSED = 3            # the flow is marked with the protocol's DSCP
FLOW_TFO = 4                # the flow opened with TCP Fast Open: marked with qos_config.tfo_dscp
ALPN_STATE_NAMES = {ALPN_NOT_CLIENT_HELLO: "not-client-hello", ALPN_NO_EXTENSION: "no-alpn",
                    ALPN_UNCLASSED: "unclassed", ALPN_CLASSED: "classed", FLOW_TFO: "tfo"}

ALPN_NAME_MAX = 16          # key size; protocol names up to 15 bytes are matched
TLS_MAX_EXTENSIONS = 32     # loop bounds the verifier sees
ALPN_MAX_PROTOCOLS = 8

CFLAGS = [f"-D{name}={value}" for name, value in {
    "CFG_ALPN": CFG_ALPN, "CFG_SAMPLE": CFG_SAMPLE, "CFG_SAMPLE_LISTED_ONLY": CFG_SAMPLE_LISTED_ONLY,
    "CFG_TFO": CFG_TFO, "FLOW_TFO": FLOW_TFO,
    "ALPN_NOT_CLIENT_HELLO": ALPN_NOT_CLIENT_HELLO, "ALPN_NO_EXTENSION": ALPN_NO_EXTENSION,
    "ALPN_UNCLASSED": ALPN_UNCLASSED, "ALPN_CLASSED": ALPN_CLASSED,
    "ALPN_NAME_MAX": ALPN_NAME_MAX, "TLS_MAX_EXTENSIONS": TLS_MAX_EXTENSIONS,
    "ALPN_MAX_PROTOCOLS": ALPN_MAX_PROTOCOLS,
    **flow_ring.C_DEFINES,      # the flow ring's layout (c/flow_ring.h), defined in mesh/flow_ring.py
}.items()]


class QosConfig(ct.Structure):
    _fields_ = [("flags", ct.c_uint32), ("ephemeral_lo", ct.c_uint16), ("ephemeral_hi", ct.c_uint16),
                ("owner_flags", ct.c_uint32), ("tfo_dscp", ct.c_uint8), ("pad", ct.c_uint8 * 3)]


class FlowKey(ct.Structure):
    _fields_ = [("saddr", ct.c_uint8 * 16), ("daddr", ct.c_uint8 * 16),
                ("sport", ct.c_uint16), ("dport", ct.c_uint16), ("pad", ct.c_uint32)]

    def __str__(self) -> str:
        return f"{_endpoint(bytes(self.saddr), self.sport)} -> {_endpoint(bytes(self.daddr), self.dport)}"


class FlowAlpn(ct.Structure):
    _fields_ = [("state", ct.c_uint8), ("dscp", ct.c_uint8), ("len", ct.c_uint8), ("pad", ct.c_uint8),
                ("proto", ct.c_char * ALPN_NAME_MAX)]


class AlpnName(ct.Structure):
    _fields_ = [("name", ct.c_char * ALPN_NAME_MAX)]


class CidrKey(ct.Structure):
    _fields_ = [("prefixlen", ct.c_uint32), ("addr", ct.c_uint8 * 16)]


class LatencyEvent(ct.Structure):
    _fields_ = [("latency_ns", ct.c_uint64), ("port", ct.c_uint16), ("family", ct.c_uint8),
                ("pad", ct.c_uint8 * 5),
                # c/latency.h: the flow (client -> server; struct flow_key), request bytes, time
                ("saddr", ct.c_uint8 * 16), ("daddr", ct.c_uint8 * 16), ("sport", ct.c_uint16),
                ("dport", ct.c_uint16), ("flow_pad", ct.c_uint32), ("payload_bytes", ct.c_uint64),
                ("ts_ns", ct.c_uint64)]


def mapped_address(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bytes:
    """The 16 bytes the programs key addresses by (IPv4 as ::ffff:a.b.c.d)."""
    if addr.version == 4:
        return ipaddress.IPv6Address(f"::ffff:{addr}").packed
    return addr.packed


def cidr_key(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> CidrKey:
    key = CidrKey()
    key.prefixlen = net.prefixlen + (96 if net.version == 4 else 0)
    key.addr[:] = mapped_address(net.network_address)
    return key


def _endpoint(packed: bytes, port: int) -> str:
    addr = ipaddress.IPv6Address(packed)
    if addr.ipv4_mapped:
        return f"{addr.ipv4_mapped}:{port}"
    return f"[{addr}]:{port}"
