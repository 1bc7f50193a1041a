"""Compiles the QoS tc programs with bcc and fills their maps from a policy.

Our headers are inlined into one source text before bcc sees it: bcc
rewrites map method calls (`m.lookup(&k)`) only in its main file, and
`#line` directives keep compiler messages pointing at c/<file>:<line>.
"""
from __future__ import annotations

import ctypes as ct
import functools
import os
import pathlib
import re

from mcp26.bpf import layout
from mcp26.bpf.maps import BpfMap
from mcp26.bpf.policy import QosPolicy
from mcp26.bpf.flow_ring import lay_out

C_DIR = pathlib.Path(__file__).resolve().parent / "c"
_INCLUDE = re.compile(r'\s*#include\s+"([^"]+)"')

# name -> (key type, value type) of every map in qos_tc.c; ringbufs have none.
MAP_TYPES = {
    "config": (ct.c_int, layout.QosConfig),
    "mark_dscp": (ct.c_uint32, ct.c_uint8),
    "port_dscp": (ct.c_uint16, ct.c_uint8),
    "cidr_dscp": (layout.CidrKey, ct.c_uint8),
    "alpn_dscp": (layout.AlpnName, ct.c_uint8),
    "flow_alpn": (layout.FlowKey, layout.FlowAlpn),
    "sample_ports": (ct.c_uint16, ct.c_uint8),
    "latency_open": (layout.FlowKey, ct.c_uint64),
    "latency_open_out": (layout.FlowKey, ct.c_uint64),
    "latency_events": (None, None),
    "flow_ring": (None, None),          # BPF_F_MMAPABLE: read through a mapping (bpf/flow_ring.py)
    "flow_ring_bell": (None, None),     # the ring's doorbell: a BPF ring buffer the reader epolls
}
EGRESS, INGRESS = "qos_egress", "qos_ingress"


class BpfUnavailable(RuntimeError):
    """No privilege, no bcc, or a kernel that refuses the programs."""


def inline_source(name: str, seen: set | None = None) -> str:
    seen = set() if seen is None else seen
    if name in seen:
        return ""
    seen.add(name)
    out = [f'#line 1 "{name}"']
    for i, line in enumerate((C_DIR / name).read_text().splitlines(), 1):
        m = _INCLUDE.match(line)
        if m:
            out += [inline_source(m.group(1), seen), f'#line {i + 1} "{name}"']
        else:
            out.append("" if line.strip() == "#pragma once" else line)
    return "\n".join(out) + "\n"


def ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = open("/proc/sys/net/ipv4/ip_local_port_range").read().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def check_privilege() -> None:
    if os.geteuid() != 0:
        raise BpfUnavailable("eBPF QoS needs root (CAP_BPF and CAP_NET_ADMIN); run as root, "
                             "or use the IP_TOS socket-option path (see bpf/README.md)")


@functools.lru_cache(maxsize=1)
def _bcc():
    try:
        import bcc
    except ImportError as e:
        raise BpfUnavailable(f"bcc is not importable ({e}); install Debian python3-bpfcc "
                             "and run `make install`, which links it into .venv") from None
    return bcc


def compile_program(source: str, functions: tuple[str, ...], cflags=()):
    """A loaded bcc.BPF and {function: fd}; BpfUnavailable when the kernel says no."""
    check_privilege()
    bcc = _bcc()
    try:
        b = bcc.BPF(text=source.encode(), cflags=list(cflags))
        fds = {f: b.load_func(f.encode(), bcc.BPF.SCHED_CLS).fd for f in functions}
    except Exception as e:
        raise BpfUnavailable(f"cannot compile or load the tc programs: {e}") from None
    return b, fds


class QosDatapath:
    """One loaded copy of qos_tc.c: its program fds and its maps.

    The fds live as long as this object (bcc closes them in cleanup()); pin
    them (attach.py) to keep the programs past the process.
    """

    def __init__(self):
        self.bpf, self.prog_fds = compile_program(
            inline_source("qos_tc.c"), (EGRESS, INGRESS), layout.CFLAGS)
        self.maps = {}
        for name, (k, v) in MAP_TYPES.items():
            table = self.bpf.get_table(name.encode())
            self.maps[name] = BpfMap(table.map_fd, k, v, name) if k else table
        lay_out(self.map_fd("flow_ring"))       # magic and record size, before any program runs

    def map_fd(self, name: str) -> int:
        return self.maps[name].fd if isinstance(self.maps[name], BpfMap) else self.maps[name].map_fd

    def configure(self, policy: QosPolicy, owner_flags: int = 0) -> None:
        """Replaces every classification entry with the policy's."""
        m = self.maps
        for name in ("mark_dscp", "port_dscp", "cidr_dscp", "alpn_dscp", "sample_ports", "flow_alpn"):
            m[name].clear()
        for mark, dscp in policy.marks.items():
            m["mark_dscp"][mark] = dscp
        for port, dscp in policy.ports.items():
            m["port_dscp"][port] = dscp
        for net, dscp in policy.cidrs.items():
            m["cidr_dscp"][layout.cidr_key(net)] = dscp
        for proto, dscp in policy.alpn_dscp.items():
            name = proto.encode()
            if len(name) >= layout.ALPN_NAME_MAX:
                raise ValueError(f"ALPN protocol {proto!r} longer than {layout.ALPN_NAME_MAX - 1} bytes")
            m["alpn_dscp"][layout.AlpnName(name)] = dscp
        for port in policy.sample_ports:
            m["sample_ports"][port] = 1
        cfg = layout.QosConfig()
        cfg.flags = ((layout.CFG_ALPN if policy.alpn else 0)
                     | (layout.CFG_TFO if policy.tfo else 0)
                     | (layout.CFG_SAMPLE if policy.sample else 0)
                     | (layout.CFG_SAMPLE_LISTED_ONLY if policy.sample_ports else 0))
        cfg.ephemeral_lo, cfg.ephemeral_hi = ephemeral_range()
        cfg.owner_flags = owner_flags
        cfg.tfo_dscp = policy.tfo_dscp
        m["config"][0] = cfg

    def close(self) -> None:
        self.bpf.cleanup()


def load_empty():
    """The baseline program for benchmarks: returns TC_ACT_OK and nothing else."""
    return compile_program(inline_source("empty.c"), ("pass",))
