"""The seed's decision table as a policy plugin: the built-in default.

Built with `mcpctl policy build scheduler/plugins/policies/seed_table.py` (componentize-py,
world mcp:scheduler/policy in ../wit/policy.wit). Plain Python: it runs the same way when the
bindings are imported in CPython (benchmarks/bench_policy.py compares the two). A component
imports nothing of the mesh: the class names below are mesh.qos's table of the seed's
X-LLM-Priority names (Critical, High, Medium, Low -> latency-critical, interactive, standard,
batch), which tests/scheduler/e2e/test_policy_plugins.py checks this table against.

  accelerator memory > 90 %            -> remap-class standard (Medium) -> batch (Low), hold 60 s
  flow RTT < 50 ms and payload > 1 MB  -> upgrade-flow to latency-critical (Critical), 2 reserved threads
  X-LLM-Priority: high                 -> class-weight interactive (High) x 3
"""
import wit_world
from wit_world.imports import host
from wit_world.imports.types import Action

MEMORY_HIGH = 0.90
HOLD_S = 60.0
RTT_LOW_MS = 50.0
PAYLOAD_LARGE = 1_000_000          # bytes: 1 MB
RESERVED_THREADS = 2
HIGH_PRIORITY_WEIGHT = 3.0


def _action(kind, subject, value="", weight=0.0, hold_s=0.0, reserved_threads=0, reason=""):
    return Action(kind, subject, value, weight, hold_s, reserved_threads, reason)


class WitWorld(wit_world.WitWorld):
    def decide(self, signals):
        actions = []
        hot = [r for r in signals.replicas if r.memory_fraction > MEMORY_HIGH]
        if hot:
            why = ", ".join(f"{r.endpoint} {r.memory_source} memory {r.memory_fraction:.0%}" for r in hot)
            actions.append(_action("remap-class", "standard", "batch", hold_s=HOLD_S,
                                   reason=f"memory > {MEMORY_HIGH:.0%}: {why}"))
        for f in signals.flows:
            if f.rtt_ms < RTT_LOW_MS and f.payload_bytes > PAYLOAD_LARGE:
                actions.append(_action("upgrade-flow", f.flow, "latency-critical",
                                       reserved_threads=RESERVED_THREADS,
                                       reason=f"rtt {f.rtt_ms:.1f} ms < {RTT_LOW_MS:.0f} ms and payload "
                                              f"{f.payload_bytes} B > {PAYLOAD_LARGE} B"))
        actions.append(_action("class-weight", "interactive", weight=HIGH_PRIORITY_WEIGHT,
                               reason="X-LLM-Priority: high"))
        host.log(host.Level.DEBUG, f"seed-table: {len(actions)} actions")
        return actions

    def score(self, request, endpoints):
        # Fewer waiting requests and more free KV cache score higher (the picker's two load scorers).
        return [1.0 / (1.0 + e.queue_depth) + (1.0 - e.kv_utilisation) for e in endpoints]
