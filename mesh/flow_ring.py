"""The seed's shared-memory flow ring: per-flow samples handed to the decision loop through
shared memory, one record layout for every producer. Producers share this layout and protocol:

- the kernel itself: the latency sampler (bpf/c/flow_ring.h) writes a one-entry BPF_F_MMAPABLE
  array map whose value is this layout, pinned at <pin dir>/flow_ring by `mcpctl bpf attach
  --sample` (`PinnedRing` below maps it); the constants below reach the C code as -D flags
  (bpf/layout.py), where static asserts check the C struct against them;
- the write-burst tracer (bpf/c/write_burst.c, `mcpctl bpf trace-writes`): a tracepoint program on
  sys_enter_write that records a watched process's write bursts into the same pinned map;
- user space, one writer per file-backed mmap (`MappedRing`, `FlowRingWriter`): the model server's
  per-flow token throughput and KV-cache hit rate (`mcpctl serve --flow-ring PATH`), and where
  the sampler is not loaded `mcpctl bpf latency --flow-ring PATH`. (User space cannot join the
  kernel's map as a writer: its writers reserve slots by atomic add, which Python has not.)

The reader maps each ring and `mlock`s the mapping (`lock()`): a sample is never a page fault
away. Readiness: a producer that published rings a doorbell, so the loop wakes on a sample
instead of waiting out its period - user-space producers an `eventfd` the loop hands them
over a Unix socket at `<ring path>.bell` (`Doorbell`, `ring_doorbell`), the kernel's programs
an 8-byte record in a BPF ring buffer pinned beside the ring (`<pin dir>/flow_ring_bell`,
`KernelBell`), whose fd wakes epoll itself (why two: a BPF program cannot write an eventfd).

Layout (little-endian, the seed's offsets):

  0x0000  u32 magic 0x52494E47 ("RING")      0x0004  u32 record size (64)
  0x0008  u64 producer index (records ever reserved)
  0x0010  u64 consumer index (records ever read; the reader alone stores it)
  0x0018  u64 drops (records lost because the reader was a full ring behind)
  0x1000  64 KiB ring: 1024 records of 64 bytes, record i at 0x1000 + (i mod 1024) * 64

Record (64 bytes):
  0   16 B src address (IPv4 as ::ffff:a.b.c.d)   -- the client, the request's sender
  16  16 B dst address                             -- the server
  32  u16 src port   34 u16 dst port   36 u8 family (4|6)   37 u8 kind   38..39 pad
  40  u32 rtt_us      (the sampler's first request byte in -> first response byte out)
  44  u32 seq         (commit word: (i mod 2^31) + 1 once record i is whole; 0 while written)
  48  u64 payload_bytes (request bytes before the response: the TCP sequence space covered, so a
                       retransmitted segment counts once)
  56  u64 ts_ns       (CLOCK_MONOTONIC, as bpf_ktime_get_ns / time.monotonic_ns)

Kinds (byte 37), and what the fields hold in each:
  0 KIND_EGRESS      the sampler at tc egress (a server's interface: request in, response out)
  1 KIND_INGRESS     the sampler at tc ingress (a client's interface: request out, response in)
  2 KIND_WRITE_BURST a watched process's write burst: src address bytes 0..3 the pid (u32),
                     4..7 the write calls (u32); rtt_us the burst's length so far (us);
                     payload_bytes the bytes written; no ports, family 0
  3 KIND_SERVING     the model server's view of one flow (client -> server, as the kernel keys
                     it): rtt_us the request's token throughput (tokens/s), payload_bytes its
                     KV-cache (prefix) hit rate in parts per million

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
import socket
import struct
import time
from dataclasses import dataclass

MAGIC = 0x52494E47
OFF_MAGIC, OFF_RECSIZE, OFF_PROD, OFF_CONS, OFF_DROPS = 0x0, 0x4, 0x8, 0x10, 0x18
RING_OFF, RING_BYTES, RECORD = 0x1000, 64 * 1024, 64
SLOTS = RING_BYTES // RECORD
SIZE = RING_OFF + RING_BYTES
REC_OFF_COMMIT, REC_OFF_SEQ = 40, 44      # the u64 commit word (rtt_us | seq << 32), its seq half
SEQ_MASK = 0x7FFFFFFF
REC_OFF_KIND = 37
KIND_EGRESS, KIND_INGRESS, KIND_WRITE_BURST, KIND_SERVING = 0, 1, 2, 3
KIND_NAMES = {KIND_EGRESS: "egress", KIND_INGRESS: "ingress", KIND_WRITE_BURST: "write-burst",
              KIND_SERVING: "serving"}
PPM = 1_000_000
_REC = struct.Struct("<16s16sHHBB2xIIQQ")
_PID = struct.Struct("<II")
assert _REC.size == RECORD
_U64 = struct.Struct("<Q")
assert SLOTS & (SLOTS - 1) == 0            # the C code masks the index

# The layout as C macros (bpf/layout.py hands them to the compiler; c/flow_ring.h asserts on them).
C_DEFINES = {"FLOW_RING_MAGIC": MAGIC, "FLOW_RING_OFF_PROD": OFF_PROD, "FLOW_RING_OFF_CONS": OFF_CONS,
             "FLOW_RING_OFF_DROPS": OFF_DROPS, "FLOW_RING_OFF": RING_OFF, "FLOW_RING_SLOTS": SLOTS,
             "FLOW_RECORD": RECORD, "FLOW_REC_OFF_COMMIT": REC_OFF_COMMIT, "FLOW_SEQ_MASK": SEQ_MASK,
             "FLOW_KIND_EGRESS": KIND_EGRESS, "FLOW_KIND_INGRESS": KIND_INGRESS,
             "FLOW_KIND_WRITE_BURST": KIND_WRITE_BURST, "FLOW_REC_OFF_KIND": REC_OFF_KIND}


def kernel_bell_path(ring_path: str) -> str:
    """Where the kernel ring's bell (a BPF ring buffer) is pinned: beside the ring."""
    return ring_path + "_bell"


def doorbell_path(ring_path: str) -> str:
    """Where the loop hands user-space producers its eventfd: a Unix socket beside the ring file."""
    return ring_path + ".bell"


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
    kind: int = KIND_EGRESS     # KIND_EGRESS or KIND_INGRESS: where the sampler closed it

    @property
    def flow(self) -> str:
        return f"{self.src}->{self.dst}"


@dataclass(frozen=True)
class WriteBurst:
    """KIND_WRITE_BURST: a watched process wrote `bytes` in `writes` calls over `length_us`."""
    pid: int
    writes: int
    length_us: int
    bytes: int
    ts_ns: int


@dataclass(frozen=True)
class ServingSample:
    """KIND_SERVING: the model server's figures for one flow's request."""
    src: str
    dst: str
    tokens_per_second: int
    kv_hit_rate: float          # 0..1
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
              payload_bytes: int, ts_ns: int, kind: int = KIND_EGRESS) -> bool:
        """Append one record; False (and drops + 1) when the ring is full."""
        src, family = _packed(src_ip)
        dst, _ = _packed(dst_ip)
        return self.write_raw(src, dst, src_port, dst_port, family, rtt_us, payload_bytes, ts_ns, kind)

    def write_serving(self, src_ip: str, src_port: int, dst_ip: str, dst_port: int, tokens_per_second: float,
                      kv_hit_rate: float, ts_ns: int) -> bool:
        """A KIND_SERVING record: the model server's figures for one flow's request."""
        return self.write(src_ip, src_port, dst_ip, dst_port, max(0, round(tokens_per_second)),
                          round(min(max(kv_hit_rate, 0.0), 1.0) * PPM), ts_ns, KIND_SERVING)

    def write_burst(self, pid: int, writes: int, length_us: int, nbytes: int, ts_ns: int) -> bool:
        """A KIND_WRITE_BURST record (the tracer's, from user space: tests, a fallback)."""
        src = _PID.pack(pid, writes) + bytes(8)
        return self.write_raw(src, bytes(16), 0, 0, 0, length_us, nbytes, ts_ns, KIND_WRITE_BURST)

    def write_raw(self, src16: bytes, dst16: bytes, sport: int, dport: int, family: int, rtt_us: int,
                  payload_bytes: int, ts_ns: int, kind: int = KIND_EGRESS) -> bool:
        """The same from the kernel event's own 16-byte addresses (no parsing on the hot path)."""
        prod = _U64.unpack_from(self.mv, OFF_PROD)[0]
        if prod - _U64.unpack_from(self.mv, OFF_CONS)[0] >= SLOTS:
            _U64.pack_into(self.mv, OFF_DROPS, _U64.unpack_from(self.mv, OFF_DROPS)[0] + 1)
            return False
        # A single writer: the record is whole (seq last) before the producer index moves.
        _REC.pack_into(self.mv, RING_OFF + (prod % SLOTS) * RECORD, bytes(src16), bytes(dst16), sport, dport,
                       family, kind, min(int(rtt_us), 0xFFFFFFFF), seq_of(prod), int(payload_bytes), int(ts_ns))
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
        self.unknown = 0            # records of a kind this reader does not know

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
        (src16, dst16, sport, dport, family, kind, rtt_us, seq, payload_bytes, ts_ns)."""
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

    def read(self, limit: int = SLOTS) -> list:
        """The records published since the last read (up to `limit`), oldest first: FlowSample,
        WriteBurst or ServingSample by kind (an unknown kind is counted in `unknown`, skipped)."""
        out = []
        for src, dst, sport, dport, family, kind, rtt, _seq, payload, ts in self.read_raw(limit):
            if kind in (KIND_EGRESS, KIND_INGRESS):
                out.append(FlowSample(f"{_addr(src, family)}:{sport}", f"{_addr(dst, family)}:{dport}", rtt,
                                      payload, ts, kind))
            elif kind == KIND_WRITE_BURST:
                pid, writes = _PID.unpack_from(src)
                out.append(WriteBurst(pid, writes, rtt, payload, ts))
            elif kind == KIND_SERVING:
                out.append(ServingSample(f"{_addr(src, family)}:{sport}", f"{_addr(dst, family)}:{dport}", rtt,
                                         min(payload, PPM) / PPM, ts))
            else:
                self.unknown += 1
        return out

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
        self.locked = lock(self.buf)

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
        self.locked = lock(self.buf)

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


# ---- keeping the mapping resident, and the doorbells -------------------------------------------
_PAGE = mmap.PAGESIZE


def lock(buf) -> bool:
    """mlock(2) the mapping `buf`: its pages stay in memory, so reading a sample never waits on a
    page fault. False where the kernel refuses (RLIMIT_MEMLOCK without CAP_IPC_LOCK): the ring
    still works, a first touch after eviction is merely slower."""
    libc = ctypes.CDLL(None, use_errno=True)
    view = (ctypes.c_char * len(buf)).from_buffer(buf)
    try:
        return libc.mlock(ctypes.c_void_p(ctypes.addressof(view)), ctypes.c_size_t(len(buf))) == 0
    finally:
        del view


class Doorbell:
    """The reader's side for user-space producers: an eventfd, handed over a Unix socket at `path`
    (SCM_RIGHTS) to every producer that connects; a producer writes it after publishing. The
    reader watches `fd` (readable: something was published) and `sock` (a producer asking)."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        os.chmod(path, 0o600)
        self.sock.listen(64)
        self.sock.setblocking(False)
        self.rings = 0

    def serve(self) -> None:
        """Hand the eventfd to each producer waiting on the socket."""
        while True:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            with conn:
                try:
                    socket.send_fds(conn, [b"bell"], [self.fd])
                except OSError:
                    pass

    def drain(self) -> int:
        """The rings since the last drain (0: none)."""
        try:
            n = os.eventfd_read(self.fd)
        except BlockingIOError:
            return 0
        self.rings += n
        return n

    def close(self) -> None:
        self.sock.close()
        os.close(self.fd)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class RingBell:
    """The producer's side: rings the reader's doorbell at `path` after a publish. Without a
    reader listening nothing happens (the reader's period still reads the ring); a reader that
    restarted (a new socket) is asked again for its eventfd, at most every `recheck_s`."""

    def __init__(self, path: str, recheck_s: float = 1.0, clock=time.monotonic):
        self.path, self.recheck_s, self.clock = path, recheck_s, clock
        self.fd: int | None = None
        self._inode = None
        self._checked = -recheck_s

    def _connect(self) -> None:
        try:
            st = os.stat(self.path)
            inode = (st.st_ino, st.st_ctime_ns)     # a new socket may reuse the old one's inode number
        except FileNotFoundError:
            inode = None
        if inode == self._inode and self.fd is not None:
            return
        self.close()
        self._inode = inode
        if inode is None:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(0.2)
                s.connect(self.path)
                _, fds, _, _ = socket.recv_fds(s, 16, 1)
            self.fd = fds[0] if fds else None
        except OSError:
            self.fd = None

    def ring(self) -> bool:
        now = self.clock()
        if now - self._checked >= self.recheck_s:
            self._checked = now
            self._connect()
        if self.fd is None:
            return False
        try:
            os.eventfd_write(self.fd, 1)
            return True
        except OSError:
            return False

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class KernelBell:
    """The reader's side of the kernel ring's bell: the BPF ring buffer pinned at `path`. Its fd
    is readable (epoll) while records are unread; `drain()` moves the consumer position to the
    producer's, so the fd is quiet until the next record (the records themselves say nothing:
    the samples are in the ring)."""

    def __init__(self, path: str):
        self.fd = _obj_get(path)
        self._cons = mmap.mmap(self.fd, _PAGE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        self._prod = mmap.mmap(self.fd, _PAGE, mmap.MAP_SHARED, mmap.PROT_READ, offset=_PAGE)
        self.rings = 0

    def drain(self) -> int:
        prod = _U64.unpack_from(self._prod, 0)[0]
        cons = _U64.unpack_from(self._cons, 0)[0]
        if prod != cons:
            _U64.pack_into(self._cons, 0, prod)
            self.rings += 1
        return int(prod != cons)

    def close(self) -> None:
        self._cons.close()
        self._prod.close()
        os.close(self.fd)
