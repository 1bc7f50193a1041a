"""Per-flow kernel signals for the loop: the records the bpf part's user space writes into the
shared-memory flow ring (mesh/flow_ring.py; `mcpctl bpf latency --flow-ring PATH`), read at each
period through a memoryview of the mmap, kept per flow (its latest sample) while younger than
`keep_s`, and handed to the policy as FlowSignals with their age."""
from __future__ import annotations

import os
import time

from mesh.flow_ring import FlowRingReader, MappedRing
from scheduler.decisions import FlowSignals


class FlowSource:
    def __init__(self, reader: FlowRingReader, keep_s: float = 2.0, clock_ns=time.monotonic_ns):
        self.reader, self.keep_s, self.clock_ns = reader, keep_s, clock_ns
        self.latest: dict[str, object] = {}      # flow -> its latest FlowSample
        self.samples = 0

    @classmethod
    def at(cls, path: str, **kw) -> "FlowSource":
        ring = MappedRing(path, create=not os.path.exists(path))
        src = cls(ring.reader(), **kw)
        src.ring = ring
        return src

    def __call__(self) -> tuple[FlowSignals, ...]:
        for s in self.reader.read():
            self.samples += 1
            self.latest[s.flow] = s
        now = self.clock_ns()
        out = []
        for flow, s in list(self.latest.items()):
            age_ms = (now - s.ts_ns) / 1e6
            if age_ms > self.keep_s * 1e3:
                del self.latest[flow]
                continue
            out.append(FlowSignals(flow, rtt_ms=s.rtt_us / 1e3, payload_bytes=s.payload_bytes, age_ms=round(age_ms, 3)))
        return tuple(out)

    def stats(self) -> dict:
        return {"samples": self.samples, "drops": self.reader.drops, "flows": len(self.latest)}
