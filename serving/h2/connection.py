"""A small server side of HTTP/2 (RFC 9113) over asyncio, for the gRPC lane (grpc_fast).

Why not grpcio: on relu gRPC, a bare grpc.aio handler used ~370 us of CPU per
call on this machine and Triton's C++ front end ~285 us; this connection and
grpc_fast on top of it, ~110 us (inference-backend/README.md "gRPC lane").

What it does: the preface and SETTINGS exchange, HEADERS + CONTINUATION
(hpack_decoder decodes; what we send is never indexed, so the peer's table size does
not matter), DATA with padding, flow control both ways (what we send waits for
the peer's windows; what a stream receives is credited back as it arrives, or,
while its handler holds unread messages, once they are read), PING (grpc-core's ping-abuse
policy: too many without data between ends the connection), RST_STREAM, GOAWAY (ours on
stop, with the last stream we took; the peer's: no new streams), the peer's
MAX_FRAME_SIZE and INITIAL_WINDOW_SIZE, and MAX_CONCURRENT_STREAMS (a stream
past it is refused, the client retries). Not here: server push, priorities
(PRIORITY is read and ignored), TLS, h2c upgrade from HTTP/1.1.

The stream handler (grpc_fast.Call) gets headers (None when the block was over
MAX_HEADER_LIST: it refuses that stream), data and end/reset events, says
whether a stream's window comes back as data arrives (credit_now) or later
(credit), and answers with send_headers / send_data / send_trailers (or send_answer, all three in
one write) / reset.
Writes of one loop turn go out as one transport.write; while the transport's
buffer is over its high-water mark (the peer is not reading), reading stops.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import struct
import time

from hpack.exceptions import HPACKError

from mcp26.serving.h2.hpack_decoder import Decoder

log = logging.getLogger("mcp26.serving.h2.connection")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# frame types
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
# flags
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
# error codes
(NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, SETTINGS_TIMEOUT, STREAM_CLOSED,
 FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, CONNECT_ERROR, ENHANCE_YOUR_CALM) = range(12)
# settings
S_HEADER_TABLE_SIZE, S_ENABLE_PUSH, S_MAX_CONCURRENT_STREAMS, S_INITIAL_WINDOW_SIZE, S_MAX_FRAME_SIZE, \
    S_MAX_HEADER_LIST_SIZE = range(1, 7)

MAX_WINDOW = (1 << 31) - 1
DEFAULT_WINDOW = 65535
DEFAULT_FRAME = 16384
MAX_STREAMS = 1024              # concurrent streams a connection may open
STREAM_WINDOW = 1 << 20         # what each stream may send before we credit it
CONNECTION_WINDOW = 16 << 20    # and the connection
OUT_HIGH = 256 << 10            # frames gathered for one transport write; past it streams and writers wait
MAX_HEADER_LIST = 16 << 10      # decoded header bytes per block (grpcio's default hard limit is 16 KiB)
MAX_HEADER_BLOCK = 64 << 10     # encoded bytes of one block with its CONTINUATIONs
# PING abuse, as grpc-core's servers judge it (ping_abuse_policy): a PING sooner than this after
# the last one, with nothing sent in between, is a strike (2 h while no stream is open:
# keepalive_permit_without_calls 0); past MAX_PING_STRIKES the connection ends with GOAWAY
# ENHANCE_YOUR_CALM "too_many_pings". Sending HEADERS or DATA clears the count, so a client's
# BDP probes (one per burst of data it receives) never add up.
MIN_RECV_PING_INTERVAL_S = 300.0
IDLE_RECV_PING_INTERVAL_S = 7200.0
MAX_PING_STRIKES = 2

_U32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return bytes((n >> 16, (n >> 8) & 255, n & 255, kind, flags)) + _U32.pack(stream) + payload


def hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """RFC 7541 5.1: `value` in a prefix of `prefix_bits`, `first` holding the byte's other bits."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal never added to the table (RFC 7541 6.2.2), no Huffman."""
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


STATUS_200 = b"\x88"            # :status 200, static table entry 8


def named_literal(index: int, value: bytes) -> bytes:
    """A field, not indexed, whose name is static-table entry `index` (RFC 7541 6.2.2)."""
    return hpack_int(index, 4) + hpack_int(len(value), 7) + value


def http_status_block(code: int) -> bytes:
    return named_literal(8, str(code).encode())     # :status, name from the static table (8)


class ConnectionError_(Exception):
    """The peer broke the protocol: GOAWAY with `code`, then close."""

    def __init__(self, code: int, why: str):
        super().__init__(why)
        self.code = code


def unpad(payload: bytes) -> bytes:
    """A PADDED frame's payload less its pad-length octet and the padding (RFC 9113 6.1)."""
    if not payload or payload[0] >= len(payload):
        raise ConnectionError_(PROTOCOL_ERROR, "padding")
    return payload[1:len(payload) - payload[0]]


def header_fragment(flags: int, payload: bytes) -> bytes:
    """A HEADERS frame's block fragment: less its padding and its PRIORITY fields (6.2)."""
    if flags & PADDED:
        payload = unpad(payload)
    return payload[5:] if flags & PRIORITY_FLAG else payload


class Stream:
    """One request stream: its send window, what waits for it, and its handler."""

    __slots__ = ("id", "handler", "send_window", "queue", "remote_closed", "local_closed", "drain")

    def __init__(self, stream_id: int, send_window: int):
        self.id = stream_id
        self.handler = None
        self.send_window = send_window
        self.queue: collections.deque = collections.deque()   # bytes to send as DATA, then the trailers block
        self.remote_closed = False
        self.local_closed = False
        self.drain: asyncio.Future | None = None     # its writer, waiting for what it sent to leave (drained())


class H2Connection(asyncio.Protocol):
    """The server side of one HTTP/2 connection. `new_handler(conn, stream, headers)`
    returns the stream's handler (data_received(bytes), end(), reset()) or None
    when it answered the stream itself."""

    def __init__(self, new_handler, on_close=None, min_ping_interval_s: float = MIN_RECV_PING_INTERVAL_S):
        self.new_handler = new_handler
        self.on_close = on_close
        self.min_ping_interval_s = min_ping_interval_s
        self.transport = None
        # The loop, once connected: asyncio.get_running_loop() is a getpid() system call a time
        # on Python 3.11, and each write and each call would ask.
        self.loop: asyncio.AbstractEventLoop | None = None
        self.peer = ""
        self.buf = b""
        self.preface_seen = False
        self.decoder = Decoder(MAX_HEADER_LIST)
        self.streams: dict[int, Stream] = {}
        self.last_stream = 0
        self.headers_pending = None         # (stream id, flags, bytearray) while CONTINUATIONs come
        self.send_window = DEFAULT_WINDOW
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = DEFAULT_FRAME
        self.blocked: dict[int, Stream] = {}    # streams waiting for the connection window or the transport
        self.received_uncredited = 0
        self.out: list[bytes] = []
        self.out_size = 0                   # bytes in `out`, not yet handed to the transport
        self.flush_scheduled = False
        self.going_away = False             # GOAWAY sent or received: no new streams
        self.closed = False
        self.failed = False                 # we sent GOAWAY for a protocol error: the rest is not read
        self.last_ping = float("-inf")      # when the last PING came (none since we last sent anything)
        self.ping_strikes = 0
        self.write_paused = False           # the transport's buffer is over its high-water mark
        self.waiting: dict[int, Stream] = {}    # streams whose writer waits in drained()

    # -- asyncio.Protocol --------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.loop = asyncio.get_running_loop()
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"ipv6:[{peer[0]}]:{peer[1]}" if ":" in peer[0] else f"ipv4:{peer[0]}:{peer[1]}"
        settings = (_SETTING.pack(S_MAX_CONCURRENT_STREAMS, MAX_STREAMS)
                    + _SETTING.pack(S_INITIAL_WINDOW_SIZE, STREAM_WINDOW)
                    + _SETTING.pack(S_MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST))
        transport.write(frame(SETTINGS, 0, 0, settings)
                        + frame(WINDOW_UPDATE, 0, 0, _U32.pack(CONNECTION_WINDOW - DEFAULT_WINDOW)))

    def pause_writing(self) -> None:
        """The peer is not reading what we send: stop reading what it sends (PINGs, new
        calls), so that what we owe it cannot grow without bound; writers wait (drained())."""
        self.write_paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()
        self._unblock()
        self._wake_all()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self._wake_all()
        for st in list(self.streams.values()):
            if st.handler is not None:
                st.handler.reset()
        self.streams.clear()
        self.blocked.clear()
        if self.on_close:
            self.on_close(self)

    def data_received(self, data: bytes) -> None:
        if self.failed:
            return
        buf = self.buf + data if self.buf else data
        if not self.preface_seen:
            if len(buf) < len(PREFACE):
                if not PREFACE.startswith(buf):
                    return self._fail(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                self.buf = buf
                return
            if not buf.startswith(PREFACE):
                return self._fail(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            buf = buf[len(PREFACE):]
            self.preface_seen = True
        i, n = 0, len(buf)
        try:
            while n - i >= 9:
                length = (buf[i] << 16) | (buf[i + 1] << 8) | buf[i + 2]
                if length > DEFAULT_FRAME:      # we never raise our SETTINGS_MAX_FRAME_SIZE
                    raise ConnectionError_(FRAME_SIZE_ERROR, f"frame of {length} bytes")
                if n - i < 9 + length:
                    break
                kind, flags = buf[i + 3], buf[i + 4]
                sid = _U32.unpack_from(buf, i + 5)[0] & 0x7FFFFFFF
                payload = buf[i + 9:i + 9 + length]
                i += 9 + length
                if self.headers_pending is not None and kind != CONTINUATION:
                    raise ConnectionError_(PROTOCOL_ERROR, "a header block interrupted")
                if kind == DATA:
                    self._on_data(sid, flags, payload, length)
                elif kind == HEADERS:
                    self._on_headers(sid, flags, payload)
                elif kind == CONTINUATION:
                    self._on_continuation(sid, flags, payload)
                elif kind == SETTINGS:
                    self._on_settings(sid, flags, payload)
                elif kind == WINDOW_UPDATE:
                    self._on_window_update(sid, payload)
                elif kind == PING:
                    if sid or length != 8:
                        raise ConnectionError_(PROTOCOL_ERROR if sid else FRAME_SIZE_ERROR, "bad PING")
                    if not flags & ACK:
                        self._on_ping()
                        self._write(frame(PING, ACK, 0, payload))
                elif kind == RST_STREAM:
                    if not sid or length != 4:
                        raise ConnectionError_(PROTOCOL_ERROR, "bad RST_STREAM")
                    st = self.streams.pop(sid, None)
                    self.blocked.pop(sid, None)
                    if st is not None:
                        st.local_closed = True     # nothing more goes out on it
                        self._wake(st)
                    if st is not None and st.handler is not None:
                        st.handler.reset()
                elif kind == GOAWAY:
                    self.going_away = True
                    if not self.streams:
                        self.transport.close()
                elif kind == PRIORITY:
                    if length != 5:
                        raise ConnectionError_(FRAME_SIZE_ERROR, "bad PRIORITY")
                elif kind == PUSH_PROMISE:
                    raise ConnectionError_(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
                # unknown frame types are ignored (RFC 9113 4.1)
        except ConnectionError_ as e:
            return self._fail(e.code, str(e))
        self.buf = buf[i:]
        if self.received_uncredited >= CONNECTION_WINDOW // 2:
            self._write(frame(WINDOW_UPDATE, 0, 0, _U32.pack(self.received_uncredited)))
            self.received_uncredited = 0

    # -- frames in ---------------------------------------------------------

    def _on_data(self, sid: int, flags: int, payload: bytes, length: int) -> None:
        if not sid:
            raise ConnectionError_(PROTOCOL_ERROR, "DATA on stream 0")
        self.received_uncredited += length
        if flags & PADDED:
            payload = unpad(payload)
        st = self.streams.get(sid)
        if st is None or st.remote_closed:
            if sid > self.last_stream:
                raise ConnectionError_(PROTOCOL_ERROR, "DATA on an idle stream")
            return      # a stream we reset or finished: its late data is dropped (and credited)
        # the stream's window comes back as it arrives, unless its handler keeps it until its
        # reader has caught up (then it calls credit())
        if length and not flags & END_STREAM and st.handler.credit_now(length):
            self._write(frame(WINDOW_UPDATE, 0, sid, _U32.pack(length)))
        if payload:
            st.handler.data_received(payload)
        if flags & END_STREAM:
            st.remote_closed = True
            if sid in self.streams:
                st.handler.end()

    def _on_headers(self, sid: int, flags: int, payload: bytes) -> None:
        if not sid or not sid & 1:
            raise ConnectionError_(PROTOCOL_ERROR, f"HEADERS on stream {sid}")
        payload = header_fragment(flags, payload)
        if flags & END_HEADERS:
            self._on_header_block(sid, flags, payload)
        else:
            self.headers_pending = (sid, flags, bytearray(payload))

    def _on_continuation(self, sid: int, flags: int, payload: bytes) -> None:
        if self.headers_pending is None or self.headers_pending[0] != sid:
            raise ConnectionError_(PROTOCOL_ERROR, "CONTINUATION out of place")
        block = self.headers_pending[2]
        block += payload
        if len(block) > MAX_HEADER_BLOCK:
            raise ConnectionError_(ENHANCE_YOUR_CALM, "header block too large")
        if flags & END_HEADERS:
            first_flags = self.headers_pending[1]
            self.headers_pending = None
            self._on_header_block(sid, first_flags, bytes(block))

    def _on_header_block(self, sid: int, flags: int, block: bytes) -> None:
        try:    # decoded even for a stream we refuse: the table is the connection's
            headers = self.decoder.decode(block)
        except HPACKError as e:
            raise ConnectionError_(COMPRESSION_ERROR, f"header block: {e}") from None
        if self.decoder.oversized:      # the block was read whole (the table is in step); refused below
            headers = None
        st = self.streams.get(sid)
        if st is not None:      # trailers from the client: only the end of its stream matters
            if not flags & END_STREAM:
                raise ConnectionError_(PROTOCOL_ERROR, "second HEADERS without END_STREAM")
            st.remote_closed = True
            st.handler.end()
            return
        if sid <= self.last_stream:     # a stream we already finished (or reset): its late trailers
            return
        self.last_stream = sid
        if self.going_away or len(self.streams) >= MAX_STREAMS:
            self._write(frame(RST_STREAM, 0, sid, _U32.pack(REFUSED_STREAM)))
            return
        st = Stream(sid, self.peer_initial_window)
        self.streams[sid] = st
        st.handler = self.new_handler(self, st, headers)
        if st.handler is None:
            return
        if flags & END_STREAM and sid in self.streams:
            st.remote_closed = True
            st.handler.end()

    def _on_settings(self, sid: int, flags: int, payload: bytes) -> None:
        if sid:
            raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            return
        if len(payload) % 6:
            raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS length")
        for off in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, off)
            if key == S_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionError_(FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for st in self.streams.values():
                    st.send_window += delta
            elif key == S_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= (1 << 24) - 1:
                    raise ConnectionError_(PROTOCOL_ERROR, "MAX_FRAME_SIZE")
                self.peer_max_frame = value
            elif key == S_ENABLE_PUSH and value > 1:
                raise ConnectionError_(PROTOCOL_ERROR, "ENABLE_PUSH")
        self._write(frame(SETTINGS, ACK, 0))
        for st in list(self.streams.values()):
            if st.queue:
                self._pump(st)

    def _on_window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "WINDOW_UPDATE length")
        inc = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if not inc:
            raise ConnectionError_(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
        if not sid:
            self.send_window += inc
            if self.send_window > MAX_WINDOW:
                raise ConnectionError_(FLOW_CONTROL_ERROR, "connection window overflow")
            blocked, self.blocked = self.blocked, {}
            for st in blocked.values():
                self._pump(st)
            return
        st = self.streams.get(sid)
        if st is not None:
            st.send_window += inc
            if st.send_window > MAX_WINDOW:
                self.reset(st, FLOW_CONTROL_ERROR)
            elif st.queue:
                self._pump(st)

    # -- frames out (the stream handler's calls) ------------------------------

    def credit(self, st: Stream, n: int) -> None:
        """Give `n` bytes of the stream's window back (what its handler held, now read)."""
        if n > 0 and not st.remote_closed and not self.closed:
            self._write(frame(WINDOW_UPDATE, 0, st.id, _U32.pack(n)))

    def _on_ping(self) -> None:
        now = time.monotonic()
        interval = self.min_ping_interval_s if self.streams else IDLE_RECV_PING_INTERVAL_S
        too_soon = now < self.last_ping + interval
        self.last_ping = now
        if too_soon:
            self.ping_strikes += 1
            if self.ping_strikes > MAX_PING_STRIKES:
                raise ConnectionError_(ENHANCE_YOUR_CALM, "too_many_pings")

    def _sent(self) -> None:
        """HEADERS or DATA is being sent (DATA perhaps queued behind a window): the PINGs before
        it were not abuse."""
        self.last_ping, self.ping_strikes = float("-inf"), 0

    def send_headers(self, st: Stream, block: bytes, end_stream: bool = False) -> None:
        """A header block (under the peer's frame size: ours are small)."""
        if st.local_closed or self.closed:
            return
        self._sent()
        self._write(frame(HEADERS, END_HEADERS | (END_STREAM if end_stream else 0), st.id, block))
        if end_stream:
            self._finish(st)

    def send_answer(self, st: Stream, headers: bytes, data: bytes, trailers: bytes) -> None:
        """send_headers, send_data and send_trailers of a whole answer (a unary gRPC call's):
        one write of three frames when the data fits the windows and one frame, as it mostly does."""
        if st.local_closed or self.closed:
            return
        n = len(data)
        if st.queue or n > st.send_window or n > self.send_window or n > self.peer_max_frame:
            self.send_headers(st, headers)
            self.send_data(st, data)
            return self.send_trailers(st, trailers)
        self._sent()
        st.send_window -= n
        self.send_window -= n
        self._write(frame(HEADERS, END_HEADERS, st.id, headers) + frame(DATA, 0, st.id, data)
                    + frame(HEADERS, END_HEADERS | END_STREAM, st.id, trailers))
        self._finish(st)

    def send_data(self, st: Stream, data: bytes) -> None:
        if st.local_closed or self.closed:
            return
        self._sent()
        if not st.queue and len(data) <= min(st.send_window, self.send_window, self.peer_max_frame):
            st.send_window -= len(data)         # the common case: one frame, windows open
            self.send_window -= len(data)
            self._write(frame(DATA, 0, st.id, data))
            return
        st.queue.append(memoryview(data))
        self._pump(st)

    def send_trailers(self, st: Stream, block: bytes) -> None:
        """The stream's last header block, after whatever data still waits for a window."""
        if st.local_closed or self.closed:
            return
        if not st.queue:
            return self.send_headers(st, block, end_stream=True)
        st.queue.append(block)      # bytes: the trailers; memoryview: data
        self._pump(st)

    def reset(self, st: Stream, code: int = CANCEL) -> None:
        """Ends the stream with RST_STREAM; its handler is told, as when the peer resets it."""
        if not st.local_closed and not self.closed:
            self._write(frame(RST_STREAM, 0, st.id, _U32.pack(code)))
        st.local_closed = st.remote_closed = True
        st.queue.clear()
        self._drop(st)
        if st.handler is not None:
            st.handler.reset()

    def _pump(self, st: Stream) -> None:
        while st.queue:
            head = st.queue[0]
            if isinstance(head, bytes):         # the trailers, all data before them sent
                st.queue.popleft()
                self.send_headers(st, head, end_stream=True)
                return
            if self.write_paused or self.out_size >= OUT_HIGH:
                # The rest waits here, a view of the caller's bytes, not frames copied out of
                # it: a 5 MB message to many streams costs its one buffer until it is sent.
                self.blocked[st.id] = st
                return
            room = min(st.send_window, self.send_window, self.peer_max_frame)
            if room <= 0 and len(head):
                if self.send_window <= 0:
                    self.blocked[st.id] = st
                return
            part = head[:room]
            st.send_window -= len(part)
            self.send_window -= len(part)
            self._sent()                        # DATA going out from here (a window opened) clears strikes too
            n = len(part)                       # the frame header, then the view itself (joined once in _flush)
            self._write(bytes((n >> 16, (n >> 8) & 255, n & 255, DATA, 0)) + _U32.pack(st.id))
            self._write(part)
            if len(part) == len(head):
                st.queue.popleft()
            else:
                st.queue[0] = head[room:]
        if st.drain is not None:
            self._wake(st)

    def _finish(self, st: Stream) -> None:
        st.local_closed = True
        if not st.remote_closed:        # the answer is complete before the request: stop its upload
            self._write(frame(RST_STREAM, 0, st.id, _U32.pack(NO_ERROR)))
            st.remote_closed = True
        self._drop(st)

    def _drop(self, st: Stream) -> None:
        self.streams.pop(st.id, None)
        self.blocked.pop(st.id, None)
        if st.drain is not None:
            self._wake(st)
        if self.going_away and not self.streams and self.transport is not None:
            self._flush()
            self.transport.close()

    def _write(self, data) -> None:
        self.out.append(data)
        self.out_size += len(data)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            (self.loop or asyncio.get_running_loop()).call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        if self.out and not self.closed and self.transport is not None:
            self.transport.write(b"".join(self.out))     # may call pause_writing
        self.out.clear()
        self.out_size = 0
        self._unblock()
        if self.waiting:
            self._wake_all()

    def _unblock(self) -> None:
        """Streams held back for the transport go on while it takes more."""
        if self.blocked and not self.write_paused and not self.closed:
            blocked, self.blocked = self.blocked, {}
            for st in blocked.values():
                self._pump(st)

    # -- a writer's backpressure ---------------------------------------------------

    def drained(self, st: Stream) -> asyncio.Future | None:
        """None when what `st` sent has left for the transport and the transport takes more;
        else a future that resolves once it has (or the stream or connection is over).

        Without it a streaming writer never waits: a 5 MB message to a peer that reads
        slowly (or a push to a thousand) piles up here, unbounded.
        """
        if self._is_drained(st):
            return None
        st.drain = asyncio.get_running_loop().create_future()
        self.waiting[st.id] = st
        return st.drain

    def _is_drained(self, st: Stream) -> bool:
        # Small writes of one loop turn still go out in one transport write; past OUT_HIGH the
        # writer waits for that write (and for the transport, if it then pauses).
        return st.local_closed or self.closed or not (st.queue or self.write_paused or self.out_size > OUT_HIGH)

    def _wake(self, st: Stream) -> None:
        if self._is_drained(st):
            fut, st.drain = st.drain, None
            self.waiting.pop(st.id, None)
            if fut is not None and not fut.done():
                fut.set_result(None)

    def _wake_all(self) -> None:
        for st in list(self.waiting.values()):
            self._wake(st)

    def go_away(self) -> None:
        """No new streams; close once those open have finished."""
        if self.closed or self.going_away:
            return
        self.going_away = True
        self._write(frame(GOAWAY, 0, 0, _U32.pack(self.last_stream) + _U32.pack(NO_ERROR)))
        if not self.streams:
            self._flush()
            self.transport.close()

    def _fail(self, code: int, why: str) -> None:
        log.debug("gRPC lane: closing %s: %s", self.peer, why)
        if self.transport is not None and not self.closed:
            self.out.append(frame(GOAWAY, 0, 0, _U32.pack(self.last_stream) + _U32.pack(code) + why.encode()[:256]))
            self._flush()
            self.transport.close()
        self.buf = b""
        self.going_away = self.failed = True
