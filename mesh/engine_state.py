"""The inference engine's state page: what a model server is doing, in a small shared mapping
the decision loop samples every millisecond (the seed's resource view: "the inference engine's
state, sampled every 1 ms"; scheduler/loop/resources.py). HTTP at 1 kHz would cost more than
the signal is worth; a page read is a memory read.

The model server (`mcpctl serve --engine-state PATH`) rewrites the page after every batch; the
loop (`mcpctl scheduler run --engine-state ENDPOINT=PATH`) reads it. One writer, any readers.

Layout (little-endian, 64 bytes at offset 0 of a 4 KiB file):
  0   u32 magic 0x454E4753 ("ENGS")    4  u32 version (1)
  8   u64 seq         even: the page is whole; odd: being written (a seqlock)
  16  u32 sessions    ONNX Runtime sessions loaded (each served model's, and a split model's narrow one)
  20  u32 models      models served
  24  u32 running     requests in batches computing now
  28  u32 queued      requests waiting in the batchers' queues
  32  u32 profiles    active optimisation profiles (TensorRT's; 0 where the provider has none)
  36  u32 pad
  40  u64 batches     batches computed so far
  48  u64 updated_ns  CLOCK_MONOTONIC of the last write
  56  u64 pad
"""
from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass

MAGIC, VERSION = 0x454E4753, 1
SIZE = 4096
_HEAD = struct.Struct("<IIQ")
_BODY = struct.Struct("<IIIIIIQQ")
_BODY_OFF = _HEAD.size


@dataclass(frozen=True)
class EngineState:
    sessions: int = 0
    models: int = 0
    running: int = 0
    queued: int = 0
    profiles: int = 0
    batches: int = 0
    updated_ns: int = 0


def _map(path: str, create: bool) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o600)
    try:
        if create:
            os.ftruncate(fd, SIZE)
        return mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


class EngineStateWriter:
    def __init__(self, path: str):
        self.buf = _map(path, create=True)
        self.seq = 0
        _HEAD.pack_into(self.buf, 0, MAGIC, VERSION, 0)

    def write(self, s: EngineState) -> None:
        self.seq += 1                                   # odd: being written
        _HEAD.pack_into(self.buf, 0, MAGIC, VERSION, self.seq)
        _BODY.pack_into(self.buf, _BODY_OFF, s.sessions, s.models, s.running, s.queued, s.profiles, 0, s.batches,
                        s.updated_ns or time.monotonic_ns())
        self.seq += 1                                   # even: whole
        _HEAD.pack_into(self.buf, 0, MAGIC, VERSION, self.seq)

    def close(self) -> None:
        self.buf.close()


class EngineStateReader:
    def __init__(self, path: str):
        self.buf = _map(path, create=False)
        magic, version, _ = _HEAD.unpack_from(self.buf, 0)
        if magic != MAGIC or version != VERSION:
            raise ValueError(f"{path}: not an engine state page (magic {magic:#x}, version {version})")

    def read(self, tries: int = 4) -> EngineState | None:
        """The page as last written whole; None when every try met a write in progress."""
        for _ in range(tries):
            seq = _HEAD.unpack_from(self.buf, 0)[2]
            if seq & 1:
                continue
            body = _BODY.unpack_from(self.buf, _BODY_OFF)
            if _HEAD.unpack_from(self.buf, 0)[2] == seq:
                sessions, models, running, queued, profiles, _, batches, updated = body
                return EngineState(sessions, models, running, queued, profiles, batches, updated)
        return None

    def close(self) -> None:
        self.buf.close()
