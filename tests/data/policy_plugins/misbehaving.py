"""A test plugin that misbehaves on request, so one build covers every failure the host must
survive. decide() reads the first replica's endpoint name:
  "loop"  -> never returns                (fuel / the deadline must cut it off)
  "raise" -> raises ZeroDivisionError     (a trap; the previous decision stands)
  "hoard" -> allocates without bound      (the store's memory limit)
  "echo"  -> one action whose reason repeats the resource view, write bursts, flows and trigger
  else    -> one class-weight action naming the endpoint
"""
import wit_world
from wit_world.imports.types import Action

HOARD = []


class WitWorld(wit_world.WitWorld):
    def decide(self, signals):
        mode = signals.replicas[0].endpoint if signals.replicas else ""
        if mode == "loop":
            n = 0
            while True:
                n += 1
        if mode == "raise":
            return [Action("class-weight", "x", "", 1.0 / 0.0, 0.0, 0, "")]
        if mode == "hoard":
            while True:
                HOARD.append(bytearray(8 << 20))
        if mode == "echo":
            r = signals.resources
            seen = {"numa": [list(row) for row in r.numa_distance], "cpus": [list(c) for c in r.numa_cpus],
                    "numa_source": r.numa_source, "links": [[x.device, x.value] for x in r.pcie_links],
                    "engine": [[e.endpoint, e.running] for e in r.engine],
                    "bursts": [[b.pid, b.endpoint, b.bytes] for b in signals.write_bursts],
                    "flows": [[f.flow, f.ingress_rtt_ms, f.tokens_per_second, f.kv_hit_rate] for f in signals.flows],
                    "trigger": signals.trigger}
            return [Action("batcher-policy", "e", "throughput", 0.0, 0.0, 0, repr(seen))]
        return [Action("class-weight", "latency-critical", "", 2.0, 0.0, 0, f"healthy: {mode}")]

    def score(self, request, endpoints):
        return [float(len(e.endpoint)) for e in endpoints]
