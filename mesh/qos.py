"""QoS classes: the one definition of class names, DSCP values, priority levels,
batch-slot weights, and the seed's `X-LLM-Priority` names.

A request's class is computed in the sidecar (Wasm filter) and carried in the
`x-mcp-qos-class` header; the backend's priority queues read it, the eBPF
marker and the `IP_TOS` socket options turn it into a DSCP on the wire.

The seed's four `X-LLM-Priority` levels, one to a class, so that each rule of
its decision table hits the requests it names (scheduler/loop/builtin_policy.py):

| X-LLM-Priority | class            | level | DSCP | in the batcher                                   | the seed's rule that names it |
| -------------- | ---------------- | ----- | ---- | ------------------------------------------------ | ----------------------------- |
| critical       | latency-critical | 1     | EF   | strict: first, on a reserved lane of 2 threads    | RTT < 50 ms and payload > 1 MB: the flow upgraded to Critical, 2 threads reserved for its request's lifetime |
| high           | interactive      | 2     | AF41 | weight 3 (3x the default); freezes Low while queued | `high`: thread weight 3x, low-priority inference frozen while it runs |
| medium         | standard         | 3     | AF21 | weight 1 (the default class)                     | GPU memory > 90 %: Medium served as Low for 60 s |
| low            | batch            | 4     | CS1  | no weight: the slots the others leave (Triton's order); frozen while Critical or High is queued | (frozen by `high`; the downgrade's target) |

A request without the header gets DEFAULT_QOS_CLASS (Medium). Weights are each
class's share of batch slots among the shared levels (2..3) while they all wait
(batch_formation.py "Weighted share"); level 1 goes first, level 4 (weight 0) after
them, so that Medium downgraded to Low yields to Medium as the seed's rule means.
A policy's `classWeights` may give Low a share.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass


# DiffServ code points (RFC 4594 / RFC 2474 names).
DSCP_EF = 46     # expedited forwarding
DSCP_AF41 = 34   # assured forwarding class 4, low drop
DSCP_AF21 = 18
DSCP_CS1 = 8     # lower effort
DSCP_BE = 0      # best effort


@dataclass(frozen=True)
class _ClassInfo:
    name: str
    dscp: int
    priority_level: int   # Triton's convention: 1 is the highest
    weight: int           # share of batch slots among the shared levels; 0: not shared (level order)


class QosClass(enum.Enum):
    LATENCY_CRITICAL = _ClassInfo("latency-critical", DSCP_EF, 1, 0)
    INTERACTIVE = _ClassInfo("interactive", DSCP_AF41, 2, 3)
    STANDARD = _ClassInfo("standard", DSCP_AF21, 3, 1)
    BATCH = _ClassInfo("batch", DSCP_CS1, 4, 0)    # Low: behind the shared levels, as in Triton

    @property
    def header_value(self) -> str:
        return self.value.name

    @property
    def dscp(self) -> int:
        return self.value.dscp

    @property
    def tos(self) -> int:
        """The IPv4 TOS / IPv6 traffic-class byte: DSCP in the upper six bits."""
        return self.value.dscp << 2

    @property
    def priority_level(self) -> int:
        return self.value.priority_level

    @property
    def weight(self) -> int:
        return self.value.weight

    @classmethod
    def parse(cls, value: str) -> "QosClass":
        for c in cls:
            if c.value.name == value.strip().lower():
                return c
        raise ValueError(f"unknown QoS class {value!r}; expected one of {', '.join(QOS_CLASS_NAMES)}")


QOS_CLASS_NAMES = tuple(c.value.name for c in QosClass)
PRIORITY_LEVELS = len(QosClass)          # the batcher's priority_levels
DEFAULT_QOS_CLASS = QosClass.STANDARD

# `X-LLM-Priority` values a client may send -> class (the table in the module docstring).
LLM_PRIORITY_CLASSES = {
    "critical": QosClass.LATENCY_CRITICAL,
    "high": QosClass.INTERACTIVE,
    "medium": QosClass.STANDARD,
    "low": QosClass.BATCH,
}
LLM_PRIORITY_NAMES = tuple(LLM_PRIORITY_CLASSES)

# The seed's rules in these terms (scheduler/loop/builtin_policy.py carries them out).
DOWNGRADE_FROM, DOWNGRADE_TO = LLM_PRIORITY_CLASSES["medium"], LLM_PRIORITY_CLASSES["low"]
UPGRADE_TO = LLM_PRIORITY_CLASSES["critical"]
RESERVED_THREADS = 2                         # the lane an upgraded (Critical) request runs on
HIGH_WEIGHT_CLASS = LLM_PRIORITY_CLASSES["high"]
# While a class of these levels is queued, batches of FROZEN_LEVELS are not started.
FREEZE_WHILE_LEVELS = (QosClass.LATENCY_CRITICAL.priority_level, HIGH_WEIGHT_CLASS.priority_level)
FROZEN_LEVELS = (LLM_PRIORITY_CLASSES["low"].priority_level,)


def default_level_weights() -> dict[int, int]:
    """Level -> batch-slot weight of the shared levels (the class table's)."""
    return {c.priority_level: c.weight for c in QosClass if c.weight}

# TLS ALPN protocol -> DSCP (and the class that carries it).
ALPN_CLASSES = {
    "h2": QosClass.LATENCY_CRITICAL,      # DSCP 46 / EF
    "grpc-exp": QosClass.INTERACTIVE,     # DSCP 34 / AF41
}
ALPN_DSCP = {alpn: c.dscp for alpn, c in ALPN_CLASSES.items()}

# A TCP connection that opens with Fast Open (its SYN carries data): the seed's kernel chapter
# marks it EF from that first packet (bpf/c/qos_tc.c).
TFO_CLASS = QosClass.LATENCY_CRITICAL


# A DestinationRule (or its subset) annotated with this gets the class's DSCP
# on its upstream connections via IP_TOS socket options (the no-eBPF path).
QOS_CLASS_ANNOTATION = "qos.mcp-mesh.io/class"


def subset_qos_annotation(subset: str) -> str:
    """The per-subset key (Istio subsets carry no annotations of their own):
    `qos.mcp-mesh.io/class.<subset>` on the DestinationRule, overriding the
    rule-wide `qos.mcp-mesh.io/class` for that subset's clusters."""
    return f"{QOS_CLASS_ANNOTATION}.{subset}"


def qos_class_for(annotations: dict, subset: str = "") -> "QosClass | None":
    """The class a DestinationRule's annotations give a subset (or the rule);
    None when unannotated. ValueError names an unknown class."""
    value = (annotations or {}).get(subset_qos_annotation(subset)) if subset else None
    if value is None:
        value = (annotations or {}).get(QOS_CLASS_ANNOTATION)
    return None if value is None else QosClass.parse(str(value))


def class_for_priority_level(level: int) -> QosClass:
    for c in QosClass:
        if c.priority_level == level:
            return c
    raise ValueError(f"priority level {level} outside 1..{PRIORITY_LEVELS}")
