"""The seed's shared-memory flow ring: per-flow kernel samples (RTT, payload size) handed from
the bpf part's user space to the decision loop through any writable buffer (a file-backed mmap).

Layout (little-endian, the seed's offsets):

  0x0000  u32 magic 0x52494E47 ("RING")      0x0004  u32 record size (64)
  0x0008  u64 producer index (records ever written; the writer alone stores it)
  0x0010  u64 consumer index (records ever read; the reader alone stores it)
  0x0018  u64 drops (records the writer dropped because the ring was full: a slow reader)
  0x1000  64 KiB ring: 1024 records of 64 bytes, record i at 0x1000 + (i mod 1024) * 64

Record (64 bytes):
  0   16 B src address (IPv4 as ::ffff:a.b.c.d)   -- the client, the request's sender
  16  16 B dst address                             -- the server
  32  u16 src port   34 u16 dst port   36 u8 family (4|6)   37..39 pad
  40  u32 rtt_us      (the sampler's first request byte in -> first response byte out)
  44  u32 pad
  48  u64 payload_bytes (request bytes the kernel saw before the response)
  56  u64 ts_ns       (CLOCK_MONOTONIC, as bpf_ktime_get_ns / time.monotonic_ns)

One writer, one reader. The writer fills the record, then stores the producer index; the reader
reads records up to the producer index through a memoryview of the buffer (no copy of the ring),
then stores the consumer index. A full ring drops the new record and counts it: the traffic
never waits for the reader.
"""
from __future__ import annotations

import ipaddress
import mmap
import os
import struct
from dataclasses import dataclass

MAGIC = 0x52494E47
OFF_MAGIC, OFF_RECSIZE, OFF_PROD, OFF_CONS, OFF_DROPS = 0x0, 0x4, 0x8, 0x10, 0x18
RING_OFF, RING_BYTES, RECORD = 0x1000, 64 * 1024, 64
SLOTS = RING_BYTES // RECORD
SIZE = RING_OFF + RING_BYTES
_REC = struct.Struct("<16s16sHHB3xI4xQQ")
assert _REC.size == RECORD
_U64 = struct.Struct("<Q")


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
    def __init__(self, buf):
        self.mv = memoryview(buf)
        _check(self.mv)

    def write(self, src_ip: str, src_port: int, dst_ip: str, dst_port: int, rtt_us: int,
              payload_bytes: int, ts_ns: int) -> bool:
        """Append one record; False (and drops + 1) when the ring is full."""
        prod = _U64.unpack_from(self.mv, OFF_PROD)[0]
        cons = _U64.unpack_from(self.mv, OFF_CONS)[0]
        if prod - cons >= SLOTS:
            _U64.pack_into(self.mv, OFF_DROPS, _U64.unpack_from(self.mv, OFF_DROPS)[0] + 1)
            return False
        src, family = _packed(src_ip)
        dst, _ = _packed(dst_ip)
        _REC.pack_into(self.mv, RING_OFF + (prod % SLOTS) * RECORD, src, dst, src_port, dst_port, family,
                       min(int(rtt_us), 0xFFFFFFFF), int(payload_bytes), int(ts_ns))
        _U64.pack_into(self.mv, OFF_PROD, prod + 1)          # publish after the record is whole
        return True

    def write_raw(self, src16: bytes, dst16: bytes, sport: int, dport: int, family: int, rtt_us: int,
                  payload_bytes: int, ts_ns: int) -> bool:
        """The same from the kernel event's own 16-byte addresses (no parsing on the hot path)."""
        prod = _U64.unpack_from(self.mv, OFF_PROD)[0]
        if prod - _U64.unpack_from(self.mv, OFF_CONS)[0] >= SLOTS:
            _U64.pack_into(self.mv, OFF_DROPS, _U64.unpack_from(self.mv, OFF_DROPS)[0] + 1)
            return False
        _REC.pack_into(self.mv, RING_OFF + (prod % SLOTS) * RECORD, bytes(src16), bytes(dst16), sport, dport,
                       family, min(int(rtt_us), 0xFFFFFFFF), int(payload_bytes), int(ts_ns))
        _U64.pack_into(self.mv, OFF_PROD, prod + 1)
        return True

    def close(self) -> None:
        self.mv.release()


class FlowRingReader:
    def __init__(self, buf):
        self.mv = memoryview(buf)
        _check(self.mv)

    def pending(self) -> int:
        return _U64.unpack_from(self.mv, OFF_PROD)[0] - _U64.unpack_from(self.mv, OFF_CONS)[0]

    @property
    def drops(self) -> int:
        return _U64.unpack_from(self.mv, OFF_DROPS)[0]

    def read(self, limit: int = SLOTS) -> list[FlowSample]:
        """The records written since the last read (up to `limit`), oldest first."""
        prod = _U64.unpack_from(self.mv, OFF_PROD)[0]
        cons = _U64.unpack_from(self.mv, OFF_CONS)[0]
        out = []
        while cons < prod and len(out) < limit:
            src, dst, sport, dport, family, rtt, payload, ts = _REC.unpack_from(
                self.mv, RING_OFF + (cons % SLOTS) * RECORD)
            out.append(FlowSample(f"{_addr(src, family)}:{sport}", f"{_addr(dst, family)}:{dport}",
                                  rtt, payload, ts))
            cons += 1
        _U64.pack_into(self.mv, OFF_CONS, cons)
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

    def writer(self) -> FlowRingWriter:
        return FlowRingWriter(self.buf)

    def reader(self) -> FlowRingReader:
        return FlowRingReader(self.buf)

    def close(self) -> None:
        try:
            self.buf.close()
        except BufferError:        # a memoryview still open on it: the mapping goes with the process
            pass
