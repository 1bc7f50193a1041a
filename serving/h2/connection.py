"""The server side of one HTTP/2 connection (RFC 9113), sans-IO: bytes in, events out,
bytes to send pulled by the caller, the clock passed in.

In python-hyper/h2's shape (receive_data → events, data_to_send), not that package: for
a unary gRPC call h2's connection costs ~20x this one's CPU (benchmarks/bench_h2_core.py:
~190 µs against ~9 µs here; its state machine is a table of Python transitions per frame,
and every header goes through its validators and HeaderTuple objects), when the gRPC lane's
whole call is ~110 µs (inference-backend/README.md "gRPC lane"). protocol.py runs it on
asyncio.

What it keeps:
- each stream's state as RFC 9113 §5.1 has it: idle (above the last stream opened),
  open, half-closed (remote) once the client's END_STREAM came, closed; and of a closed
  stream, for a while (Limits.closed_streams_remembered), how it closed, so that a late
  frame is answered as §5.1 says: DATA or HEADERS after the client's END_STREAM is
  STREAM_CLOSED for the connection, any frame but PRIORITY after the client's RST_STREAM
  is STREAM_CLOSED for the stream, and what was in flight when we reset a stream is dropped;
- windows both ways: what we send waits for the client's (§6.9), queued per stream as views
  of the caller's bytes; what the client sends is counted against ours, and past them is
  FLOW_CONTROL_ERROR for the connection (a client that ignores windows is not one to keep).
  The connection's window comes back by itself once half is used; a stream's, when the
  caller says so (credit), so that a handler that does not read holds back its client;
- requests checked as §8.1–8.3 say (fields.py), the HPACK table (hpack_decoder.py), and the
  limits of limits.py, each counted in limits.hits where it is hit.

Not here: server push, priorities (PRIORITY is checked and ignored), TLS, h2c upgrade
from HTTP/1.1, the client side (mcp-bench's, inference-backend/bench/h2_grpc.py, shares
frames.py and the HPACK modules).
"""
from __future__ import annotations

import collections

from hpack.exceptions import HPACKError

from mcp26.serving.h2 import limits as _limits
from mcp26.serving.h2.events import (ConnectionTerminated, DataReceived, GoAwayReceived, RequestReceived,
                                     StreamReset, TrailersReceived)
from mcp26.serving.h2.fields import Malformed, check_request, check_trailers
from mcp26.serving.h2.frames import (ACK, CONTINUATION, DATA, DEFAULT_FRAME, DEFAULT_WINDOW, END_HEADERS,
                                     END_STREAM, ENHANCE_YOUR_CALM, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, GOAWAY,
                                     HEADERS, MAX_FRAME_LIMIT, MAX_WINDOW, NO_ERROR, PADDED, PING, PREFACE,
                                     PRIORITY, PROTOCOL_ERROR, PUSH_PROMISE, REFUSED_STREAM, RST_STREAM,
                                     S_ENABLE_PUSH, S_INITIAL_WINDOW_SIZE, S_MAX_CONCURRENT_STREAMS,
                                     S_MAX_FRAME_SIZE, S_MAX_HEADER_LIST_SIZE, SETTING, SETTINGS, STREAM_CLOSED,
                                     U32, WINDOW_UPDATE, COMPRESSION_ERROR, ProtocolError, frame, frame_header,
                                     goaway, header_fragment, settings, split, unpad)
from mcp26.serving.h2.hpack_decoder import BlockTooLarge, Decoder

hits = _limits.hits
OUT_HIGH = 256 << 10            # bytes gathered for one write before queued DATA waits for the next
_KIND_NAMES = ("DATA", "HEADERS", "PRIORITY", "RST_STREAM", "SETTINGS", "PUSH_PROMISE", "PING", "GOAWAY",
               "WINDOW_UPDATE", "CONTINUATION")
# how a closed stream closed (H2Connection.closed)
END_RECEIVED, RESET_BY_PEER, RESET_BY_US = 1, 2, 3
END_DATA = b""                  # in a stream's queue: an empty DATA frame with END_STREAM


class Stream:
    """One request stream: its windows, what waits for its window, and the caller's `user`."""

    __slots__ = ("id", "user", "remote_closed", "local_closed", "send_window", "recv_window", "queue", "queued",
                 "content_length", "received", "refused")

    def __init__(self, stream_id: int, send_window: int, recv_window: int):
        self.id = stream_id
        self.user = None
        self.remote_closed = False          # the client's END_STREAM came
        self.local_closed = False           # ours went (or a RST_STREAM either way)
        self.send_window = send_window
        self.recv_window = recv_window
        # views of data to send, then the trailers block (bytes), or END_DATA
        self.queue: collections.deque = collections.deque()
        self.queued = 0                     # bytes of data in `queue`
        self.content_length = None          # the request's, when it gave one
        self.received = 0                   # body bytes so far (checked against content_length)
        self.refused = False                # answered by the connection's caller without a handler


class _Block:
    """A header block while its CONTINUATIONs come."""
    __slots__ = ("stream", "flags", "data", "frames", "started", "self_dependent")

    def __init__(self, stream: int, flags: int, data: bytes, started: float, self_dependent: bool):
        self.stream, self.flags, self.data = stream, flags, bytearray(data)
        self.frames, self.started, self.self_dependent = 0, started, self_dependent


class H2Connection:
    """The server side of one HTTP/2 connection; see the module's docstring.

    receive(bytes, now) -> events; the caller answers with send_headers / send_data /
    send_trailers / send_answer / refuse / reset_stream, gives windows back with credit,
    and writes what data_to_send() returns."""

    def __init__(self, limits: _limits.Limits = _limits.DEFAULT):
        self.limits = limits
        self.decoder = Decoder(limits.max_header_list, max_fields=limits.max_header_fields,
                               max_decoded=limits.max_header_decoded)
        self.buf = b""
        self.preface_seen = False
        self.settings_seen = False          # the client's first SETTINGS (the preface's end)
        self.streams: dict[int, Stream] = {}
        self.closed: dict[int, int] = {}    # recently closed stream -> END_RECEIVED / RESET_BY_PEER / RESET_BY_US
        self.last_stream = 0
        self.block: _Block | None = None
        self.send_window = DEFAULT_WINDOW
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = DEFAULT_FRAME
        self.recv_window = limits.connection_window
        self.recv_consumed = 0              # counted against recv_window, not yet given back
        self.out: list = []
        self.out_size = 0
        self.ready: dict[int, Stream] = {}  # streams with queued data and a stream window open
        self.stalled: dict[int, Stream] = {}    # and with none: they wait for the client's WINDOW_UPDATE
        self.queued_bytes = 0               # data in the streams' queues
        self.going_away = False             # GOAWAY sent or received: no new streams
        self.terminated = False             # a connection error: GOAWAY queued, nothing more is read
        self.now = 0.0
        self.events: list = []
        self.last_ping = float("-inf")
        self.ping_strikes = 0
        self.control_since = float("-inf")  # the start of the current second of control frames
        self.control_count = 0
        self.window_update_allowance = 0   # WINDOW_UPDATEs the DATA we sent makes normal
        self.reset_tokens = float(limits.reset_burst)
        self.reset_at: float | None = None
        self._checked = None                # the last request block found well-formed, and its content-length
        self._checked_length = None

    # -- start -------------------------------------------------------------------

    def initiate(self) -> None:
        """Our SETTINGS and the connection window beyond the default: the first bytes to send."""
        lim = self.limits
        self._write(frame(SETTINGS, 0, 0, settings((S_MAX_CONCURRENT_STREAMS, lim.max_concurrent_streams),
                                                   (S_INITIAL_WINDOW_SIZE, lim.stream_window),
                                                   (S_MAX_HEADER_LIST_SIZE, lim.max_header_list)))
                    + frame(WINDOW_UPDATE, 0, 0, U32.pack(lim.connection_window - DEFAULT_WINDOW)))

    # -- bytes in ----------------------------------------------------------------

    def receive(self, data: bytes, now: float) -> list:
        """The events the bytes make (and the frames to send for them, in data_to_send)."""
        self.events = events = []
        if self.terminated:
            return events
        self.now = now
        buf = self.buf + data if self.buf else data
        try:
            if not self.preface_seen:
                if len(buf) < len(PREFACE):
                    if not PREFACE.startswith(buf):
                        raise ProtocolError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                    self.buf = buf
                    return events
                if not buf.startswith(PREFACE):
                    raise ProtocolError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                buf = buf[len(PREFACE):]
                self.preface_seen = True
            frames, used = split(buf, DEFAULT_FRAME)        # we never raise our SETTINGS_MAX_FRAME_SIZE
            self.buf = buf[used:] if used < len(buf) else b""
            for kind, flags, sid, payload in frames:
                if not self.settings_seen:
                    if kind != SETTINGS or flags & ACK:
                        raise ProtocolError(PROTOCOL_ERROR, "the preface's SETTINGS frame did not come first")
                    self.settings_seen = True
                if self.block is not None and kind != CONTINUATION:
                    raise ProtocolError(PROTOCOL_ERROR, f"{_name(kind)} inside a header block")
                if kind == DATA:
                    self._on_data(flags, sid, payload)
                elif kind == HEADERS:
                    self._on_headers(flags, sid, payload)
                elif kind == WINDOW_UPDATE:
                    self._on_window_update(sid, payload)
                elif kind == CONTINUATION:
                    self._on_continuation(flags, sid, payload)
                elif kind == RST_STREAM:
                    self._on_rst_stream(sid, payload)
                elif kind == SETTINGS:
                    self._on_settings(flags, sid, payload)
                elif kind == PING:
                    self._on_ping(flags, sid, payload)
                elif kind == PRIORITY:
                    self._on_priority(sid, payload)
                elif kind == GOAWAY:
                    self._on_goaway(sid, payload)
                elif kind == PUSH_PROMISE:
                    raise ProtocolError(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
                else:                               # unknown types are ignored (§4.1), and counted
                    self._control()
            if self.block is not None and now - self.block.started > self.limits.header_block_timeout_s:
                hits["header_block_timeout"] += 1
                raise ProtocolError(ENHANCE_YOUR_CALM, "a header block left unfinished")
        except ProtocolError as e:
            self._fail(e.code, str(e))
        if self.recv_consumed >= self.limits.connection_window >> 1 and not self.terminated:
            self._write(frame(WINDOW_UPDATE, 0, 0, U32.pack(self.recv_consumed)))
            self.recv_window += self.recv_consumed
            self.recv_consumed = 0
        return events

    def tick(self, now: float) -> list:
        """Time limits (an unfinished header block) at `now`; events as receive() gives them."""
        self.events = events = []
        block = self.block
        if block is not None and not self.terminated and now - block.started > self.limits.header_block_timeout_s:
            hits["header_block_timeout"] += 1
            self._fail(ENHANCE_YOUR_CALM, "a header block left unfinished")
        return events

    def next_deadline(self) -> float | None:
        """When tick() has something to do (None: nothing waits)."""
        return None if self.block is None or self.terminated else self.block.started + self.limits.header_block_timeout_s

    def _on_data(self, flags: int, sid: int, payload: bytes) -> None:
        if not sid:
            raise ProtocolError(PROTOCOL_ERROR, "DATA on stream 0")
        length = len(payload)
        self.recv_window -= length
        if self.recv_window < 0:
            hits["flow_control"] += 1
            raise ProtocolError(FLOW_CONTROL_ERROR, "DATA past the connection's window")
        self.recv_consumed += length
        if flags & PADDED:
            payload = unpad(payload)
        st = self.streams.get(sid)
        if st is None:
            return self._late(sid, DATA)
        if st.remote_closed:
            return self._stream_error(st, STREAM_CLOSED, "DATA after the stream's END_STREAM")
        st.recv_window -= length
        if st.recv_window < 0:      # a client that ignores windows: the connection, not just the stream (§6.9.1)
            hits["flow_control"] += 1
            raise ProtocolError(FLOW_CONTROL_ERROR, f"DATA past stream {sid}'s window")
        end = flags & END_STREAM
        if not payload and not end:
            self._control()                         # an empty DATA frame moves nothing
        if st.content_length is not None:
            st.received += len(payload)
            if st.received > st.content_length or (end and st.received != st.content_length):
                hits["malformed"] += 1
                return self._stream_error(st, PROTOCOL_ERROR, "body length not the content-length")
        if end:
            st.remote_closed = True
        self.events.append(DataReceived(st, payload, length, bool(end)))

    def _on_headers(self, flags: int, sid: int, payload: bytes) -> None:
        if not sid:
            raise ProtocolError(PROTOCOL_ERROR, "HEADERS on stream 0")
        fragment, depends_on = header_fragment(flags, payload)
        if flags & END_HEADERS:
            self._on_block(sid, flags, fragment, depends_on == sid)
            return
        if len(fragment) > self.limits.max_header_block:
            hits["header_block_size"] += 1
            raise ProtocolError(ENHANCE_YOUR_CALM, "header block too large")
        self.block = _Block(sid, flags, fragment, self.now, depends_on == sid)

    def _on_continuation(self, flags: int, sid: int, payload: bytes) -> None:
        block = self.block
        if block is None or block.stream != sid:
            raise ProtocolError(PROTOCOL_ERROR, "CONTINUATION without the HEADERS it continues")
        block.frames += 1
        if block.frames > self.limits.max_continuations:
            hits["continuations"] += 1
            raise ProtocolError(ENHANCE_YOUR_CALM, f"over {self.limits.max_continuations} CONTINUATION frames")
        block.data += payload
        if len(block.data) > self.limits.max_header_block:
            hits["header_block_size"] += 1
            raise ProtocolError(ENHANCE_YOUR_CALM, "header block too large")
        if flags & END_HEADERS:
            self.block = None
            self._on_block(sid, block.flags, bytes(block.data), block.self_dependent)

    def _on_block(self, sid: int, flags: int, block: bytes, self_dependent: bool) -> None:
        try:    # decoded whatever becomes of the stream: the table is the connection's
            headers = self.decoder.decode(block)
        except BlockTooLarge as e:
            hits[e.what] += 1
            raise ProtocolError(ENHANCE_YOUR_CALM, str(e)) from None
        except HPACKError as e:
            raise ProtocolError(COMPRESSION_ERROR, f"header block: {e}") from None
        oversized = self.decoder.oversized
        end = flags & END_STREAM
        st = self.streams.get(sid)
        if st is not None:                          # a second block on the stream: its trailers
            if st.remote_closed:
                return self._stream_error(st, STREAM_CLOSED, "HEADERS after the stream's END_STREAM")
            try:
                if not end:
                    raise Malformed("a second HEADERS without END_STREAM")
                if self_dependent:
                    raise Malformed("a stream depending on itself")
                if not oversized:
                    check_trailers(headers)
                if st.content_length is not None and st.received != st.content_length:
                    raise Malformed("body length not the content-length")
            except Malformed as e:
                hits["malformed"] += 1
                return self._stream_error(st, PROTOCOL_ERROR, str(e))
            st.remote_closed = True
            self.events.append(TrailersReceived(st, headers))
            return
        if sid <= self.last_stream or not sid & 1:
            if not sid & 1:
                raise ProtocolError(PROTOCOL_ERROR, f"HEADERS on stream {sid}: clients open odd streams")
            return self._late(sid, HEADERS)
        self.last_stream = sid
        lim = self.limits
        if self.going_away or len(self.streams) >= lim.max_concurrent_streams or self.queued_bytes > lim.max_queued_bytes:
            if self.queued_bytes > lim.max_queued_bytes:
                hits["queued_bytes"] += 1
            return self._refuse_stream(sid, REFUSED_STREAM)
        if oversized:
            hits["header_list"] += 1
            length = None
        else:
            try:
                if self_dependent:
                    raise Malformed("a stream depending on itself")
                if headers is self._checked:
                    length = self._checked_length
                else:
                    length = check_request(headers)
                    self._checked, self._checked_length = headers, length
            except Malformed as e:
                hits["malformed"] += 1
                return self._refuse_stream(sid, PROTOCOL_ERROR, str(e))
        st = Stream(sid, self.peer_initial_window, lim.stream_window)
        if length is not None:
            st.content_length = length
            if end and length:
                hits["malformed"] += 1
                return self._refuse_stream(sid, PROTOCOL_ERROR, "content-length without a body")
        if end:
            st.remote_closed = True
        self.streams[sid] = st
        self.events.append(RequestReceived(st, None if oversized else headers, bool(end)))

    def _on_rst_stream(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolError(FRAME_SIZE_ERROR, "RST_STREAM not 4 bytes")
        if not sid:
            raise ProtocolError(PROTOCOL_ERROR, "RST_STREAM on stream 0")
        st = self.streams.get(sid)
        if st is None:
            return self._late(sid, RST_STREAM)
        self._charge_reset()
        self._close(st, RESET_BY_PEER)
        self.events.append(StreamReset(st, U32.unpack(payload)[0], True))

    def _on_window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolError(FRAME_SIZE_ERROR, "WINDOW_UPDATE not 4 bytes")
        if self.window_update_allowance > 0:        # one for each DATA frame we sent: the usual answer to it
            self.window_update_allowance -= 1
        else:
            self._control()
        inc = U32.unpack(payload)[0] & 0x7FFFFFFF
        if not sid:
            if not inc:
                raise ProtocolError(PROTOCOL_ERROR, "WINDOW_UPDATE of 0 for the connection")
            self.send_window += inc
            if self.send_window > MAX_WINDOW:
                raise ProtocolError(FLOW_CONTROL_ERROR, "connection window over 2^31-1")
            return
        st = self.streams.get(sid)
        if st is None:
            return self._late(sid, WINDOW_UPDATE)
        if not inc:
            return self._stream_error(st, PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
        st.send_window += inc
        if st.send_window > MAX_WINDOW:
            return self._stream_error(st, FLOW_CONTROL_ERROR, "stream window over 2^31-1")
        if st.send_window > 0 and self.stalled.pop(sid, None) is not None:
            self.ready[sid] = st

    def _on_settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid:
            raise ProtocolError(PROTOCOL_ERROR, "SETTINGS on a stream")
        self._control()
        if flags & ACK:
            if payload:
                raise ProtocolError(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise ProtocolError(FRAME_SIZE_ERROR, "SETTINGS length not a multiple of 6")
        if len(payload) > 6 * self.limits.max_settings_entries:
            hits["settings_entries"] += 1
            raise ProtocolError(ENHANCE_YOUR_CALM, f"over {self.limits.max_settings_entries} SETTINGS entries")
        initial = None
        for off in range(0, len(payload), 6):
            key, value = SETTING.unpack_from(payload, off)
            if key == S_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolError(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1")
                initial = value
            elif key == S_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= MAX_FRAME_LIMIT:
                    raise ProtocolError(PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                self.peer_max_frame = value
            elif key == S_ENABLE_PUSH and value > 1:
                raise ProtocolError(PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH not 0 or 1")
        if initial is not None and initial != self.peer_initial_window:
            # once per frame, whatever it holds (§6.9.2): the last value is the one that counts
            delta = initial - self.peer_initial_window
            self.peer_initial_window = initial
            for st in self.streams.values():
                st.send_window += delta
                if st.send_window > MAX_WINDOW:
                    raise ProtocolError(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE takes a window over 2^31-1")
            if delta > 0:
                for s, st in list(self.stalled.items()):
                    if st.send_window > 0:
                        del self.stalled[s]
                        self.ready[s] = st
            else:
                for s, st in list(self.ready.items()):
                    if st.send_window <= 0:
                        del self.ready[s]
                        self.stalled[s] = st
        self._write(frame(SETTINGS, ACK, 0))

    def _on_ping(self, flags: int, sid: int, payload: bytes) -> None:
        if sid:
            raise ProtocolError(PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise ProtocolError(FRAME_SIZE_ERROR, "PING not 8 bytes")
        self._control()
        if flags & ACK:
            return
        now = self.now
        interval = self.limits.min_ping_interval_s if self.streams else self.limits.idle_ping_interval_s
        if now < self.last_ping + interval:
            self.ping_strikes += 1
            if self.ping_strikes > self.limits.max_ping_strikes:
                hits["pings"] += 1
                raise ProtocolError(ENHANCE_YOUR_CALM, "too_many_pings")
        self.last_ping = now
        self._write(frame(PING, ACK, 0, payload))

    def _on_priority(self, sid: int, payload: bytes) -> None:
        if not sid:
            raise ProtocolError(PROTOCOL_ERROR, "PRIORITY on stream 0")
        self._control()
        if len(payload) != 5:
            return self._stream_error(self.streams.get(sid) or sid, FRAME_SIZE_ERROR, "PRIORITY not 5 bytes")
        if U32.unpack_from(payload)[0] & 0x7FFFFFFF == sid:
            return self._stream_error(self.streams.get(sid) or sid, PROTOCOL_ERROR, "a stream depending on itself")

    def _on_goaway(self, sid: int, payload: bytes) -> None:
        if sid:
            raise ProtocolError(PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise ProtocolError(FRAME_SIZE_ERROR, "GOAWAY under 8 bytes")
        self._control()
        self.going_away = True
        self.events.append(GoAwayReceived(U32.unpack_from(payload, 4)[0], U32.unpack_from(payload)[0] & 0x7FFFFFFF))

    # -- closed and idle streams (§5.1) ----------------------------------------------

    def _late(self, sid: int, kind: int) -> None:
        """A frame for a stream that is not open."""
        if sid > self.last_stream or not sid & 1:       # idle (we push nothing: even ones stay idle)
            raise ProtocolError(PROTOCOL_ERROR, f"{_name(kind)} on idle stream {sid}")
        how = self.closed.get(sid)
        if how == END_RECEIVED:
            if kind == DATA or kind == HEADERS:
                raise ProtocolError(STREAM_CLOSED, f"{_name(kind)} on stream {sid} after its END_STREAM")
        elif how == RESET_BY_PEER:
            if kind != RST_STREAM:                      # never a reset for a reset (§5.4.2)
                self._stream_error(sid, STREAM_CLOSED, f"{_name(kind)} on stream {sid} after its RST_STREAM")
        elif how is None and kind == HEADERS:           # never opened: the client went back
            raise ProtocolError(PROTOCOL_ERROR, f"HEADERS on stream {sid}, not above {self.last_stream}")
        # else reset by us: what was in flight then is dropped (its DATA counted for the connection)

    def _stream_error(self, st, code: int, why: str) -> None:
        """RST_STREAM `code` (§5.4.2): `st` a Stream (open) or a stream id (not open)."""
        self._charge_reset()
        if isinstance(st, int):
            self._write(frame(RST_STREAM, 0, st, U32.pack(code)))
            return
        self._write(frame(RST_STREAM, 0, st.id, U32.pack(code)))
        st.local_closed = True
        self._close(st, RESET_BY_US)
        self.events.append(StreamReset(st, code, False))     # every open stream was announced

    def _refuse_stream(self, sid: int, code: int, why: str = "") -> None:
        """A stream reset as it opens (REFUSED_STREAM, or a malformed request)."""
        self._charge_reset()
        self._write(frame(RST_STREAM, 0, sid, U32.pack(code)))
        self._remember(sid, RESET_BY_US)

    def _charge_reset(self) -> None:
        """A reset the client caused, from its bucket (Limits.reset_burst, resets_per_s)."""
        now = self.now
        if self.reset_at is not None:
            self.reset_tokens = min(float(self.limits.reset_burst),
                                    self.reset_tokens + (now - self.reset_at) * self.limits.resets_per_s)
        self.reset_at = now
        if self.reset_tokens < 1.0:
            hits["resets"] += 1
            raise ProtocolError(ENHANCE_YOUR_CALM, "too many stream resets")
        self.reset_tokens -= 1.0

    def _control(self) -> None:
        now = self.now
        if now - self.control_since >= 1.0:
            self.control_since, self.control_count = now, 0
        self.control_count += 1
        if self.control_count > self.limits.max_control_frames_per_s:
            hits["control_frames"] += 1
            raise ProtocolError(ENHANCE_YOUR_CALM, "too many control frames")

    def _remember(self, sid: int, how: int) -> None:
        closed = self.closed
        closed[sid] = how
        if len(closed) > self.limits.closed_streams_remembered:
            del closed[next(iter(closed))]

    def _close(self, st: Stream, how: int) -> None:
        del self.streams[st.id]
        if st.queue:
            self.queued_bytes -= st.queued
            st.queue.clear()
            st.queued = 0
            self.ready.pop(st.id, None)
            self.stalled.pop(st.id, None)
        self._remember(st.id, how)

    # -- answers (the caller's) ------------------------------------------------------

    def credit(self, st: Stream, n: int) -> None:
        """Give `n` bytes of the stream's window back (what its handler held, now read)."""
        if n > 0 and not st.remote_closed and not self.terminated:
            st.recv_window += n
            self._write(frame(WINDOW_UPDATE, 0, st.id, U32.pack(n)))

    def send_headers(self, st: Stream, block: bytes, end_stream: bool = False) -> None:
        if st.local_closed or self.terminated:
            return
        if not st.refused:
            self._answered()
        self._write(self._header_frames(st.id, block, END_STREAM if end_stream else 0))
        if end_stream:
            self._finish(st)

    def send_answer(self, st: Stream, headers: bytes, data: bytes, trailers: bytes) -> None:
        """send_headers, send_data and send_trailers of a whole answer (a unary gRPC call's):
        three frames together when the data fits the windows and one frame, as it mostly does."""
        if st.local_closed or self.terminated:
            return
        n = len(data)
        if st.queue or n > st.send_window or n > self.send_window or n > self.peer_max_frame \
                or len(headers) > self.peer_max_frame or len(trailers) > self.peer_max_frame:
            self.send_headers(st, headers)
            self.send_data(st, data)
            return self.send_trailers(st, trailers)
        self._answered()
        st.send_window -= n
        self.send_window -= n
        self.window_update_allowance += 2
        self._write(frame(HEADERS, END_HEADERS, st.id, headers) + frame(DATA, 0, st.id, data)
                    + frame(HEADERS, END_HEADERS | END_STREAM, st.id, trailers))
        self._finish(st)

    def send_data(self, st: Stream, data, end_stream: bool = False) -> None:
        """DATA now where the windows allow, else queued (a view of `data`, not a copy)."""
        if st.local_closed or self.terminated:
            return
        n = len(data)
        if not st.queue and n <= st.send_window and n <= self.send_window and n <= self.peer_max_frame \
                and self.out_size < OUT_HIGH:
            if not st.refused:
                self._answered()
            st.send_window -= n
            self.send_window -= n
            self.window_update_allowance += 2
            self._write(frame(DATA, END_STREAM if end_stream else 0, st.id, data))
            if end_stream:
                self._finish(st)
            return
        if n:
            st.queue.append(memoryview(data))
            st.queued += n
            self.queued_bytes += n
        if end_stream:
            st.queue.append(END_DATA)
        self._wait(st)

    def send_trailers(self, st: Stream, block: bytes) -> None:
        """The stream's last header block, after whatever data still waits for a window."""
        if st.local_closed or self.terminated:
            return
        if not st.queue:
            return self.send_headers(st, block, end_stream=True)
        st.queue.append(block)
        self._wait(st)

    def refuse(self, st: Stream, block: bytes, body: bytes = b"") -> None:
        """An answer the connection's caller gives without a handler (a 405, an unknown method):
        sending it does not clear the client's PING strikes, as an answer to a call does."""
        st.refused = True
        if body:
            self.send_headers(st, block)
            self.send_data(st, body, end_stream=True)
        else:
            self.send_headers(st, block, end_stream=True)

    def reset_stream(self, st: Stream, code: int) -> None:
        """End the stream with RST_STREAM (the caller's handler is over)."""
        if st.id not in self.streams or self.terminated:
            return
        self._write(frame(RST_STREAM, 0, st.id, U32.pack(code)))
        st.local_closed = True
        self._close(st, RESET_BY_US)

    def go_away(self, code: int = NO_ERROR, why: str = "") -> None:
        """No new streams (those open go on)."""
        if self.going_away and code == NO_ERROR or self.terminated:
            return
        self.going_away = True
        self._write(goaway(self.last_stream, code, why.encode()[:256]))

    def queued(self, st: Stream) -> bool:
        """Data of `st` still waits for a window or for data_to_send."""
        return bool(st.queue)

    @property
    def idle_after_goaway(self) -> bool:
        """GOAWAY either way and no stream left: the connection can be closed."""
        return self.going_away and not self.streams

    # -- bytes out -------------------------------------------------------------------

    def data_to_send(self, limit: int = OUT_HIGH) -> bytes:
        """The bytes to write now: frames made so far and queued DATA the windows let go,
        up to about `limit` bytes of it (the rest stays queued for the next call)."""
        if self.ready and self.send_window > 0 and not self.terminated:
            self._pump(limit)
        if not self.out:
            return b""
        data = b"".join(self.out)
        self.out.clear()
        self.out_size = 0
        return data

    def has_ready_data(self) -> bool:
        """Queued DATA that windows let go, left for the next data_to_send()."""
        return bool(self.ready) and self.send_window > 0 and not self.terminated

    def _pump(self, limit: int) -> None:
        for sid, st in list(self.ready.items()):
            queue = st.queue
            while queue:
                head = queue[0]
                if type(head) is not memoryview:    # the trailers, or END_DATA, all data before them sent
                    queue.popleft()
                    del self.ready[sid]
                    if head is END_DATA:
                        self._write(frame(DATA, END_STREAM, sid))
                        self._finish(st)
                    else:
                        self.send_headers(st, head, end_stream=True)
                    break
                if self.out_size >= limit:
                    return
                room = min(st.send_window, self.send_window, self.peer_max_frame)
                if room <= 0:
                    if st.send_window <= 0:
                        del self.ready[sid]
                        self.stalled[sid] = st
                        break
                    return                      # the connection's window: every stream waits
                part = head[:room]
                n = len(part)
                st.send_window -= n
                self.send_window -= n
                st.queued -= n
                self.queued_bytes -= n
                self.window_update_allowance += 2
                if not st.refused:
                    self._answered()            # DATA going out when a window opened clears strikes too
                self._write(frame_header(DATA, 0, sid, n))
                self._write(part)
                if n == len(head):
                    queue.popleft()
                else:
                    queue[0] = head[n:]
            else:
                self.ready.pop(sid, None)

    def _wait(self, st: Stream) -> None:
        if st.send_window > 0:
            self.ready[st.id] = st
        else:
            self.stalled[st.id] = st

    def _header_frames(self, sid: int, block: bytes, end: int) -> bytes:
        size = self.peer_max_frame
        if len(block) <= size:
            return frame(HEADERS, END_HEADERS | end, sid, block)
        parts = [block[i:i + size] for i in range(0, len(block), size)]
        out = [frame(HEADERS, end, sid, parts[0])]
        out += [frame(CONTINUATION, 0, sid, p) for p in parts[1:-1]]
        out.append(frame(CONTINUATION, END_HEADERS, sid, parts[-1]))
        return b"".join(out)

    def _answered(self) -> None:
        """An answer is going out: the PINGs before it were not abuse (grpc-core's policy)."""
        self.last_ping, self.ping_strikes = float("-inf"), 0

    def _finish(self, st: Stream) -> None:
        st.local_closed = True
        if st.remote_closed:
            how = END_RECEIVED
        else:       # the answer is complete before the request: stop its upload (§8.1)
            self._write(frame(RST_STREAM, 0, st.id, U32.pack(NO_ERROR)))
            how = RESET_BY_US
        if st.id in self.streams:
            self._close(st, how)

    def _write(self, data) -> None:
        self.out.append(data)
        self.out_size += len(data)

    def _fail(self, code: int, why: str) -> None:
        """A connection error: GOAWAY, and nothing more is read or sent after it."""
        self.out.append(goaway(self.last_stream, code, why.encode()[:256]))
        self.terminated = self.going_away = True
        self.buf = b""
        self.block = None
        self.events.append(ConnectionTerminated(code, why))


def _name(kind: int) -> str:
    return _KIND_NAMES[kind] if kind < len(_KIND_NAMES) else f"frame type {kind}"
