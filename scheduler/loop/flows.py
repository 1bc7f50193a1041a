"""Per-flow kernel signals for the loop: the records of the shared-memory flow ring
(mesh/flow_ring.py), read at each period through a memoryview of a mapping, kept per flow (its
latest sample) while younger than `keep_s`, and handed to the policy as FlowSignals with their age.

The ring is either the kernel's own (a BPF_F_MMAPABLE map the sampler writes, pinned in bpffs by
`mcpctl bpf attach --sample` at <pin dir>/flow_ring) or, where the program is not loaded, a file
that `mcpctl bpf latency --flow-ring PATH` fills from user space. The loop reads on its own period
rather than being woken per sample: it wants each flow's latest sample once per cycle, and 200 ms
is well inside what a 1024-record ring holds at the sampler's rate."""
from __future__ import annotations

import os
import time

from mcp26.mesh.flow_ring import FlowRingReader, MappedRing, PinnedRing, on_bpffs
from mcp26.scheduler.decisions import FlowSignals


class FlowSource:
    def __init__(self, reader: FlowRingReader, keep_s: float = 2.0, clock_ns=time.monotonic_ns):
        self.reader, self.keep_s, self.clock_ns = reader, keep_s, clock_ns
        self.latest: dict[str, object] = {}      # flow -> its latest FlowSample
        self.samples = 0
        self.ring = None
        self.kernel = False

    @classmethod
    def at(cls, path: str, **kw) -> "FlowSource":
        """The ring at `path`: a pinned kernel map on bpffs, or a file (created if missing)."""
        kernel = on_bpffs(path)
        ring = PinnedRing(path) if kernel else MappedRing(path, create=not os.path.exists(path))
        src = cls(ring.reader(), **kw)
        src.ring, src.kernel = ring, kernel
        return src

    def _follow_reattach(self) -> None:
        # A re-attach pins a new map under the same path: map it (the old one is no longer written).
        if not (self.kernel and self.ring.replaced()):
            return
        try:
            ring = PinnedRing(self.ring.path)
        except OSError:
            return                                # detached: keep what we have, retry next period
        self.reader.close()
        self.ring.close()
        self.ring, self.reader = ring, ring.reader()

    def __call__(self) -> tuple[FlowSignals, ...]:
        self._follow_reattach()
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
        return {"samples": self.samples, "drops": self.reader.drops, "flows": len(self.latest),
                "source": "kernel" if self.kernel else "file"}
