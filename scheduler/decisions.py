"""What the decision loop feeds a policy and what a policy answers: the one
definition both the loop (scheduler/loop/) and the policy plugins
(scheduler/plugins/, Python compiled to Wasm components) use. Plain data, so
it maps one to one onto the plugins' WIT records.

The seed's decision table, in these terms (the built-in default policy; its X-LLM-Priority
names are mesh.qos's table: Critical, High, Medium, Low -> latency-critical, interactive,
standard, batch):
  accelerator memory > 90 %            -> Action("remap-class", "standard" -> "batch", hold 60 s)
  flow RTT < 50 ms and payload > 1 MB  -> Action("upgrade-flow", flow -> "latency-critical", reserved threads 2)
  X-LLM-Priority: high                 -> Action("class-weight", "interactive" x 3)
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ReplicaSignals:
    """One model-server replica, each figure with its source and age."""
    endpoint: str                                   # ip:port
    queue_depth: dict[str, int] = field(default_factory=dict)   # QoS class -> waiting requests
    running: int = 0
    compute_p99_ms: float = 0.0
    tokens_per_second: float = 0.0
    kv_utilisation: float = 0.0                     # 0..1
    kv_hit_rate: float = 0.0                        # 0..1
    memory_fraction: float = 0.0                    # 0..1 of what memory_source names
    memory_source: str = ""                         # "nvml" | "cgroup" | "kv-budget"
    age_ms: float = 0.0                             # since these figures were read


@dataclass(frozen=True)
class FlowSignals:
    """One transport flow from the shared ring: the kernel's samples and the model server's
    figures for it (mesh/flow_ring.py's record kinds)."""
    flow: str                                       # "src_ip:src_port->dst_ip:dst_port"
    rtt_ms: float = 0.0                             # closed at tc egress (the server's interface)
    payload_bytes: int = 0
    age_ms: float = 0.0
    ingress_rtt_ms: float = 0.0                     # closed at tc ingress (a client's interface)
    tokens_per_second: float = 0.0                  # the model server's, for the flow's last request
    kv_hit_rate: float = 0.0                        # 0..1, the same request's prefix-cache hits


@dataclass(frozen=True)
class WriteBurstSignals:
    """A watched process's write burst (the write-burst tracer, bpf/c/write_burst.c)."""
    pid: int
    endpoint: str = ""                              # the replica with that pid (--replica-pid), "" if none
    bytes: int = 0
    writes: int = 0
    length_ms: float = 0.0
    age_ms: float = 0.0


ABSENT = "absent here"


@dataclass(frozen=True)
class LinkSignals:
    device: str
    value: float                                    # a link: GB/s one way; an NVML throughput: KB/s


@dataclass(frozen=True)
class EngineSignals:
    endpoint: str
    sessions: float = 0.0
    running: float = 0.0
    queued: float = 0.0
    profiles: float = 0.0


@dataclass(frozen=True)
class ResourceSignals:
    """The seed's resource view (scheduler/loop/resources.py): exponential averages, each signal
    with its source or ABSENT."""
    numa_nodes: tuple[int, ...] = ()
    numa_cpus: tuple[tuple[int, ...], ...] = ()             # per node, in numa_nodes order
    numa_distance: tuple[tuple[float, ...], ...] = ()       # averaged, in numa_nodes order (10: local)
    numa_source: str = ABSENT
    pcie_links: tuple[LinkSignals, ...] = ()
    pcie_throughput: tuple[LinkSignals, ...] = ()
    pcie_source: str = ABSENT
    engine: tuple[EngineSignals, ...] = ()
    engine_source: str = ABSENT


@dataclass(frozen=True)
class Signals:
    now_s: float
    replicas: tuple[ReplicaSignals, ...] = ()
    flows: tuple[FlowSignals, ...] = ()
    write_bursts: tuple[WriteBurstSignals, ...] = ()    # read since the last cycle
    resources: ResourceSignals = ResourceSignals()
    trigger: str = "period"                         # what started this cycle: "period" or "ring"


@dataclass(frozen=True)
class Action:
    """kind: "remap-class" (subject: a class, value: the class it becomes, hold_s),
    "upgrade-flow" (subject: a flow, value: the class, reserved_threads),
    "class-weight" (subject: a class, weight), "endpoint-weight" (subject: ip:port, weight),
    "batcher-policy" (subject: ip:port, value: a preset or JSON settings)."""
    kind: str
    subject: str
    value: str = ""
    weight: float = 0.0
    hold_s: float = 0.0
    reserved_threads: int = 0
    reason: str = ""


@dataclass(frozen=True)
class RequestInfo:
    """What score() sees of one request."""
    qos_class: str = ""
    prompt_bytes: int = 0
    session: str = ""


@dataclass(frozen=True)
class EndpointInfo:
    endpoint: str
    queue_depth: int = 0
    kv_utilisation: float = 0.0
    compute_p99_ms: float = 0.0
