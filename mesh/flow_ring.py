"""The seed's shared-memory flow ring: per-flow kernel samples (RTT, payload size) handed to the
decision loop through shared memory. Two writers share this one layout and protocol:

- the kernel itself: the latency sampler (bpf/c/flow_ring.h) writes a one-entry BPF_F_MMAPABLE
  array map whose value is this layout, pinned at <pin dir>/flow_ring by `mcpctl bpf attach
  --sample` (`PinnedRing` below maps it); the constants below reach the C code as -D flags
  (bpf/layout.py), where static asserts check the C struct against them;
- the fallback where the program is not loaded: user space (`mcpctl bpf latency --flow-ring PATH`)
  copies ring-buffer samples into a file-backed mmap (`MappedRing`) with `FlowRingWriter`.

Layout (little-endian, the seed's offsets):

  0x0000  u32 magic 0x52494E47 ("RING")      0x0004  u32 record size (64)
  0x0008  u64 producer index (records ever reserved)
  0x0010  u64 consumer index (records ever read; the reader alone stores it)
  0x0018  u64 drops (records lost because the reader was a full ring behind)
  0x1000  64 KiB ring: 1024 records of 64 bytes, record i at 0x1000 + (i mod 1024) * 64

Record (64 bytes):
  0   16 B src address (IPv4 as ::ffff:a.b.c.d)   -- the client, the request's sender
  16  16 B dst address                             -- the server
  32  u16 src port   34 u16 dst port   36 u8 family (4|6)   37..39 pad
  40  u32 rtt_us      (the sampler's first request byte in -> first response byte out)
  44  u32 seq         (commit word: (i mod 2^31) + 1 once record i is whole; 0 while written)
  48  u64 payload_bytes (request bytes before the response: the TCP sequence space covered, so a
                       retransmitted segment counts once)
  56  u64 ts_ns       (CLOCK_MONOTONIC, as bpf_ktime_get_ns / time.monotonic_ns)

Protocol (many writers -- every CPU running the tc program -- and one reader):
  writer  1. if producer - consumer >= 1024 (a full ring behind): drops += 1, stop (newest dropped);
          2. i = atomic fetch-and-add(producer, 1)  -- reserves slot i mod 1024;
          3. if i - consumer >= 1024 after all (writers raced for the last free slots), drops += 1:
             record i overwrites the oldest unread one, which the reader then skips;
          4. u64 at 40 := 0 (atomic exchange: "being written"); fill the record;
          5. u64 at 40 := rtt_us | seq << 32 (atomic exchange: publish; rtt and seq in one store).
  reader  for c from consumer up to producer: the slot's seq must be (c mod 2^31) + 1;
          - if not, and producer - c <= 1024, record c's writer has not published yet: stop
            (read it next time); if producer - c > 1024 it was overwritten: skip it;
          - read the fields, then the u64 at 40 again: unchanged, the copy is whole; changed,
            a writer overwrote it during the read: skip it.
          then store consumer := c.
The traffic never waits for the reader. The atomic exchanges order the record's stores around the
commit word; the reader relies on x86's ordered loads (the machines this runs on).
"""
from __future__ import annotations

import ctypes
import ipaddress
import mmap
import os
import platform
import struct
from dataclasses import dataclass

MAGIC = 0x52494E47
OFF_MAGIC, OFF_RECSIZE, OFF_PROD, OFF_CONS, OFF_DROPS = 0x0, 0x4, 0x8, 0x10, 0x18
RING_OFF, RING_BYTES, RECORD = 0x1000, 64 * 1024, 64
SLOTS = RING_BYTES // RECORD
SIZE = RING_OFF + RING_BYTES
REC_OFF_COMMIT, REC_OFF_SEQ = 40, 44      # the u64 commit word (rtt_us | seq << 32), its seq half
SEQ_MASK = 0x7FFFFFFF
_REC = struct.Struct("<16s16sHHB3xIIQQ")
assert _REC.size == RECORD
_U64 = struct.Struct("<Q")
assert SLOTS & (SLOTS - 1) == 0            # the C code masks the index

# The layout as C macros (bpf/layout.py hands them to the compiler; c/flow_ring.h asserts on them).
C_DEFINES = {"FLOW_RING_MAGIC": MAGIC, "FLOW_RING_OFF_PROD": OFF_PROD, "FLOW_RING_OFF_CONS": OFF_CONS,
             "FLOW_RING_OFF_DROPS": OFF_DROPS, "FLOW_RING_OFF": RING_OFF, "FLOW_RING_SLOTS": SLOTS,
             "FLOW_RECORD": RECORD, "FLOW_REC_OFF_COMMIT": REC_OFF_COMMIT, "FLOW_SEQ_MASK": SEQ_MASK}


def seq_of(index: int) -> int:
    """The commit word's seq of record `index` (never 0: 0 means being written)."""
    return (index & SEQ_MASK) + 1


@dataclass(frozen=True)
class FlowSample:
    src: str                    # ip:port of the client
    dst: str                    # ip:port of the server
    rtt_us: int
    payload_bytes: int
    ts_ns: int

    @property
    def flow(self) -> str:
        return f"{self.src}->{self.dst}"


def _addr(raw: bytes, family: int) -> str:
    a = ipaddress.IPv6Address(raw)
    if family == 4 or a.ipv4_mapped is not None:
        return str(a.ipv4_mapped or ipaddress.IPv4Address(raw[12:]))
    return f"[{a}]"


def _packed(host: str) -> tuple[bytes, int]:
    a = ipaddress.ip_address(host.strip("[]"))
    return (ipaddress.IPv6Address(f"::ffff:{a}").packed, 4) if a.version == 4 else (a.packed, 6)


def init(buf) -> None:
    """Lay out an empty ring in `buf` (at least SIZE writable bytes)."""
    mv = memoryview(buf)
    mv[:RING_OFF] = bytes(RING_OFF)
    struct.pack_into("<II", mv, OFF_MAGIC, MAGIC, RECORD)
    mv.release()


def _check(mv: memoryview) -> None:
    if len(mv) < SIZE:
        raise ValueError(f"flow ring: buffer of {len(mv)} bytes, need {SIZE}")
    magic, recsize = struct.unpack_from("<II", mv, OFF_MAGIC)
    if magic != MAGIC or recsize != RECORD:
        raise ValueError(f"flow ring: magic {magic:#x} record {recsize} (want {MAGIC:#x}, {RECORD})")


class FlowRingWriter:
    """The user-space writer (one process, the file-ring fallback); the kernel's is c/flow_ring.h."""

    def __init__(self, buf):
        self.mv = memoryview(buf)
        _check(self.mv)

    def write(self, src_ip: str, src_port: int, dst_ip: str, dst_port: int, rtt_us: int,
              payload_bytes: int, ts_ns: int) -> bool:
        """Append one record; False (and drops + 1) when the ring is full."""
        src, family = _packed(src_ip)
        dst, _ = _packed(dst_ip)
        return self.write_raw(src, dst, src_port, dst_port, family, rtt_us, payload_bytes, ts_ns)

    def write_raw(self, src16: bytes, dst16: bytes, sport: int, dport: int, family: int, rtt_us: int,
                  payload_bytes: int, ts_ns: int) -> bool:
        """The same from the kernel event's own 16-byte addresses (no parsing on the hot path)."""
        prod = _U64.unpack_from(self.mv, OFF_PROD)[0]
        if prod - _U64.unpack_from(self.mv, OFF_CONS)[0] >= SLOTS:
            _U64.pack_into(self.mv, OFF_DROPS, _U64.unpack_from(self.mv, OFF_DROPS)[0] + 1)
            return False
        # A single writer: the record is whole (seq last) before the producer index moves.
        _REC.pack_into(self.mv, RING_OFF + (prod % SLOTS) * RECORD, bytes(src16), bytes(dst16), sport, dport,
                       family, min(int(rtt_us), 0xFFFFFFFF), seq_of(prod), int(payload_bytes), int(ts_ns))
        _U64.pack_into(self.mv, OFF_PROD, prod + 1)
        return True

    def close(self) -> None:
        self.mv.release()


class FlowRingReader:
    """Reads records in place through a memoryview of the ring (no copy of the ring)."""

    def __init__(self, buf):
        self.mv = memoryview(buf)
        _check(self.mv)
        self.skipped = 0            # records overwritten before they were read (also in the writers' drops)

    def pending(self) -> int:
        return _U64.unpack_from(self.mv, OFF_PROD)[0] - _U64.unpack_from(self.mv, OFF_CONS)[0]

    @property
    def drops(self) -> int:
        return _U64.unpack_from(self.mv, OFF_DROPS)[0]

    @property
    def produced(self) -> int:
        return _U64.unpack_from(self.mv, OFF_PROD)[0]

    def read_raw(self, limit: int = SLOTS) -> list[tuple]:
        """The records published since the last read (up to `limit`), oldest first, as tuples
        (src16, dst16, sport, dport, family, rtt_us, seq, payload_bytes, ts_ns)."""
        mv, unpack, u64 = self.mv, _REC.unpack_from, _U64.unpack_from
        prod = u64(mv, OFF_PROD)[0]
        cons = u64(mv, OFF_CONS)[0]
        out = []
        while cons < prod and len(out) < limit:
            off = RING_OFF + (cons & (SLOTS - 1)) * RECORD
            commit = u64(mv, off + REC_OFF_COMMIT)[0]
            if commit >> 32 != (cons & SEQ_MASK) + 1:
                prod = u64(mv, OFF_PROD)[0]
                if prod - cons <= SLOTS:
                    break                              # reserved, not yet published: next read
                self.skipped += 1                      # overwritten by a writer a ring ahead
                cons += 1
                continue
            rec = unpack(mv, off)
            if u64(mv, off + REC_OFF_COMMIT)[0] == commit:
                out.append(rec)
            else:
                self.skipped += 1                      # overwritten while we read it
            cons += 1
        _U64.pack_into(mv, OFF_CONS, cons)
        return out

    def read(self, limit: int = SLOTS) -> list[FlowSample]:
        """The records published since the last read (up to `limit`), oldest first."""
        return [FlowSample(f"{_addr(src, family)}:{sport}", f"{_addr(dst, family)}:{dport}", rtt, payload, ts)
                for src, dst, sport, dport, family, rtt, _seq, payload, ts in self.read_raw(limit)]

    def close(self) -> None:
        self.mv.release()


class MappedRing:
    """A file-backed ring: `MappedRing(path, create=True)` lays it out; .buf is the mmap."""

    def __init__(self, path: str, create: bool = False):
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, SIZE)
            self.buf = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        if create:
            init(self.buf)
        self.path = path

    def writer(self) -> FlowRingWriter:
        return FlowRingWriter(self.buf)

    def reader(self) -> FlowRingReader:
        return FlowRingReader(self.buf)

    def close(self) -> None:
        try:
            self.buf.close()
        except BufferError:        # a memoryview still open on it: the mapping goes with the process
            pass


# ---- the kernel's ring: a pinned BPF_F_MMAPABLE map, mapped with nothing but bpf(2) BPF_OBJ_GET ----
# (here, not in bpf/, so the decision loop reads it importing only `mesh`)
_NR_BPF = {"x86_64": 321, "aarch64": 280}.get(platform.machine(), 321)
_BPF_OBJ_GET = 7


class _ObjAttr(ctypes.Structure):
    _fields_ = [("pathname", ctypes.c_uint64), ("bpf_fd", ctypes.c_uint32), ("file_flags", ctypes.c_uint32)]


def _obj_get(path: str) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    p = ctypes.create_string_buffer(os.fsencode(path))
    attr = _ObjAttr(pathname=ctypes.addressof(p))
    fd = libc.syscall(_NR_BPF, _BPF_OBJ_GET, ctypes.byref(attr), ctypes.sizeof(attr))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf(BPF_OBJ_GET {path}): {os.strerror(err)}")
    return fd


def map_fd(fd: int) -> mmap.mmap:
    """A shared read-write mapping of the ring map `fd` (the array's value, page-aligned at 0)."""
    return mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)


class PinnedRing:
    """The ring map pinned at `path` (bpffs), mapped; .buf is the mmap (as MappedRing's)."""

    def __init__(self, path: str):
        fd = _obj_get(path)
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

    def reader(self) -> FlowRingReader:
        return FlowRingReader(self.buf)

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
