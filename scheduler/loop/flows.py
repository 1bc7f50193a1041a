"""Per-flow signals for the loop from the shared ring (mesh/flow_ring.py): each ring's records read
through a memoryview of its mlocked mapping, merged per flow (its latest sample of each kind) while
younger than `keep_s`, and handed to the policy as FlowSignals with their age; write bursts as
WriteBurstSignals, once each.

A ring is either the kernel's own (a BPF_F_MMAPABLE map the sampler and the write-burst tracer
write, pinned in bpffs by `mcpctl bpf attach --sample` at <pin dir>/flow_ring) or a file a
user-space producer writes: the model server's per-flow figures (`mcpctl serve --flow-ring PATH`),
or `mcpctl bpf latency --flow-ring PATH` where the program is not loaded. One layout and one
reader for all; one ring per user-space producer (mesh/flow_ring.py says why).

Bells: the loop reads every ring each period, and also as soon as a producer rings - the kernel
ring's bell (a BPF ring buffer pinned beside it, `KernelBell`) or a file ring's doorbell (an
eventfd handed out over `<ring>.bell`, `Doorbell`). `bells` lists them for the loop's epoll.
"""
from __future__ import annotations

import os
import time

from mcp26.mesh import flow_ring as R
from mcp26.scheduler.decisions import FlowSignals, WriteBurstSignals


class _Ring:
    """One ring: its mapping, reader and (where the producer rings) bell."""

    def __init__(self, path: str):
        self.path = path
        self.kernel = R.on_bpffs(path)
        self.ring = R.PinnedRing(path) if self.kernel else R.MappedRing(path, create=not os.path.exists(path))
        self.reader = self.ring.reader()
        self.bell = None
        if self.kernel:
            bell = R.kernel_bell_path(path)
            self.bell = R.KernelBell(bell) if os.path.exists(bell) else None
        else:
            self.bell = R.Doorbell(R.doorbell_path(path))

    def follow_reattach(self) -> None:
        # A re-attach pins a new map under the same path: map it (the old one is no longer written).
        if not (self.kernel and self.ring.replaced()):
            return
        try:
            ring = R.PinnedRing(self.path)
        except OSError:
            return                                # detached: keep what we have, retry next period
        self.reader.close()
        self.ring.close()
        self.ring, self.reader = ring, ring.reader()
        bell = R.kernel_bell_path(self.path)
        if self.bell is not None:
            self.bell.close()
        self.bell = R.KernelBell(bell) if os.path.exists(bell) else None

    def close(self) -> None:
        if self.ring is None:
            return                              # closed already (the loop closes its source, so may a test)
        self.reader.close()
        self.ring.close()
        if self.bell is not None:
            self.bell.close()
        self.ring = self.reader = self.bell = None


class FlowSource:
    def __init__(self, rings: list, keep_s: float = 2.0, clock_ns=time.monotonic_ns):
        self.rings, self.keep_s, self.clock_ns = rings, keep_s, clock_ns
        self.latest: dict[str, dict] = {}        # flow -> {kind: its latest sample}
        self.samples = 0
        self.bursts: list = []                   # write bursts read, not yet handed out

    @classmethod
    def at(cls, *paths: str, **kw) -> "FlowSource":
        """The rings at `paths`: pinned kernel maps on bpffs, or files (created if missing)."""
        return cls([_Ring(p) for p in paths], **kw)

    # the first ring, as the loop's status and older callers name it
    ring = property(lambda self: self.rings[0].ring if self.rings else None)
    reader = property(lambda self: self.rings[0].reader if self.rings else None)
    kernel = property(lambda self: bool(self.rings) and self.rings[0].kernel)

    @property
    def bells(self) -> list:
        return [r.bell for r in self.rings if r.bell is not None]

    def read(self) -> None:
        """Take every ring's new records."""
        for r in self.rings:
            r.follow_reattach()
            for s in r.reader.read():
                self.samples += 1
                if isinstance(s, R.WriteBurst):
                    self.bursts.append(s)
                else:
                    self.latest.setdefault(s.flow, {})[getattr(s, "kind", R.KIND_SERVING)] = s

    def __call__(self) -> tuple[FlowSignals, ...]:
        self.read()
        now = self.clock_ns()
        out = []
        for flow, kinds in list(self.latest.items()):
            for kind in [k for k, s in kinds.items() if now - s.ts_ns > self.keep_s * 1e9]:
                del kinds[kind]
            if not kinds:
                del self.latest[flow]
                continue
            egress, ingress = kinds.get(R.KIND_EGRESS), kinds.get(R.KIND_INGRESS)
            serving = kinds.get(R.KIND_SERVING)
            newest = max(s.ts_ns for s in kinds.values())
            out.append(FlowSignals(
                flow, rtt_ms=egress.rtt_us / 1e3 if egress else 0.0,
                payload_bytes=(egress or ingress).payload_bytes if (egress or ingress) else 0,
                age_ms=round((now - newest) / 1e6, 3),
                ingress_rtt_ms=ingress.rtt_us / 1e3 if ingress else 0.0,
                tokens_per_second=float(serving.tokens_per_second) if serving else 0.0,
                kv_hit_rate=serving.kv_hit_rate if serving else 0.0))
        return tuple(out)

    def take_bursts(self, endpoint_of: dict[int, str] | None = None) -> tuple[WriteBurstSignals, ...]:
        """The write bursts read since the last call, each once, with the replica of its pid."""
        now, endpoint_of = self.clock_ns(), endpoint_of or {}
        out = tuple(WriteBurstSignals(b.pid, endpoint_of.get(b.pid, ""), b.bytes, b.writes, b.length_us / 1e3,
                                      round((now - b.ts_ns) / 1e6, 3)) for b in self.bursts)
        self.bursts.clear()
        return out

    def stats(self) -> dict:
        return {"samples": self.samples, "drops": sum(r.reader.drops for r in self.rings), "flows": len(self.latest),
                "source": "kernel" if self.kernel else "file",
                "rings": [{"path": r.path, "source": "kernel" if r.kernel else "file", "mlocked": r.ring.locked,
                           "bell": type(r.bell).__name__ if r.bell else None,
                           "rings": r.bell.rings if r.bell else 0} for r in self.rings]}

    def close(self) -> None:
        for r in self.rings:
            r.close()
