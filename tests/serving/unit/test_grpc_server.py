"""serving.grpc.server on its HTTP/2 shell (serving.h2.protocol) with an in-memory transport:
no sockets, a real event loop. What a client's bytes make handlers do (deadlines, resets,
connection loss), the backpressure every writer gets (context.write, async generators,
iterators), the bound on half-sent request messages, and that a closed connection's calls
are freed without the cyclic garbage collector."""
from __future__ import annotations

import asyncio
import gc
import struct
import weakref

import grpc
import pytest
from h2_peer import grpc_message, request
from hpack import Decoder, Encoder, NeverIndexedHeaderTuple

from mcp26.serving.grpc.server import CONNECTION_BUFFER, MESSAGE_OVERHEAD, STREAM_BUFFER, Call, GrpcLane
from mcp26.serving.h2 import limits as h2_limits
from mcp26.serving.h2.frames import (ACK, CONTINUATION, DATA, END_HEADERS, END_STREAM, ENHANCE_YOUR_CALM, FLOW_CONTROL_ERROR,
                                     GOAWAY, HEADERS, PING, PREFACE, RST_STREAM, SETTINGS, WINDOW_UPDATE, frame,
                                     split)

U32 = struct.Struct(">I")
MB = 1 << 20


class Transport:
    """asyncio's transport as the protocol sees it: writes kept, a high-water mark that pauses
    the writer, pause/resume of reading recorded."""

    def __init__(self, protocol, high: int = 1 << 30):
        self.protocol, self.high = protocol, high
        self.out = bytearray()
        self.reading = True
        self.closed = False
        self.writer_paused = False

    def write(self, data) -> None:
        self.out += data
        if not self.writer_paused and len(self.out) > self.high:
            self.writer_paused = True
            self.protocol.pause_writing()

    def take(self) -> bytes:
        """What the peer reads now (the buffer empties: the writer resumes)."""
        data, self.out = bytes(self.out), bytearray()
        if self.writer_paused:
            self.writer_paused = False
            self.protocol.resume_writing()
        return data

    def get_write_buffer_size(self) -> int:
        return len(self.out)

    def get_extra_info(self, name):
        return ("127.0.0.1", 40000) if name == "peername" else None

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)


class Client:
    """One connection to `lane` over a Transport: frames in, frames out."""

    def __init__(self, lane: GrpcLane, settings: bytes = b"", high: int = 1 << 30):
        self.conn = lane.new_connection()
        self.t = Transport(self.conn, high)
        self.conn.connection_made(self.t)
        self.enc, self.dec = Encoder(), Decoder()
        self.frames: list = []
        self.send(PREFACE + frame(SETTINGS, 0, 0, settings))

    def send(self, data: bytes) -> None:
        self.conn.data_received(data)

    def headers(self, sid: int, fields: list, end_stream: bool = False) -> bytes:
        block = self.enc.encode([NeverIndexedHeaderTuple(k, v) for k, v in fields])
        parts = [block[i:i + 16384] for i in range(0, len(block), 16384)]
        end = END_STREAM if end_stream else 0
        if len(parts) == 1:
            return frame(HEADERS, END_HEADERS | end, sid, block)
        return frame(HEADERS, end, sid, parts[0]) + b"".join(
            frame(CONTINUATION, END_HEADERS if i == len(parts) - 1 else 0, sid, p) for i, p in enumerate(parts) if i)

    def call(self, sid: int, path: str, message: bytes, *extra) -> bytes:
        return self.headers(sid, request(path, *extra)) + frame(DATA, END_STREAM, sid, grpc_message(message))

    async def settle(self, turns: int = 5) -> list:
        for _ in range(turns):
            await asyncio.sleep(0)
        frames, used = split(self.t.take(), 1 << 24)
        self.frames += frames
        return frames

    def status(self, sid: int) -> dict:
        """The header block of `sid` that ended it (its trailers, or a trailers-only answer),
        decoded; else its response headers; {} before either."""
        out = {}
        for kind, flags, s, payload in self.frames:
            if kind == HEADERS and s == sid:
                out = dict(self.dec.decode(payload))
                if flags & END_STREAM:
                    break
        return out

    def body(self, sid: int) -> bytes:
        return b"".join(f[3] for f in self.frames if f[0] == DATA and f[2] == sid)

    def of(self, kind: int, sid: int | None = None) -> list:
        return [f for f in self.frames if f[0] == kind and (sid is None or f[2] == sid)]


class Seen:
    def __init__(self):
        self.started, self.cancelled, self.finished, self.written = set(), set(), set(), 0
        self.go = asyncio.Event()


def lane_with(seen: Seen, **options) -> GrpcLane:
    async def echo(req, ctx):
        return req

    async def slow(req, ctx):
        tag = dict(ctx.invocation_metadata()).get("tag", "")
        seen.started.add(tag)
        try:
            await asyncio.sleep(float(req))
        except asyncio.CancelledError:
            seen.cancelled.add(tag)
            raise
        seen.finished.add(tag)
        return b"slept"

    async def flood(req, ctx):              # int(req) writes of 256 KiB, counted once each returns
        for i in range(int(req)):
            await ctx.write(bytes([i]) * (256 << 10))
            seen.written += 1

    async def flood_gen(req, ctx):          # the same as an async generator
        for i in range(int(req)):
            yield bytes([i]) * (256 << 10)
            seen.written += 1

    def flood_iter(req, ctx):               # and as a plain iterator
        for i in range(int(req)):
            yield bytes([i]) * (256 << 10)
            seen.written += 1

    async def bidi(it, ctx):
        async for r in it:
            yield r[::-1]

    async def noread(it, ctx):              # reads nothing until its request is "go"
        await seen.go.wait()
        n = 0
        async for _ in it:
            n += 1
        return str(n).encode()

    lane = GrpcLane(64 * MB, 64 * MB, **options)
    lane.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.S", {
        "Echo": grpc.unary_unary_rpc_method_handler(echo),
        "Slow": grpc.unary_unary_rpc_method_handler(slow),
        "Flood": grpc.unary_stream_rpc_method_handler(flood),
        "FloodGen": grpc.unary_stream_rpc_method_handler(flood_gen),
        "FloodIter": grpc.unary_stream_rpc_method_handler(flood_iter),
        "B": grpc.stream_stream_rpc_method_handler(bidi),
        "NoRead": grpc.stream_unary_rpc_method_handler(noread),
    }),))
    return lane


def run(coro):
    return asyncio.run(coro)


def test_405_and_415_with_a_body_and_a_server_side_deadline():
    async def main():
        seen = Seen()
        c = Client(lane_with(seen))
        c.send(c.headers(1, [(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "x")],
                         end_stream=True)
               + c.headers(3, request()[:4] + [("content-type", "text/plain")], end_stream=True)
               + c.call(5, "/t.S/Slow", b"30", ("grpc-timeout", "100m"), ("tag", "deadline")))
        await c.settle()
        assert c.status(1)[":status"] == "405" and c.status(3)[":status"] == "415"
        assert b"gRPC server" in c.body(1) and c.of(DATA, 1)[-1][1] & END_STREAM
        await asyncio.sleep(0.2)
        await c.settle()
        assert c.status(5)["grpc-status"] == "4" and seen.cancelled == {"deadline"}
    run(main())


def test_a_405_waits_for_the_request_to_end():
    """So that a malformed request is still told so (its content-length against its body)."""
    async def main():
        c = Client(lane_with(Seen()))
        c.send(c.headers(1, [(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "x"),
                             ("content-length", "1")]))
        await c.settle()
        assert not c.of(HEADERS, 1)
        c.send(frame(DATA, END_STREAM, 1, b"test"))
        await c.settle()
        assert c.of(RST_STREAM, 1) and not c.of(HEADERS, 1)
    run(main())


def test_connection_drop_and_client_reset_cancel_handlers():
    async def main():
        seen = Seen()
        c = Client(lane_with(seen))
        c.send(c.call(1, "/t.S/Slow", b"30", ("tag", "reset")) + c.call(3, "/t.S/Slow", b"30", ("tag", "drop")))
        await c.settle()
        assert seen.started == {"reset", "drop"}
        c.send(frame(RST_STREAM, 0, 1, U32.pack(8)))
        await c.settle()
        assert seen.cancelled == {"reset"}
        c.conn.connection_lost(None)
        await c.settle()
        assert seen.cancelled == {"reset", "drop"} and not seen.finished
    run(main())


def test_stream_window_overflow_resets_that_stream_and_cancels_its_handler():
    async def main():
        seen = Seen()
        c = Client(lane_with(seen))
        c.send(c.call(1, "/t.S/Slow", b"30", ("tag", "overflow")))
        await c.settle()
        c.send(frame(WINDOW_UPDATE, 0, 1, U32.pack(0x7FFFFFFF)))
        await c.settle()
        assert [U32.unpack(f[3])[0] for f in c.of(RST_STREAM)] == [FLOW_CONTROL_ERROR]
        assert seen.cancelled == {"overflow"} and not c.of(GOAWAY) and not c.t.closed
    run(main())


@pytest.mark.parametrize("method", ["Flood", "FloodGen", "FloodIter"])
def test_every_streaming_writer_waits_for_the_peers_window(method):
    """context.write, an async generator's and an iterator's messages: each waits until it has
    left. A client granting no window holds the writer at its first 256 KiB message (a
    generator ran ahead: 1.1 MB of requests made 107 MB of answers), and a WINDOW_UPDATE lets
    every one through, intact and in order."""
    async def main():
        seen = Seen()
        c = Client(lane_with(seen))
        c.send(c.call(1, f"/t.S/{method}", b"16"))
        await c.settle(20)
        assert sum(len(f[3]) for f in c.of(DATA, 1)) == 65535
        assert seen.written <= 1
        queued = sum(st.queued for st in c.conn.streams.values())
        assert queued <= (256 << 10) + 5, f"{queued} bytes queued for a client that grants no window"
        c.send(frame(WINDOW_UPDATE, 0, 0, U32.pack(64 * MB)) + frame(WINDOW_UPDATE, 0, 1, U32.pack(64 * MB)))
        for _ in range(40):
            await c.settle(5)
        assert c.body(1) == b"".join(grpc_message(bytes([i]) * (256 << 10)) for i in range(16))
        assert seen.written == 16 and c.status(1)["grpc-status"] == "0"
    run(main())


def test_client_not_reading_stops_the_server_reading():
    """A client that reads nothing and sends PINGs: once the transport's buffer passes its mark
    the shell stops reading (what we owe it cannot grow), and reads again once it drains."""
    async def main():
        c = Client(lane_with(Seen()), high=64 << 10)
        c.send(c.call(1, "/t.S/Flood", b"2") + frame(WINDOW_UPDATE, 0, 0, U32.pack(8 * MB))
               + frame(WINDOW_UPDATE, 0, 1, U32.pack(8 * MB)))
        for _ in range(10):
            await asyncio.sleep(0)
        assert not c.t.reading and c.conn.write_paused
        c.t.take()
        assert c.t.reading
    run(main())


def test_window_updates_with_a_ping_each_while_an_answer_flows_are_not_abuse():
    """A client opening its window 64 KiB at a time with a PING each time (grpc-core's BDP probe):
    the DATA each WINDOW_UPDATE lets out clears the strikes."""
    async def main():
        c = Client(lane_with(Seen()))
        c.send(c.call(1, "/t.S/Flood", b"4"))
        for i in range(40):
            await c.settle()
            if "grpc-status" in c.status(1) or c.of(GOAWAY):
                break
            c.send(frame(PING, 0, 0, b"%08d" % i) + frame(WINDOW_UPDATE, 0, 0, U32.pack(65535))
                   + frame(WINDOW_UPDATE, 0, 1, U32.pack(65535)))
        assert not c.of(GOAWAY) and c.status(1)["grpc-status"] == "0"
        assert c.body(1) == b"".join(grpc_message(bytes([i]) * (256 << 10)) for i in range(4))
    run(main())


@pytest.mark.parametrize("interval, kept", [(0.001, True), (None, False)])
def test_pings_on_a_quiet_open_stream_within_min_ping_interval(interval, kept):
    """An open stream with nothing to answer yet (an ADS stream between pushes) and a client
    pinging: allowed past min_ping_interval_s; the default (300 s, grpc-core's) ends it."""
    async def main():
        options = {"min_ping_interval_s": interval} if interval else {}
        c = Client(lane_with(Seen(), **options))
        c.send(c.headers(1, request("/t.S/B")))
        for i in range(5):
            await asyncio.sleep(0.003)
            c.send(frame(PING, 0, 0, b"%08d" % i))
        await c.settle()
        goaway = c.of(GOAWAY)
        if kept:
            assert not goaway and len([f for f in c.of(PING) if f[1] & ACK]) == 5
        else:
            assert goaway and U32.unpack(goaway[0][3][4:8])[0] == ENHANCE_YOUR_CALM
    run(main())


def test_streams_past_1024_refused_and_the_accepted_ones_live():
    async def main():
        c = Client(lane_with(Seen()))
        ids = [1 + 2 * i for i in range(1100)]
        c.send(b"".join(c.headers(sid, request()) for sid in ids))
        await c.settle()
        resets = {f[2]: U32.unpack(f[3])[0] for f in c.of(RST_STREAM)}
        assert set(resets) == set(ids[1024:]) and set(resets.values()) == {7}
        c.send(frame(DATA, END_STREAM, ids[0], grpc_message(b"first"))
               + frame(DATA, END_STREAM, ids[1023], grpc_message(b"last")))
        await c.settle()
        assert c.body(ids[0]) == grpc_message(b"first") and c.body(ids[1023]) == grpc_message(b"last")
    run(main())


def test_oversized_metadata_fails_only_that_call():
    async def main():
        c = Client(lane_with(Seen()))
        c.send(c.call(1, "/t.S/Echo", b"x", ("big", "v" * 20000)) + c.call(3, "/t.S/Echo", b"y"))
        await c.settle()
        assert c.status(1)["grpc-status"] == "8" and c.status(3)["grpc-status"] == "0"
    run(main())


def test_half_sent_messages_on_one_connection_are_bounded():
    """16 streams each sending the first half of a 24 MB message, windows ignored: the window
    comes back for one stream past CONNECTION_BUFFER, not the others, so a client sending past
    them is told FLOW_CONTROL_ERROR and what the server holds stays near the budget (it held
    all 385 MB)."""
    async def main():
        c = Client(lane_with(Seen()))
        chunk = b"\x00" + U32.pack(24 * MB) + b"x" * (16384 - 5)
        body = b"x" * 16384
        c.send(b"".join(c.headers(1 + 2 * i, request("/t.S/Echo")) for i in range(16)))
        for rnd in range(12 * MB // 16384):
            c.send(b"".join(frame(DATA, 0, 1 + 2 * i, chunk if rnd == 0 else body) for i in range(16)))
            if rnd % 64 == 0:
                await c.settle(1)
            if c.t.closed:
                break
        await c.settle()
        held = c.conn.user.holding
        assert held <= CONNECTION_BUFFER + 24 * MB + 16 * MB, f"{held / MB:.0f} MB held"
        codes = {U32.unpack(f[3])[0] for f in c.of(RST_STREAM)} | {U32.unpack(f[3][4:8])[0] for f in c.of(GOAWAY)}
        assert FLOW_CONTROL_ERROR in codes
    run(main())


def test_a_closed_connections_calls_are_freed_without_the_cyclic_collector():
    """Stream <-> Call <-> Context <-> task: links cut on connection loss and when a call ends
    (212 MB stayed after a client left, until gc.collect())."""
    async def main():
        seen = Seen()
        lane = lane_with(seen)
        c = Client(lane)
        c.send(b"".join(c.call(1 + 2 * i, "/t.S/Slow", b"30", ("tag", str(i))) for i in range(20))
               + c.call(41, "/t.S/Echo", b"done") + c.headers(43, request("/t.S/B")))
        await c.settle()
        calls = [weakref.ref(st.user.context) for st in c.conn.streams.values() if st.user is not None]
        assert len(calls) == 21 and c.status(41)["grpc-status"] == "0"
        conn = weakref.ref(c.conn)
        c.conn.connection_lost(None)
        c.t.protocol = None
        del c
        for _ in range(10):
            await asyncio.sleep(0)
        return calls, conn, seen
    gc.disable()
    try:
        gc.collect()
        calls, conn, seen = run(main())
        alive = [r for r in calls if r() is not None]
        assert len(seen.cancelled) == 20
        assert not alive, f"{len(alive)} calls' contexts kept alive by reference cycles"
        assert not [o for o in gc.get_objects() if type(o) is Call], "calls kept alive by reference cycles"
        assert conn() is None, "the connection is kept alive by a reference cycle"
    finally:
        gc.enable()


def test_large_requests_past_the_connection_buffer_all_arrive():
    """20 x 2 MB requests at once from a client that keeps to its windows: past CONNECTION_BUFFER
    one call at a time gets its window back, and each one that completes hands the place on
    (all of them waited for windows that never came)."""
    async def main():
        c = Client(lane_with(Seen()), settings=struct.pack(">HI", 4, 1 << 30))     # the answers: no wait
        c.send(frame(WINDOW_UPDATE, 0, 0, U32.pack(1 << 30)))
        bodies = {1 + 2 * i: grpc_message(bytes([i]) * (2 * MB)) for i in range(20)}
        sent = dict.fromkeys(bodies, 0)
        windows = dict.fromkeys(bodies, 65535)          # the stream's, before our SETTINGS is read
        conn_window = 65535
        c.send(b"".join(c.headers(sid, request("/t.S/Echo")) for sid in bodies))
        for _ in range(3000):
            for f in await c.settle(1):
                if f[0] == SETTINGS and not f[1] & ACK:
                    for k, v in (struct.unpack_from(">HI", f[3], o) for o in range(0, len(f[3]), 6)):
                        if k == 4:
                            windows = {sid: w + v - 65535 for sid, w in windows.items()}
                elif f[0] == WINDOW_UPDATE:
                    inc = U32.unpack(f[3])[0]
                    if f[2] == 0:
                        conn_window += inc
                    elif f[2] in windows:
                        windows[f[2]] += inc
            out = []
            for sid, body in bodies.items():
                n = min(16384, windows[sid], conn_window, len(body) - sent[sid])
                if n > 0:
                    end = END_STREAM if sent[sid] + n == len(body) else 0
                    out.append(frame(DATA, end, sid, body[sent[sid]:sent[sid] + n]))
                    sent[sid] += n
                    windows[sid] -= n
                    conn_window -= n
            if out:
                c.send(b"".join(out))
            if all(c.status(sid).get("grpc-status") for sid in bodies):
                break
        assert not c.of(GOAWAY) and not c.of(RST_STREAM)
        assert all(c.body(sid) == body for sid, body in bodies.items()), \
            f"{sum(sent.values()) / MB:.0f} MB of {40} sent"
    run(main())


def test_tiny_messages_a_handler_does_not_read_stay_bytes_past_the_stream_buffer():
    """A window's worth (256 KiB) of 10-byte messages to a handler that reads none: parsed and queued
    only up to STREAM_BUFFER (each counted with MESSAGE_OVERHEAD), the rest kept as bytes (150,000
    message objects were 93 MB). Once the handler reads, every message arrives, in order."""
    async def main():
        seen = Seen()
        c = Client(lane_with(seen))
        c.send(c.headers(1, request("/t.S/NoRead")))
        one = grpc_message(b"hello")
        frames = [frame(DATA, 0, 1, one * (16380 // len(one))) for _ in range(h2_limits.DEFAULT.stream_window // 16380)]
        c.send(b"".join(frames))
        await c.settle()
        (st,) = c.conn.streams.values()
        call = st.user
        assert call.queue.qsize() <= STREAM_BUFFER // MESSAGE_OVERHEAD + 1, call.queue.qsize()
        assert len(call.buf) > h2_limits.DEFAULT.stream_window // 2 and not c.of(GOAWAY)
        total = sum(len(f) - 9 for f in frames) // len(one)
        c.send(frame(DATA, END_STREAM, 1, b""))
        seen.go.set()
        for _ in range(50):
            await c.settle()
            if "grpc-status" in c.status(1):
                break
        assert c.body(1) == grpc_message(str(total).encode()) and c.status(1)["grpc-status"] == "0"
    run(main())
