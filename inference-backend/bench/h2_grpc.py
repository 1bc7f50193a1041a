"""mcp-bench's own gRPC client: unary calls over HTTP/2 on asyncio, no grpcio.

Why: grpcio's client spent ~370 µs of CPU a call here (its C core, a thread
hop per completion, the Python objects of each call), more than our server
spends answering one, so against a fast server at relu gRPC c=1 mcp-bench
measured itself. This one does what a benchmark's client must and no more:
- the request's HEADERS block is encoded once per priority (literals, never
  indexed; `:method`/`:scheme` from the static table) and each call writes it
  and one DATA frame (more where the peer's frame size or windows say so);
- frames are built and split with the server's own codec (serving/h2/frames.py),
  blocks encoded with its HPACK helpers and decoded with its decoder;
- what a loop turn writes goes out in one transport write;
- answers are not parsed: HEADERS blocks are decoded (serving.h2.hpack_decoder) for
  `:status`, `grpc-status` and the timing headers, DATA is only counted;
- flow control both ways (our windows are opened wide at the start and
  topped up; the peer's are honoured), SETTINGS and PING acknowledged,
  RST_STREAM and GOAWAY end the calls they name;
- a call's deadline travels as `grpc-timeout`, and mcp-bench's sweeper
  cancels a call past it (RST_STREAM CANCEL) as it aborts a late HTTP/1.1 one.

An answer ends a call as grpcio would end it: `grpc-status` from the trailers
(or a trailers-only answer), an HTTP status other than 200 mapped as gRPC maps
it, a stream reset as UNAVAILABLE (REFUSED_STREAM) or CANCELLED, a connection
lost as unavailable/connection-closed.
"""
from __future__ import annotations

import asyncio
import collections
import time
from typing import Callable

from mcp26.serving.h2.frames import (ACK, CANCEL, CONTINUATION, DATA, DEFAULT_FRAME, DEFAULT_WINDOW, END_HEADERS,
                                     END_STREAM, GOAWAY, HEADERS, MAX_FRAME_LIMIT, MAX_WINDOW, PADDED, PING, PREFACE,
                                     PROTOCOL_ERROR, REFUSED_STREAM, RST_STREAM, S_ENABLE_PUSH, S_INITIAL_WINDOW_SIZE,
                                     S_MAX_CONCURRENT_STREAMS, S_MAX_FRAME_SIZE, SETTING, SETTINGS, U32,
                                     WINDOW_UPDATE, ProtocolError, frame, goaway, header_fragment, settings, split,
                                     unpad)
from mcp26.serving.h2.hpack_decoder import Decoder
from mcp26.serving.h2.hpack_encoder import literal, named_literal

OUR_WINDOW = 1 << 30            # what the server may send before we top it up
# grpcio's mapping of an HTTP status that is not 200 (grpc's http-grpc-status-mapping.md)
HTTP_TO_GRPC = {400: 13, 401: 16, 403: 7, 404: 12, 429: 14, 502: 14, 503: 14, 504: 14}
UNKNOWN, CANCELLED, UNAVAILABLE, INTERNAL = 2, 1, 14, 13

# Done(grpc status or None when the connection went, initial headers, trailers)
Done = Callable[[int | None, list, list], None]


def header_block(authority: str, path: str, metadata: tuple = (), timeout_s: float | None = None) -> bytes:
    """A request's HEADERS block: POST, http, the path and authority, gRPC's content-type and te,
    `grpc-timeout` (ms) and the metadata, none of it indexed (nothing to keep in step with)."""
    block = (b"\x83\x86" + named_literal(4, path.encode()) + named_literal(1, authority.encode())
             + named_literal(31, b"application/grpc") + literal(b"te", b"trailers"))
    if timeout_s is not None:
        block += literal(b"grpc-timeout", f"{max(1, int(timeout_s * 1000))}m".encode())
    for k, v in metadata:
        block += literal(k.encode(), v.encode())
    return block


class _Call:
    __slots__ = ("stream", "block", "message", "sent", "done", "started", "headers", "trailers", "data")

    def __init__(self, block: bytes, message: bytes, done: Done):
        self.stream = 0
        self.block, self.message, self.sent = block, message, 0
        self.done = done
        self.started = time.perf_counter()
        self.headers: list | None = None
        self.trailers: list = []
        self.data = 0


class H2GrpcConnection(asyncio.Protocol):
    """One HTTP/2 connection carrying unary gRPC calls (`call()`), as many at once as the
    server's SETTINGS_MAX_CONCURRENT_STREAMS allows; the rest wait their turn."""

    def __init__(self):
        self.transport = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.buf = bytearray()
        self.out: list[bytes] = []
        self.flush_scheduled = False
        self.next_stream = 1
        self.streams: dict[int, _Call] = {}
        self.waiting: collections.deque[_Call] = collections.deque()   # over the stream limit or window
        self.max_streams = 1 << 31
        self.peer_window = DEFAULT_WINDOW               # the connection's send window
        self.peer_initial = DEFAULT_WINDOW              # each new stream's
        self.stream_windows: dict[int, int] = {}
        self.max_frame = DEFAULT_FRAME
        self.received = 0                               # DATA bytes since we last topped our window up
        self.decoder = Decoder(max_list=1 << 20)
        self.continuing: tuple[int, int, bytearray] | None = None    # (stream, flags, block) until END_HEADERS
        self.closed = False
        self.gone_away = False              # GOAWAY received

    async def connect(self, host: str, port: int, timeout: float = 10.0) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.wait_for(loop.create_connection(lambda: self, host, port), timeout)

    # -- asyncio.Protocol ---------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.loop = asyncio.get_running_loop()
        ours = settings((S_ENABLE_PUSH, 0), (S_INITIAL_WINDOW_SIZE, OUR_WINDOW))
        transport.write(PREFACE + frame(SETTINGS, 0, 0, ours)
                        + frame(WINDOW_UPDATE, 0, 0, U32.pack(OUR_WINDOW - DEFAULT_WINDOW)))

    def connection_lost(self, exc) -> None:
        self.closed = True
        calls = list(self.streams.values()) + list(self.waiting)
        self.streams.clear()
        self.waiting.clear()
        for c in calls:
            c.done(None, [], [])

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        try:
            frames, used = split(buf, MAX_FRAME_LIMIT)     # we never lower the server's frame size
            del buf[:used]
            for kind, flags, stream, payload in frames:
                self._frame(kind, flags, stream, payload)
        except ProtocolError as e:          # bad padding: the connection is no longer readable
            del buf[:]
            return self._fail_all(str(e))
        self._flush()

    # -- calls ----------------------------------------------------------------------

    def call(self, block: bytes, message: bytes, done: Done) -> _Call | None:
        """Start a unary call: `block` from header_block(), `message` the serialized request
        (framed here). `done` runs on this loop when it ends. None if the connection is closed."""
        if self.closed:
            done(None, [], [])
            return None
        if self.gone_away:                  # the server takes no new streams here
            done(UNAVAILABLE, [], [])
            return None
        c = _Call(block, b"\x00" + U32.pack(len(message)) + message, done)
        if len(self.streams) < self.max_streams and not self.waiting:
            self._open(c)
        else:
            self.waiting.append(c)
        self._schedule()
        return c

    def cancel(self, c: _Call) -> None:
        """End a call we no longer wait for (RST_STREAM CANCEL); its `done` is not called."""
        if self.streams.pop(c.stream, None) is not None:
            self.stream_windows.pop(c.stream, None)
            self.out.append(frame(RST_STREAM, 0, c.stream, U32.pack(CANCEL)))
            self._schedule()
        else:
            try:
                self.waiting.remove(c)
            except ValueError:
                pass

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self._flush()
            self.transport.close()

    def _open(self, c: _Call) -> None:
        c.stream = s = self.next_stream
        self.next_stream += 2
        self.streams[s] = c
        self.stream_windows[s] = self.peer_initial
        self.out.append(frame(HEADERS, END_HEADERS, s, c.block))
        self._send_data(c)

    def _send_data(self, c: _Call) -> bool:
        """As much of the call's message as the windows allow; True once all is sent."""
        s, msg = c.stream, c.message
        while c.sent < len(msg):
            room = min(self.peer_window, self.stream_windows.get(s, 0), self.max_frame, len(msg) - c.sent)
            if room <= 0:
                return False
            last = c.sent + room == len(msg)
            self.out.append(frame(DATA, END_STREAM if last else 0, s, msg[c.sent:c.sent + room]))
            c.sent += room
            self.peer_window -= room
            self.stream_windows[s] -= room
        return True

    def _unblock(self) -> None:
        """Calls held back by the windows or the stream limit, in order, while they fit."""
        for c in list(self.streams.values()):
            if c.sent < len(c.message) and not self._send_data(c):
                return
        while self.waiting and len(self.streams) < self.max_streams and self.peer_window > 0:
            c = self.waiting.popleft()
            self._open(c)
            if c.sent < len(c.message):
                return

    def _schedule(self) -> None:
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        if self.out and self.transport is not None and not self.closed:
            self.transport.write(b"".join(self.out))
        self.out.clear()

    # -- frames from the server -------------------------------------------------

    def _frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if self.continuing is not None:
            if kind != CONTINUATION or stream != self.continuing[0]:
                return self._fail_all("a header block interrupted")
            self.continuing[2].extend(payload)
            if flags & END_HEADERS:
                s, f, block = self.continuing
                self.continuing = None
                self._headers(s, f, bytes(block))
            return
        if kind == DATA:
            self.received += len(payload)               # padding counts against the window too
            if flags & PADDED:
                payload = unpad(payload)
            if self.received > OUR_WINDOW // 2:
                self.out.append(frame(WINDOW_UPDATE, 0, 0, U32.pack(self.received)))
                self.received = 0
            c = self.streams.get(stream)
            if c is not None:
                c.data += len(payload)
                if flags & END_STREAM:      # no trailers: not a gRPC answer
                    self._end(stream, INTERNAL)
        elif kind == HEADERS:
            payload = header_fragment(flags, payload)[0]
            if flags & END_HEADERS:
                self._headers(stream, flags, payload)
            else:
                self.continuing = (stream, flags, bytearray(payload))
        elif kind == SETTINGS:
            if not flags & ACK:
                self._settings(payload)
                self.out.append(frame(SETTINGS, ACK, 0))
        elif kind == WINDOW_UPDATE:
            inc = U32.unpack(payload)[0] & 0x7FFFFFFF
            if stream == 0:
                self.peer_window = min(self.peer_window + inc, MAX_WINDOW)
            elif stream in self.stream_windows:
                self.stream_windows[stream] += inc
            self._unblock()
        elif kind == PING:
            if not flags & ACK:
                self.out.append(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            code = U32.unpack(payload)[0]
            self._end(stream, UNAVAILABLE if code == REFUSED_STREAM else CANCELLED)
        elif kind == GOAWAY:
            last = U32.unpack_from(payload)[0] & 0x7FFFFFFF
            self.gone_away = True
            for s in [s for s in self.streams if s > last]:
                self._end(s, UNAVAILABLE)
            for c in list(self.waiting):
                c.done(UNAVAILABLE, [], [])
            self.waiting.clear()

    def _settings(self, payload: bytes) -> None:
        for off in range(0, len(payload) - len(payload) % 6, 6):
            key, value = SETTING.unpack_from(payload, off)
            if key == S_INITIAL_WINDOW_SIZE:
                delta, self.peer_initial = value - self.peer_initial, value
                for s in self.stream_windows:
                    self.stream_windows[s] += delta
            elif key == S_MAX_FRAME_SIZE:
                self.max_frame = value
            elif key == S_MAX_CONCURRENT_STREAMS:
                self.max_streams = value
        self._unblock()

    def _headers(self, stream: int, flags: int, block: bytes) -> None:
        try:
            fields = self.decoder.decode(block)
        except Exception:                   # the connection's table is lost with it
            return self._fail_all("an undecodable header block")
        c = self.streams.get(stream)
        if c is None:
            return
        if c.headers is None:
            c.headers = fields
            status = next((v for k, v in fields if k == b":status"), b"")
            if status != b"200":
                code = int(status) if status.isdigit() else 0
                return self._end(stream, HTTP_TO_GRPC.get(code, UNKNOWN))
            if flags & END_STREAM:          # trailers-only
                c.trailers = fields
                return self._end(stream, _grpc_status(fields))
        else:
            c.trailers = fields
            if flags & END_STREAM:
                code = _grpc_status(fields)
                self._end(stream, INTERNAL if code == 0 and c.data < 5 else code)

    def _end(self, stream: int, status: int) -> None:
        c = self.streams.pop(stream, None)
        self.stream_windows.pop(stream, None)
        if c is None:
            return
        c.done(status, c.headers or [], c.trailers)
        if self.waiting:
            self._unblock()

    def _fail_all(self, why: str) -> None:
        self.out.append(goaway(0, PROTOCOL_ERROR, why.encode()))
        self._flush()
        if self.transport is not None:
            self.transport.close()
        self.connection_lost(None)


def _grpc_status(fields: list) -> int:
    for k, v in fields:
        if k == b"grpc-status":
            return int(v) if v.isdigit() else UNKNOWN
    return UNKNOWN
