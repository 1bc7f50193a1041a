"""Per-thread hardware and software counters through `perf_event_open(2)`, from ctypes.

What `perf stat -e EVENT -t TID` counts, read by the serving process itself around
each batch: one counter group per thread (the compute thread and ONNX Runtime's
intra-op threads), read with one `read(2)` each (PERF_FORMAT_GROUP), user space
only (`exclude_kernel`, which `perf_event_paranoid` 2 allows). An event the kernel
or the VM does not give (many VMs expose no PMU: `perf stat -e instructions true`
says "<not supported>") is reported unavailable with the errno's reason, never
counted as 0. No Python binding in PyPI or Debian covers per-thread groups of
generic events; the syscall and its struct are small, so they are written here.
"""
from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import threading

_SYSCALL = {"x86_64": 298, "aarch64": 241, "ppc64le": 319, "s390x": 331}.get(platform.machine())
_libc = ctypes.CDLL(None, use_errno=True)

TYPE_HARDWARE, TYPE_SOFTWARE, TYPE_HW_CACHE = 0, 1, 3
_L1D, _DTLB, _READ, _ACCESS, _MISS = 0, 3, 0, 0, 1
FORMAT_GROUP = 1 << 3
# attr.flags bits: disabled 0, inherit 1, pinned 2, exclusive 3, exclude_user 4, exclude_kernel 5, exclude_hv 6
_EXCLUDE_KERNEL_HV = (1 << 5) | (1 << 6)

# name -> (type, config): perf's generic events, as `perf list` names them
EVENTS = {
    "cycles": (TYPE_HARDWARE, 0),
    "instructions": (TYPE_HARDWARE, 1),
    "cache_references": (TYPE_HARDWARE, 2),         # last-level cache
    "cache_misses": (TYPE_HARDWARE, 3),
    "branch_misses": (TYPE_HARDWARE, 5),
    "l1d_loads": (TYPE_HW_CACHE, _L1D | (_READ << 8) | (_ACCESS << 16)),
    "l1d_load_misses": (TYPE_HW_CACHE, _L1D | (_READ << 8) | (_MISS << 16)),
    "dtlb_load_misses": (TYPE_HW_CACHE, _DTLB | (_READ << 8) | (_MISS << 16)),
    "task_clock_ns": (TYPE_SOFTWARE, 1),
    "page_faults": (TYPE_SOFTWARE, 2),
    "context_switches": (TYPE_SOFTWARE, 3),
}


class _Attr(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint32), ("size", ctypes.c_uint32), ("config", ctypes.c_uint64),
                ("sample_period", ctypes.c_uint64), ("sample_type", ctypes.c_uint64),
                ("read_format", ctypes.c_uint64), ("flags", ctypes.c_uint64),
                ("wakeup_events", ctypes.c_uint32), ("bp_type", ctypes.c_uint32),
                ("config1", ctypes.c_uint64), ("config2", ctypes.c_uint64), ("_rest", ctypes.c_uint8 * 64)]


def _open(name: str, tid: int, group_fd: int = -1) -> int:
    """A counter fd, or raise OSError with the kernel's errno."""
    if _SYSCALL is None:
        raise OSError(errno.ENOSYS, f"perf_event_open: no syscall number known for {platform.machine()}")
    kind, config = EVENTS[name]
    attr = _Attr(type=kind, size=ctypes.sizeof(_Attr), config=config, read_format=FORMAT_GROUP,
                 flags=_EXCLUDE_KERNEL_HV)
    fd = _libc.syscall(_SYSCALL, ctypes.byref(attr), tid, -1, group_fd, 0)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


def _reason(e: OSError) -> str:
    if e.errno == errno.ENOENT or e.errno == errno.EOPNOTSUPP:
        return f"not supported here (perf_event_open: {e.strerror}; no PMU, as in many VMs)"
    if e.errno in (errno.EACCES, errno.EPERM):
        try:
            with open("/proc/sys/kernel/perf_event_paranoid") as fh:
                level = fh.read().strip()
        except OSError:
            level = "?"
        return f"not permitted (perf_event_open: {e.strerror}; kernel.perf_event_paranoid={level})"
    return f"perf_event_open: {e.strerror}"


def probe(names=tuple(EVENTS)) -> tuple[list[str], dict[str, str]]:
    """(events this process can count on its own threads, {unavailable event: reason})."""
    ok, missing = [], {}
    tid = 0                         # this thread
    for name in names:
        try:
            os.close(_open(name, tid))
            ok.append(name)
        except OSError as e:
            missing[name] = _reason(e)
    return ok, missing


class ThreadCounters:
    """One group of `events` on one thread; read() gives their running totals."""

    def __init__(self, tid: int, events: list[str]):
        self.tid, self.events, self.fds = tid, list(events), []
        try:
            for name in self.events:
                self.fds.append(_open(name, tid, self.fds[0] if self.fds else -1))
        except OSError:
            self.close()
            raise
        self._size = 8 * (1 + len(self.events))

    def read(self) -> tuple[int, ...]:
        if not self.fds:
            return ()
        data = os.read(self.fds[0], self._size)
        return struct.unpack_from(f"{len(self.events)}Q", data, 8)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


class CounterSet:
    """The same events on several threads, summed."""

    def __init__(self, events: list[str]):
        self.events = list(events)
        self.threads: dict[int, ThreadCounters] = {}
        self.failed: dict[int, str] = {}      # tid -> why it is not counted (it exited, ...)
        self._lock = threading.Lock()         # watch / forget / close come from several threads

    def watch(self, tid: int) -> None:
        if tid in self.threads or tid in self.failed or not self.events:
            return
        with self._lock:
            if tid in self.threads:
                return
            try:
                self.threads[tid] = ThreadCounters(tid, self.events)
            except OSError as e:
                self.failed[tid] = _reason(e)

    def read(self, tids=None) -> list[int]:
        """The events summed over `tids` (default: every thread watched)."""
        total = [0] * len(self.events)
        for tid, tc in list(self.threads.items()):
            if tids is None or tid in tids:
                try:
                    values = tc.read()
                except OSError:         # closed meanwhile (shutdown, a replaced session)
                    continue
                for i, v in enumerate(values):
                    total[i] += v
        return total

    def forget_exited(self) -> None:
        """Close the counters of threads that have exited (their totals stay in what was read)."""
        alive = thread_ids()
        with self._lock:
            for tid in [t for t in self.threads if t not in alive]:
                self.threads.pop(tid).close()

    def close(self) -> None:
        with self._lock:
            for tc in self.threads.values():
                tc.close()
            self.threads.clear()


def thread_ids() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}
