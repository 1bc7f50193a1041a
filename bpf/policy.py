"""What the QoS datapath should do on one interface, validated before use.

Pure logic: parsing `PORT=DSCP`, `CIDR=DSCP`, `MARK=DSCP` specs into a
`QosPolicy`. A DSCP is given as a number (0-63) or a QoS class name from
mcp26.mesh.qos ("latency-critical" -> 46). Any bad spec raises PolicyError naming
it, before anything is loaded.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from mcp26.mesh.qos import ALPN_DSCP, QOS_CLASS_NAMES, TFO_CLASS, QosClass


class PolicyError(ValueError):
    pass


@dataclass(frozen=True)
class QosPolicy:
    ports: dict[int, int] = field(default_factory=dict)        # TCP port -> DSCP
    cidrs: dict[ipaddress.IPv4Network | ipaddress.IPv6Network, int] = field(default_factory=dict)
    marks: dict[int, int] = field(default_factory=dict)        # SO_MARK -> DSCP
    alpn: bool = False                                         # classify by ALPN_DSCP
    alpn_dscp: dict[str, int] = field(default_factory=lambda: dict(ALPN_DSCP))
    sample: bool = False                                       # latency sampler
    sample_ports: frozenset[int] = frozenset()                 # empty: non-ephemeral ports
    tfo: bool = False                                          # mark TCP Fast Open connections
    tfo_dscp: int = TFO_CLASS.dscp

    @property
    def needs_ingress(self) -> bool:
        """The ingress program classes replies by ALPN or TFO and opens latency samples."""
        return self.alpn or self.sample or self.tfo

    def describe(self) -> dict:
        return {
            "ports": {str(p): d for p, d in sorted(self.ports.items())},
            "cidrs": {str(n): d for n, d in self.cidrs.items()},
            "marks": {hex(m): d for m, d in sorted(self.marks.items())},
            "alpn": dict(self.alpn_dscp) if self.alpn else {},
            "sample": self.sample,
            "sample_ports": sorted(self.sample_ports),
            "tfo": self.tfo_dscp if self.tfo else None,
        }


def parse_dscp(text: str, spec: str) -> int:
    text = text.strip()
    if text.isdigit():
        value = int(text)
        if not 0 <= value <= 63:
            raise PolicyError(f"{spec!r}: DSCP {value} outside 0-63")
        return value
    try:
        return QosClass.parse(text).dscp
    except ValueError:
        raise PolicyError(f"{spec!r}: {text!r} is neither a DSCP (0-63) nor a QoS class "
                          f"({', '.join(QOS_CLASS_NAMES)})") from None


def _split(spec: str, what: str) -> tuple[str, str]:
    key, sep, value = spec.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise PolicyError(f"{spec!r}: expected {what}=DSCP")
    return key.strip(), value


def parse_port(text: str, spec: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise PolicyError(f"{spec!r}: port {text!r} is not 1-65535")
    return int(text)


def parse_port_spec(spec: str) -> tuple[int, int]:
    port, dscp = _split(spec, "PORT")
    return parse_port(port, spec), parse_dscp(dscp, spec)


def parse_cidr_spec(spec: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, int]:
    cidr, dscp = _split(spec, "CIDR")
    try:
        net = ipaddress.ip_network(cidr, strict=True)
    except ValueError as e:
        raise PolicyError(f"{spec!r}: {e}") from None
    return net, parse_dscp(dscp, spec)


def parse_mark_spec(spec: str) -> tuple[int, int]:
    mark, dscp = _split(spec, "MARK")
    try:
        value = int(mark, 0)
    except ValueError:
        raise PolicyError(f"{spec!r}: mark {mark!r} is not an integer") from None
    if not 0 < value < 2**32:
        raise PolicyError(f"{spec!r}: mark must be 1..2^32-1 (0 means unmarked)")
    return value, parse_dscp(dscp, spec)


def build_policy(ports=(), cidrs=(), marks=(), alpn=False, sample=False, sample_ports=(), tfo=False) -> QosPolicy:
    """A policy from CLI-style specs; every error is collected and raised together."""
    errors: list[str] = []
    out: dict[str, dict] = {"ports": {}, "cidrs": {}, "marks": {}}
    for name, specs, parse in (("ports", ports, parse_port_spec), ("cidrs", cidrs, parse_cidr_spec),
                               ("marks", marks, parse_mark_spec)):
        for spec in specs:
            try:
                key, dscp = parse(spec)
            except PolicyError as e:
                errors.append(str(e))
                continue
            if key in out[name] and out[name][key] != dscp:
                errors.append(f"{spec!r}: {key} already set to DSCP {out[name][key]}")
            out[name][key] = dscp
    listed = set()
    for p in sample_ports:
        try:
            listed.add(parse_port(str(p), str(p)))
        except PolicyError as e:
            errors.append(str(e))
    if errors:
        raise PolicyError("; ".join(errors))
    return QosPolicy(ports=out["ports"], cidrs=out["cidrs"], marks=out["marks"], alpn=alpn,
                     sample=sample or bool(listed), sample_ports=frozenset(listed), tfo=tfo)
