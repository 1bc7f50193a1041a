"""A 0.5 s fault delay on jason's requests only (manifests/steps/3-fault-delay.yaml)."""
import time

from mcp26.demo.framework import Check, Demo, Step
from mcp26.mesh.headers import END_USER


def run(demo: Demo) -> list[Check]:
    generation = demo.apply("virtualservice.yaml", demo.manifest("steps/3-fault-delay.yaml"))
    with demo.gateway() as gw:
        def timed(headers=None) -> tuple[str, float]:
            started = time.monotonic()
            _, upstream, _ = gw.get(headers=headers)
            return upstream, time.monotonic() - started
        delayed = [timed({END_USER: "jason"}) for _ in range(3)]
        plain = [timed() for _ in range(20)]
    slowest_plain = max(t for _, t in plain)
    fastest_jason = min(t for _, t in delayed)
    print(f"  applied {generation}; jason: {', '.join(f'{u} {t * 1e3:.0f} ms' for u, t in delayed)};"
          f" others: max {slowest_plain * 1e3:.0f} ms")
    return [Check("jason delayed 0.5 s", ">= 480 ms, v2", f"min {fastest_jason * 1e3:.0f} ms",
                  fastest_jason >= 0.48 and all(u == "v2" for u, _ in delayed)),
            Check("others not delayed", "< 480 ms", f"max {slowest_plain * 1e3:.0f} ms", slowest_plain < 0.48)]


STEP = Step(60, "fault delay", run)
