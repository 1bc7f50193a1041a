"""The write-burst tracer (c/write_burst.c) from user space: `mcpctl bpf trace-writes`.

A tracepoint program on syscalls/sys_enter_write, for the processes it is told to watch (the
model server), that records their write bursts into the shared flow ring (mesh/flow_ring.py,
KIND_WRITE_BURST) and rings the ring's bell, so the decision loop wakes on a burst instead of
its next period. The ring is the one `mcpctl bpf attach --sample` pinned (<pin dir>/flow_ring,
its bell beside it): the tracer opens both pins and writes into them. Where no ring is pinned at
the path yet, it makes its own and pins it there. The program lives as long as this process
(a tracepoint attachment is a perf event of the process that opened it).
"""
from __future__ import annotations

import os
import subprocess

from mcp26.bpf import layout
from mcp26.bpf.flow_ring import lay_out
from mcp26.bpf.program import BpfUnavailable, _bcc, check_privilege, inline_source
from mcp26.bpf.syscall import obj_pin
from mcp26.mesh.flow_ring import kernel_bell_path

TRACEFS = "/sys/kernel/tracing"
TRACEPOINT = "syscalls/sys_enter_write"
DEFAULT_GAP_US = 1_000            # writes closer than this are one burst
DEFAULT_MIN_BYTES = 64 << 10      # a burst is recorded once it has written this much


def ensure_tracefs() -> None:
    """bcc finds tracepoints through tracefs: mount it where the host has not."""
    if os.path.isdir(os.path.join(TRACEFS, "events")):
        return
    r = subprocess.run(["mount", "-t", "tracefs", "tracefs", TRACEFS], capture_output=True, text=True)
    if r.returncode != 0:
        raise BpfUnavailable(f"cannot mount tracefs at {TRACEFS}: {r.stderr.strip()}")
    if not os.path.isdir(os.path.join(TRACEFS, "events", *TRACEPOINT.split("/"))):
        raise BpfUnavailable(f"this kernel has no tracepoint {TRACEPOINT} (CONFIG_FTRACE_SYSCALLS)")


class WriteBurstTracer:
    """The loaded tracer writing into the ring pinned at `ring_path` (made and pinned if absent)."""

    def __init__(self, ring_path: str):
        check_privilege()
        ensure_tracefs()
        bcc = _bcc()
        self.ring_path, self.bell_path = ring_path, kernel_bell_path(ring_path)
        shared = os.path.exists(ring_path)
        if shared and not os.path.exists(self.bell_path):
            raise BpfUnavailable(f"{ring_path} has no bell beside it ({self.bell_path}): re-attach the datapath")
        cflags = list(layout.CFLAGS)
        if shared:
            cflags += [f'-DFLOW_RING_PINNED="{ring_path}"', f'-DFLOW_RING_BELL_PINNED="{self.bell_path}"']
        try:
            self.bpf = bcc.BPF(text=inline_source("write_burst.c").encode(), cflags=cflags)
        except Exception as e:
            raise BpfUnavailable(f"cannot compile or load the write-burst tracer: {e}") from None
        self.pinned: list[str] = []
        if not shared:                  # our own ring: lay it out and pin it with its bell
            os.makedirs(os.path.dirname(ring_path) or ".", exist_ok=True)
            ring_fd = self.bpf.get_table(b"flow_ring").map_fd
            lay_out(ring_fd)
            for path, fd in ((ring_path, ring_fd), (self.bell_path, self.bpf.get_table(b"flow_ring_bell").map_fd)):
                obj_pin(fd, path)
                self.pinned.append(path)
        self.watch_map = self.bpf.get_table(b"write_watch")

    def watch(self, pid: int, gap_us: int = DEFAULT_GAP_US, min_bytes: int = DEFAULT_MIN_BYTES) -> None:
        if not os.path.exists(f"/proc/{pid}"):
            raise ValueError(f"no process {pid}")
        cfg = self.watch_map.Leaf(gap_us * 1000, min_bytes)
        self.watch_map[self.watch_map.Key(pid)] = cfg

    def unwatch(self, pid: int) -> None:
        try:
            del self.watch_map[self.watch_map.Key(pid)]
        except KeyError:
            pass

    def close(self) -> None:
        for path in self.pinned:          # only what we made; a shared ring stays its owner's
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self.bpf.cleanup()
