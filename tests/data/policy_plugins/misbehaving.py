"""A test plugin that misbehaves on request, so one build covers every failure the host must
survive. decide() reads the first replica's endpoint name:
  "loop"  -> never returns                (fuel / the deadline must cut it off)
  "raise" -> raises ZeroDivisionError     (a trap; the previous decision stands)
  "hoard" -> allocates without bound      (the store's memory limit)
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
        return [Action("class-weight", "latency-critical", "", 2.0, 0.0, 0, f"healthy: {mode}")]

    def score(self, request, endpoints):
        return [float(len(e.endpoint)) for e in endpoints]
