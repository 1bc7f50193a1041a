"""The seed's decision table (scheduler/decisions.py), as plain Python: the built-in
policy, and the reference the Wasm plugin of the same table is compared with."""
from __future__ import annotations

from mcp26.mesh import qos as Q
from mcp26.scheduler.decisions import Action, EndpointInfo, RequestInfo, Signals

MEMORY_HIGH = 0.90               # accelerator memory (or what stands in for it) above this ...
# The seed's names through mesh.qos's table: Medium -> Low, upgrade to Critical, High x 3.
REMAP_FROM, REMAP_TO = Q.DOWNGRADE_FROM.header_value, Q.DOWNGRADE_TO.header_value
REMAP_HOLD_S = 60.0              # ... remaps Medium (standard) -> Low (batch) for this long
FLOW_RTT_MS, FLOW_PAYLOAD_BYTES = 50.0, 1_000_000     # 1 MB, as the Wasm seed table (plugins/policies/seed_table.py)
FLOW_CLASS, FLOW_RESERVED_THREADS = Q.UPGRADE_TO.header_value, Q.RESERVED_THREADS
HIGH_CLASS, HIGH_WEIGHT = Q.HIGH_WEIGHT_CLASS.header_value, float(Q.HIGH_WEIGHT_CLASS.weight)   # X-LLM-Priority: high


class BuiltinPolicy:
    """The seed's table; `burst_preset`: also re-batch a replica whose process wrote a burst (the
    write-burst tracer's, bpf/c/write_burst.c) with that batcher preset - the seed's tracepoint
    trigger, off unless asked for (`mcpctl scheduler run --rebatch-on-burst PRESET`)."""

    def __init__(self, hold_s: float = REMAP_HOLD_S, burst_preset: str | None = None):
        self.hold_s = hold_s
        self.burst_preset = burst_preset

    def decide(self, signals: Signals) -> list[Action]:
        out = []
        hot = [r for r in signals.replicas if r.memory_fraction > MEMORY_HIGH]
        if hot:
            why = ", ".join(f"{r.endpoint} {r.memory_source} {r.memory_fraction:.0%}" for r in hot)
            out.append(Action("remap-class", REMAP_FROM, REMAP_TO, hold_s=self.hold_s,
                              reason=f"memory > {MEMORY_HIGH:.0%}: {why}"))
        for f in signals.flows:
            if f.rtt_ms < FLOW_RTT_MS and f.payload_bytes > FLOW_PAYLOAD_BYTES:
                out.append(Action("upgrade-flow", f.flow, FLOW_CLASS, reserved_threads=FLOW_RESERVED_THREADS,
                                  reason=f"rtt {f.rtt_ms:.1f} ms < {FLOW_RTT_MS:.0f}, payload {f.payload_bytes} B > 1 MB"))
        if self.burst_preset:
            for b in signals.write_bursts:
                if b.endpoint:
                    out.append(Action("batcher-policy", b.endpoint, self.burst_preset,
                                      reason=f"write burst: pid {b.pid} wrote {b.bytes} B in {b.writes} writes, "
                                             f"{b.length_ms:.1f} ms"))
        out.append(Action("class-weight", HIGH_CLASS, weight=HIGH_WEIGHT, reason="X-LLM-Priority: high"))
        return out

    def score(self, request: RequestInfo, endpoints: list[EndpointInfo]) -> list[float]:
        """Shorter queue and freer KV cache score higher (the table says nothing of scoring)."""
        return [-(e.queue_depth + e.kv_utilisation) for e in endpoints]
