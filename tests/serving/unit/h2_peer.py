"""A client's side of an HTTP/2 connection written by hand, for the socket-free tests of
serving.h2.connection: frames built with the shared codec, headers encoded with the hpack
package (an encoder that is not ours), the server's answer split back into frames."""
from __future__ import annotations

import struct

from hpack import Decoder, Encoder, NeverIndexedHeaderTuple

from mcp26.serving.h2 import limits as h2_limits
from mcp26.serving.h2.connection import H2Connection
from mcp26.serving.h2.events import ConnectionTerminated
from mcp26.serving.h2.frames import (END_HEADERS, END_STREAM, GOAWAY, HEADERS, PREFACE, RST_STREAM, SETTINGS,
                                     frame, split)


def request(path: str = "/t.S/Echo", *extra) -> list:
    return [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
            ("content-type", "application/grpc"), ("te", "trailers"), *extra]


def grpc_message(data: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(data)) + data


class Peer:
    """Bytes into a sans-IO H2Connection on a clock the test moves, its frames out."""

    def __init__(self, limits: h2_limits.Limits = h2_limits.DEFAULT, settings: bytes = b"", preface: bool = True):
        self.conn = H2Connection(limits)
        self.conn.initiate()
        self.encoder, self.decoder = Encoder(), Decoder()
        self.now = 1000.0
        self.frames: list = []          # everything the server sent, in order
        self.events: list = []
        self.read()
        if preface:
            self.send(PREFACE + frame(SETTINGS, 0, 0, settings))

    def send(self, data: bytes, dt: float = 0.0) -> list:
        """Feed bytes (after `dt` seconds); the events they made (also kept in self.events)."""
        self.now += dt
        events = self.conn.receive(data, self.now)
        self.events += events
        self.read()
        return events

    def read(self, limit: int = 1 << 30) -> list:
        out = self.conn.data_to_send(limit)
        frames, used = split(out, 1 << 24)
        assert used == len(out)
        self.frames += frames
        return frames

    def block(self, fields: list) -> bytes:
        """Fields never indexed: the tests add table entries of their own by hand."""
        return self.encoder.encode([NeverIndexedHeaderTuple(k, v) for k, v in fields])

    def headers(self, sid: int, fields: list, end_stream: bool = False) -> bytes:
        return frame(HEADERS, END_HEADERS | (END_STREAM if end_stream else 0), sid, self.block(fields))

    def goaway(self) -> tuple[int, bytes] | None:
        """(error code, debug data) of the server's GOAWAY, if it sent one."""
        for kind, _, _, payload in self.frames:
            if kind == GOAWAY:
                return struct.unpack(">I", payload[4:8])[0], payload[8:]
        return None

    def resets(self) -> dict[int, int]:
        return {sid: struct.unpack(">I", p)[0] for kind, _, sid, p in self.frames if kind == RST_STREAM}

    def terminated(self) -> bool:
        return any(type(e) is ConnectionTerminated for e in self.events)

    def decode(self, payload: bytes) -> dict:
        return {k: v for k, v in self.decoder.decode(payload)}

    def of(self, kind: int, sid: int | None = None) -> list:
        return [f for f in self.frames if f[0] == kind and (sid is None or f[2] == sid)]
