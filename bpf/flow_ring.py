"""The kernel-written flow ring (c/flow_ring.h) from user space: the one-entry BPF_F_MMAPABLE
array map mapped into this process, so its records are read in place (mesh/flow_ring.py's
PinnedRing maps it for readers; this module lays the header out at load).

The loop's process maps the ring that `mcpctl bpf attach --sample` pinned at
<pin dir>/flow_ring with mesh.flow_ring.PinnedRing: only bpf(2), no bcc, no import of bpf/.
"""
from __future__ import annotations

from mcp26.mesh import flow_ring as R
from mcp26.mesh.flow_ring import map_fd

PIN_NAME = "flow_ring"          # the map's name in c/flow_ring.h, and its pin's


def lay_out(fd: int) -> None:
    """Writes the header (magic, record size) into a freshly created ring map."""
    m = map_fd(fd)
    try:
        R.init(m)
    finally:
        m.close()
