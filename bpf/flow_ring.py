"""The kernel-written flow ring (c/flow_ring.h) from user space: the one-entry BPF_F_MMAPABLE
array map mapped into this process, so its records are read in place (mesh/flow_ring.py's
FlowRingReader over the mapping; no syscall, no copy per record).

Only the bpf(2) syscall is needed (bpf.syscall): the loop's process can map the ring that
`mcpctl bpf attach --sample` pinned at <pin dir>/flow_ring without bcc.
"""
from __future__ import annotations

import mmap
import os

from mesh import flow_ring as R

PIN_NAME = "flow_ring"          # the map's name in c/flow_ring.h, and its pin's


def map_fd(fd: int) -> mmap.mmap:
    """A shared read-write mapping of the ring map `fd` (the array's value, page-aligned at 0)."""
    return mmap.mmap(fd, R.SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)


def lay_out(fd: int) -> None:
    """Writes the header (magic, record size) into a freshly created ring map."""
    m = map_fd(fd)
    try:
        R.init(m)
    finally:
        m.close()


class PinnedRing:
    """The ring map pinned at `path` (bpffs), mapped; .buf is the mmap (as MappedRing's)."""

    def __init__(self, path: str):
        from bpf.syscall import obj_get
        fd = obj_get(path)
        try:
            self.buf = map_fd(fd)
        finally:
            os.close(fd)                    # the mapping holds the map
        self.path = path
        self.inode = os.stat(path).st_ino   # a re-attach pins a new map under the same name

    def replaced(self) -> bool:
        """Whether `path` now names another map (re-attached) or nothing (detached)."""
        try:
            return os.stat(self.path).st_ino != self.inode
        except FileNotFoundError:
            return True

    def reader(self) -> R.FlowRingReader:
        return R.FlowRingReader(self.buf)

    def close(self) -> None:
        try:
            self.buf.close()
        except BufferError:                 # a reader's memoryview still open: goes with the process
            pass


def on_bpffs(path: str) -> bool:
    """Whether `path` lies on a bpffs mount (a pinned map, not a file)."""
    real = os.path.realpath(path)
    best, fstype = "", ""
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            mnt = parts[1]
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                best, fstype = mnt, parts[2]
    return fstype == "bpf"
