"""The gRPC lane: gRPC over serving.h2's HTTP/2, serving the same servicers grpc.aio would.

The model server's gRPC port (`mcpctl serve --grpc-frontend fast`, the default),
the Endpoint Picker's ext_proc port (`mcpctl epp serve --grpc-frontend fast`)
and the control plane's ADS port (`mcpctl xds serve --grpc-frontend fast`) run
on this instead of grpcio's server: per call it costs about a third of
grpc.aio's CPU on this machine (inference-backend/README.md "gRPC lane"), an
ext_proc stream through Envoy ~0.5 ms less (scheduler/README.md), a proxy's
share of an xDS push two thirds (xds-server/README.md "Scale"). The servicers do not
change: GRPCInferenceService, Triton's extra RPCs, grpc.health.v1 and reflection
register here through the calls grpcio's generated code makes
(add_generic_rpc_handlers, add_registered_method_handlers), and each call runs
their behaviour with a context offering what grpc.aio's ServicerContext does
(abort, set_code/set_details, trailing metadata, invocation metadata, write for
server streaming, which returns once the message has left for the transport,
time_remaining, peer).

The protocol (grpc/grpc doc/PROTOCOL-HTTP2.md): POST with content-type
application/grpc[+proto]; messages framed as 1 byte compressed flag + 4 bytes
length; grpc-timeout (a deadline: the handler is cancelled and the call ends
DEADLINE_EXCEEDED); `-bin` metadata base64; grpc-encoding gzip/deflate accepted
on requests, answers never compressed; grpc-status / percent-encoded
grpc-message in the trailers, or a trailers-only answer when no message was
sent. All four call shapes. Limits as grpcio's options set them: a message over
max_receive is RESOURCE_EXHAUSTED before it is kept whole.

What a client can make it hold: a writer (context.write, or each message of a handler
written as an async generator or an iterator) waits until its message has left; a
streaming call holds at most STREAM_BUFFER of unread requests before its stream's window
stops coming back (what comes after stays bytes, bounded by the window); and one connection's
calls hold at most CONNECTION_BUFFER unread before every stream but the first to go past it
stops getting its window back (a client that ignores windows is told FLOW_CONTROL_ERROR). The HTTP/2
limits themselves are serving/h2/limits.py's.
"""
from __future__ import annotations

import asyncio
import base64
import dataclasses
import inspect
import logging
import struct
import time
import zlib

import grpc

from mcp26.serving.h2 import limits as h2_limits
from mcp26.serving.h2.hpack_encoder import STATUS_200, hpack_int, http_status_block, literal
from mcp26.serving.h2.protocol import H2Protocol

log = logging.getLogger("mcp26.serving.grpc.server")

_LEN = struct.Struct(">I")
RESPONSE_HEADERS = STATUS_200 + literal(b"content-type", b"application/grpc")
_OK_TRAILERS = literal(b"grpc-status", b"0")
_TIMEOUT_UNITS = {ord("H"): 3600.0, ord("M"): 60.0, ord("S"): 1.0, ord("m"): 1e-3, ord("u"): 1e-6, ord("n"): 1e-9}
# what a call's invocation_metadata leaves out, as grpcio does (the transport's own headers)
_TRANSPORT_HEADERS = frozenset((b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding"))
_END = object()         # the request stream's end, in a streaming call's queue
# Bytes of request messages a streaming call may hold unread before its stream's window
# stops coming back (the client then waits, as grpcio's flow control makes it).
STREAM_BUFFER = 1 << 20
# What one queued request message costs beyond its wire bytes (the deserialized message, the
# queue's tuple; measured: 616 bytes for a 2-byte reflection request), counted against
# STREAM_BUFFER: 1 MB of 7-byte messages was 150,000 of them (4.5 MB of reflection requests
# sent to a zero-window stream held 93 MB of message objects).
MESSAGE_OVERHEAD = 640
# Bytes of request messages one connection's calls hold unread (not yet whole, or queued for
# their handlers) before the windows of its streams stop coming back; one stream at a time may
# go on past it (a message up to max_receive), so that one large message still arrives.
CONNECTION_BUFFER = 4 << 20
# A body for the answers to what is not a gRPC call (a browser, curl, a conformance tester's GET /)
NOT_GRPC = b"This is a gRPC server: it answers POST with content-type application/grpc.\n"
NOT_GRPC_BODY = 64 << 10       # of such a request's body read before it is answered anyway
_NOT_GRPC_FIELDS = literal(b"content-type", b"text/plain; charset=utf-8") + literal(b"allow", b"POST")
BIG_MESSAGE = 64 << 10          # a response this large is not copied behind its 5-byte prefix


def percent_encode(text: str) -> bytes:
    """grpc-message: UTF-8, every byte outside 0x20-0x7E and '%' as %XX."""
    out = bytearray()
    for b in text.encode("utf-8", "replace"):
        out += b"%%%02X" % b if b < 0x20 or b > 0x7E or b == 0x25 else bytes((b,))
    return bytes(out)


_NAMES: dict[str, tuple[bytes, bool]] = {}      # key -> (its literal's name part, -bin), per key seen
_NAMES_MAX = 1024


def _name_part(key: str) -> tuple[bytes, bool]:
    part = _NAMES.get(key)
    if part is None:
        name = key.lower().encode("ascii")
        part = (b"\x00" + hpack_int(len(name), 7) + name, name.endswith(b"-bin"))
        if len(_NAMES) < _NAMES_MAX:        # the keys a server sends are few; past this many, not kept
            _NAMES[key] = part
    return part


def metadata_block(pairs) -> bytes:
    """Custom metadata as literals (connection.literal); a `-bin` key's value base64 without padding."""
    out = []
    for key, value in pairs or ():
        name, binary = _name_part(key)
        if binary:
            value = base64.b64encode(value if isinstance(value, bytes) else value.encode()).rstrip(b"=")
        elif isinstance(value, str):
            value = value.encode("latin-1", "replace")
        out.append(name + hpack_int(len(value), 7) + value)
    return b"".join(out)


def status_block(code: grpc.StatusCode, details: str | None) -> bytes:
    """grpc-status and, when there are details, the percent-encoded grpc-message."""
    block = literal(b"grpc-status", str(code.value[0]).encode())
    return block + literal(b"grpc-message", percent_encode(details)) if details else block


def parse_timeout(value: bytes) -> float | None:
    """grpc-timeout: up to 8 digits and a unit; None when malformed (then ignored, as grpcio does)."""
    if 2 <= len(value) <= 9 and value[:-1].isdigit() and value[-1] in _TIMEOUT_UNITS:
        return int(value[:-1]) * _TIMEOUT_UNITS[value[-1]]
    return None


class AbortError(Exception):
    """context.abort's way out of a handler (grpc.aio raises its own AbortError)."""


class _Details(grpc.HandlerCallDetails):
    def __init__(self, method: str, invocation_metadata):
        self.method = method
        self.invocation_metadata = invocation_metadata


class Context:
    """What a handler sees of its call; grpc.aio.ServicerContext's methods used by servicers."""

    def __init__(self, call: "Call"):
        self._call = call
        self.code_ = None
        self.details_ = None
        self.trailers = ()
        self._done_callbacks = []

    def invocation_metadata(self):
        return self._call.metadata

    def calls_starting(self) -> int:
        """Other calls read and about to start on this loop turn (not in grpc.aio's context):
        a handler may leave work for them to share, as the model server's batcher does."""
        return self._call.lane.starting

    def peer(self) -> str:
        return self._call.conn.peer

    def peer_identities(self):
        return None

    def peer_identity_key(self):
        return None

    def auth_context(self) -> dict:
        return {}

    def time_remaining(self) -> float | None:
        d = self._call.deadline
        return None if d is None else max(0.0, d - time.monotonic())

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code_ = code

    def set_details(self, details: str) -> None:
        self.details_ = details

    def code(self):
        return self.code_

    def details(self):
        return self.details_

    def set_trailing_metadata(self, trailing_metadata) -> None:
        self.trailers = tuple(trailing_metadata)

    def trailing_metadata(self):
        return self.trailers

    def set_compression(self, compression) -> None:
        pass        # answers are never compressed

    def disable_next_message_compression(self) -> None:
        pass

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata=()):
        if code == grpc.StatusCode.OK:
            raise ValueError("abort() with StatusCode.OK")
        self.code_, self.details_ = code, details
        if trailing_metadata:
            self.trailers = tuple(trailing_metadata)
        raise AbortError(details)

    async def send_initial_metadata(self, initial_metadata) -> None:
        self._call.send_headers(metadata_block(initial_metadata))

    async def write(self, message) -> None:
        """Returns once the message has left for the transport, as grpc.aio's write waits for
        the peer's flow control: a streaming writer cannot run ahead of a slow reader."""
        call = self._call
        call.send_message(message)
        waiter = call.conn.drained(call.stream)
        if waiter is not None:
            await waiter

    async def read(self):
        return await self._call.next_request()

    def cancelled(self) -> bool:
        return self._call.cancelled

    def done(self) -> bool:
        return self._call.finished

    def add_done_callback(self, callback) -> None:
        self._done_callbacks.append(callback)


class Call:
    """One RPC on one stream: collects request messages, runs the handler, answers."""

    __slots__ = ("conn", "stream", "lane", "handler", "path", "metadata", "deadline", "timer", "encoding",
                 "buf", "need", "holds", "ended", "requests", "queue", "queued", "uncredited", "task", "context",
                 "headers_sent", "cancelled", "finished", "deadline_hit", "ran")

    def __init__(self, lane: "GrpcLane", conn: H2Protocol, stream, handler, path: str, metadata, deadline,
                 encoding: bytes | None):
        self.lane, self.conn, self.stream, self.handler, self.path = lane, conn, stream, handler, path
        self.metadata, self.deadline, self.encoding = metadata, deadline, encoding
        self.timer = None
        self.buf = bytearray()              # a message not yet whole
        self.need = 0                       # bytes it takes (prefix included) before it is
        self.holds = 0                      # len(buf) + queued, as the connection's _Inflow counts it
        self.ended = False                  # the request ended while its bytes wait for the handler
        self.requests: list = []            # unary request: its one message
        self.queue: asyncio.Queue | None = asyncio.Queue() if handler.request_streaming else None
        self.queued = 0                     # wire bytes of the messages in `queue`
        self.uncredited = 0                 # window held back from the client until they are read
        self.task = None
        self.context = Context(self)
        self.headers_sent = self.cancelled = self.finished = self.deadline_hit = False
        self.ran = False                    # its task has begun (GrpcLane.starting counts those that have not)
        if handler.request_streaming:       # starts at once: it reads as messages come
            self._start()

    # -- the connection's events (serving.h2.protocol) ---------------------------

    def data_received(self, data: bytes) -> None:
        if self.finished:
            return
        self._read(data)
        if not self.finished:
            self._holding()

    def _full(self) -> bool:
        """A streaming call's handler is STREAM_BUFFER behind: what comes stays bytes for now."""
        return self.queue is not None and self.queued >= STREAM_BUFFER

    def _read(self, data: bytes) -> None:
        if self.buf:            # a message arriving in pieces: appended until whole (never re-copied)
            self.buf += data
            if len(self.buf) < self.need or self._full():
                return
            data, self.buf = bytes(self.buf), bytearray()
        limit = self.lane.max_receive
        i, n = 0, len(data)
        while n - i >= 5:
            if self._full():
                break           # the rest is parsed as the handler reads (taken): bounded by the window
            size = _LEN.unpack_from(data, i + 1)[0]
            if size > limit:
                return self.fail(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                 f"Received message larger than max ({size} vs. {limit})")
            if n - i < 5 + size:
                break
            compressed = data[i]
            message = data[i + 5:i + 5 + size]
            i += 5 + size
            if compressed:
                try:
                    message = self._decompress(message)
                except _TooLarge as e:
                    return self.fail(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
                except _Unsupported as e:
                    return self.fail(grpc.StatusCode.UNIMPLEMENTED, str(e))
                except (ValueError, zlib.error) as e:
                    return self.fail(grpc.StatusCode.INTERNAL, f"cannot decompress the message: {e}")
            try:
                request = self.handler.request_deserializer(message) if self.handler.request_deserializer \
                    else message
            except Exception as e:     # noqa: BLE001 - a message that does not parse is the client's
                return self.fail(grpc.StatusCode.INTERNAL, f"Failed to parse request: {type(e).__name__}")
            if self.queue is not None:
                self.queue.put_nowait((request, 5 + size + MESSAGE_OVERHEAD))
                self.queued += 5 + size + MESSAGE_OVERHEAD
            else:
                self.requests.append(request)
                if len(self.requests) > 1:
                    return self.fail(grpc.StatusCode.UNIMPLEMENTED, "more than one request message on a unary call")
        if i < n:
            self.buf = bytearray(data[i:])
            self.need = 5 + _LEN.unpack_from(data, i + 1)[0] if n - i >= 5 else 5

    def end(self) -> None:
        if self.finished:
            return
        if self.queue is not None and self.buf and len(self.buf) >= self.need:
            self.ended = True           # whole messages wait as bytes: once the handler has read them
            return
        if self.buf:
            return self.fail(grpc.StatusCode.INTERNAL, "the request stream ended inside a message")
        if self.queue is not None:
            self.queue.put_nowait((_END, 0))
        elif len(self.requests) != 1:
            self.fail(grpc.StatusCode.UNIMPLEMENTED, "a unary call without its request message")
        else:
            self._start()

    def credit_now(self, length: int) -> bool:
        """May this stream's window come back now? Not while a streaming call holds
        STREAM_BUFFER of messages its handler has not read (taken() gives it back), nor while
        the connection's calls hold CONNECTION_BUFFER and another call is the one let past it
        (_Inflow)."""
        if self._may_credit():
            return True
        self.uncredited += length
        return False

    def _may_credit(self) -> bool:
        if self._full():
            return False
        inflow = self.conn.user
        if inflow.holding <= CONNECTION_BUFFER:
            return True
        if inflow.owner is None:
            inflow.owner = self
        if inflow.owner is self:
            return True
        inflow.held.add(self)
        return False

    def give_back(self) -> None:
        """The window held back, once it may come back."""
        if self.uncredited and not self.finished and self._may_credit():
            self.conn.credit(self.stream, self.uncredited)
            self.uncredited = 0

    def _holding(self) -> None:
        """What this call holds unread (bytes, queued messages) into the connection's count."""
        size = len(self.buf) + self.queued
        if size != self.holds:
            inflow = self.conn.user
            inflow.holding += size - self.holds
            shrank = size < self.holds
            self.holds = size
            if shrank:
                inflow.settle(self)

    def taken(self, size: int) -> None:
        """The handler read a message of `size` wire bytes."""
        self.queued -= size
        if self.buf and self.queued <= STREAM_BUFFER >> 1 and len(self.buf) >= self.need:
            # bytes left while the queue was full, once it is half empty (not per message taken:
            # the rest of a window's bytes would be copied again each time)
            data, self.buf = bytes(self.buf), bytearray()
            self._read(data)
        if self.ended and len(self.buf) < self.need:
            self.ended = False
            self.end()
        if not self.finished:
            self._holding()
            if self.uncredited:
                self.give_back()

    def reset(self) -> None:
        """The client cancelled (RST_STREAM) or the connection went."""
        self.cancelled = True
        if self.task is not None and not self.task.done():
            self.task.cancel()
        self._done()

    # -- the handler -----------------------------------------------------------

    def _start(self) -> None:
        loop = self.conn.loop or asyncio.get_running_loop()
        if self.deadline is not None:
            self.timer = loop.call_later(max(0.0, self.deadline - time.monotonic()), self._expire)
        self.task = loop.create_task(self._run())
        self.lane.starting += 1
        self.lane.calls.add(self.task)
        self.task.add_done_callback(self._task_done)

    def _task_done(self, task) -> None:
        self.lane.calls.discard(task)
        if not self.ran:            # cancelled before its first step
            self.lane.starting -= 1
        if self.finished:
            self.context = None     # Call -> Context -> Call, let go of without the cyclic collector

    def _expire(self) -> None:
        self.timer = None
        if not self.finished:
            self.deadline_hit = True
            if self.task is not None:
                self.task.cancel()

    async def next_request(self):
        item, size = await self.queue.get()
        self.taken(size)
        return None if item is _END else item    # grpc.aio's read() returns EOF; callers test falsiness

    async def _requests(self):
        while True:
            item, size = await self.queue.get()
            self.taken(size)
            if item is _END:
                return
            yield item

    async def _run(self) -> None:
        h, ctx = self.handler, self.context
        self.ran = True
        self.lane.starting -= 1
        try:
            if h.unary_unary:
                result = h.unary_unary(self.requests[0], ctx)
                self._answer(await result if inspect.isawaitable(result) else result)
            elif h.stream_unary:
                result = h.stream_unary(self._requests(), ctx)
                self._answer(await result if inspect.isawaitable(result) else result)
            else:
                behavior = h.unary_stream or h.stream_stream
                arg = self.requests[0] if h.unary_stream else self._requests()
                result = behavior(arg, ctx)
                # each message waits until it has left, as context.write does: a client that
                # grants no window holds the handler, not a pile of answers
                if inspect.isasyncgen(result):
                    async for message in result:
                        self.send_message(message)
                        waiter = self.conn.drained(self.stream)
                        if waiter is not None:
                            await waiter
                elif inspect.isawaitable(result):
                    await result            # it wrote with context.write
                else:
                    for message in result or ():
                        self.send_message(message)
                        waiter = self.conn.drained(self.stream)
                        if waiter is not None:
                            await waiter
                self._close(ctx.code_ or grpc.StatusCode.OK, ctx.details_)
        except AbortError:
            self._close(ctx.code_, ctx.details_)
        except asyncio.CancelledError:
            if self.deadline_hit:
                self._close(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            else:
                self._done()
        except Exception as e:     # noqa: BLE001 - grpcio answers UNKNOWN for a handler's exception
            log.exception("gRPC handler %s raised", self.path)
            self._close(grpc.StatusCode.UNKNOWN, f"Unexpected error in RPC handling: {type(e).__name__}: {e}")

    # -- answers ---------------------------------------------------------------

    def _answer(self, response) -> None:
        """A unary answer: headers, the message and the trailers in one write (the usual case)."""
        code = self.context.code_
        if code is not None and code != grpc.StatusCode.OK:
            return self._close(code, self.context.details_)
        if self.finished:
            return
        try:
            data = self._frame(response)
        except _TooLarge as e:
            return self._close(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        conn, st = self.conn, self.stream
        trailers = self.context.trailers
        trailers = _OK_TRAILERS + metadata_block(trailers) if trailers else _OK_TRAILERS
        if not self.headers_sent:
            self.headers_sent = True
            conn.send_answer(st, RESPONSE_HEADERS, data, trailers)
        else:       # send_initial_metadata went first
            conn.send_data(st, data)
            conn.send_trailers(st, trailers)
        self._done()

    def _frame(self, message) -> bytes:
        data = self._serialize(message)
        return b"\x00" + _LEN.pack(len(data)) + data

    def _serialize(self, message) -> bytes:
        data = self.handler.response_serializer(message) if self.handler.response_serializer else message
        if len(data) > self.lane.max_send:
            raise _TooLarge(f"Sent message larger than max ({len(data)} vs. {self.lane.max_send})")
        return data

    def send_headers(self, extra: bytes = b"") -> None:
        if not self.headers_sent and not self.finished:
            self.headers_sent = True
            self.conn.send_headers(self.stream, RESPONSE_HEADERS + extra)

    def send_message(self, message) -> None:
        if self.finished:
            raise asyncio.CancelledError()      # the call is over: stop the writer
        self.send_headers()
        data = self._serialize(message)
        if len(data) < BIG_MESSAGE:
            self.conn.send_data(self.stream, b"\x00" + _LEN.pack(len(data)) + data)
        else:       # the prefix on its own: the message (a shared 5 MB xDS body) is sent, not copied
            self.conn.send_data(self.stream, b"\x00" + _LEN.pack(len(data)))
            self.conn.send_data(self.stream, data)

    def _close(self, code: grpc.StatusCode, details: str | None) -> None:
        if self.finished:
            return
        block = status_block(code, details) + metadata_block(self.context.trailers)
        if self.headers_sent:
            self.conn.send_trailers(self.stream, block)
        else:       # trailers-only
            self.headers_sent = True
            self.conn.send_headers(self.stream, RESPONSE_HEADERS + block, end_stream=True)
        self._done()

    def fail(self, code: grpc.StatusCode, details: str) -> None:
        """Ends the call from the transport side (bad input): status, then no more reading."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
        self._close(code, details)

    def _done(self) -> None:
        if self.finished:
            return
        self.finished = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        for cb in self.context._done_callbacks:
            try:
                cb(self.context)
            except Exception:      # noqa: BLE001
                log.exception("gRPC done callback raised")
        # what ties a finished call to its stream and connection goes now (Stream.user, the
        # bytes it held), so that a closed connection's calls are freed by reference counting
        self.stream.user = None
        if self.holds:
            self.buf, self.queued = bytearray(), 0
            self._holding()
        inflow = self.conn.user
        if inflow.held or inflow.owner is self:
            inflow.held.discard(self)
            inflow.settle(self)
        if self.task is None:
            self.context = None

    def _decompress(self, message: bytes) -> bytes:
        if self.encoding == b"gzip":
            out = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(message, self.lane.max_receive + 1)
        elif self.encoding == b"deflate":
            out = zlib.decompressobj().decompress(message, self.lane.max_receive + 1)
        elif self.encoding is None:
            raise ValueError("a compressed message without grpc-encoding")
        else:
            raise _Unsupported(f"Compression algorithm '{self.encoding.decode('ascii', 'replace')}' is not supported")
        if len(out) > self.lane.max_receive:
            raise _TooLarge(f"Decompressed message larger than max (over {self.lane.max_receive})")
        return out


class _TooLarge(Exception):
    pass


class _Unsupported(Exception):
    pass


class _Inflow:
    """What one connection's calls hold of request messages unread (CONNECTION_BUFFER)."""
    __slots__ = ("holding", "owner", "held")

    def __init__(self):
        self.holding = 0            # bytes, all calls together
        self.owner: Call | None = None      # the one call let go on past the budget
        self.held: set[Call] = set()        # calls whose window waits for the budget

    def settle(self, call: Call) -> None:
        """`call` holds less now (or is over): the owner's place is free once it holds nothing;
        held windows come back once the connection is under its budget, else the call holding
        the most is the next let past it (the others would wait for windows that never come)."""
        if self.owner is call and (not call.holds or call.finished):
            self.owner = None
        if not self.held:
            return
        if self.holding <= CONNECTION_BUFFER:
            held, self.held = self.held, set()
            for c in held:
                c.give_back()
        elif self.owner is None:
            nearest = max(self.held, key=lambda c: c.holds)
            self.held.discard(nearest)
            self.owner = nearest
            nearest.give_back()


class GrpcLane:
    """The server: handlers registered as on a grpc.aio.Server, listening with asyncio."""

    def __init__(self, max_receive: int, max_send: int, min_ping_interval_s: float | None = None,
                 connections: set | None = None, limits: h2_limits.Limits = h2_limits.DEFAULT):
        self.max_receive, self.max_send = max_receive, max_send
        # grpcio's grpc.http2.min_ping_interval_without_data_ms: a client pinging more often
        # than this, with nothing sent to it between, is told too_many_pings.
        if min_ping_interval_s is not None:
            limits = dataclasses.replace(limits, min_ping_interval_s=min_ping_interval_s)
        self.limits = limits
        self.stopped = asyncio.Event()
        self.registered: dict[str, object] = {}    # "/service/method" -> RpcMethodHandler
        self.generic: list = []
        self.resolved: dict[bytes, object] = {}    # :path -> handler, once looked up
        # the open connections (a set-like that counts them for a connection balancer may be given)
        self.connections: set[H2Protocol] = set() if connections is None else connections
        self.calls: set[asyncio.Task] = set()
        self.starting = 0           # calls whose task is made and has not run yet (Context.calls_starting)
        self.server = None          # asyncio's server, or one with its close() (connection_balance)

    # -- what grpcio's generated add_*_to_server functions call ------------

    def add_generic_rpc_handlers(self, handlers) -> None:
        self.generic.extend(handlers)
        self.resolved.clear()

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        for method, h in handlers.items():
            self.registered[f"/{service}/{method}"] = h
        self.resolved.clear()

    def _lookup(self, path: bytes, metadata):
        h = self.resolved.get(path)
        if h is None:
            name = path.decode("ascii", "replace")
            h = self.registered.get(name)
            for g in self.generic if h is None else ():
                h = g.service(_Details(name, metadata))
                if h is not None:
                    break
            if h is None:
                return None
            self.resolved[path] = h
        return h

    # -- serving ---------------------------------------------------------------

    async def start(self, host: str, port: int, **listen) -> int:
        """Listen (`listen`: create_server's options; the backlog Limits.listen_backlog unless given)."""
        loop = asyncio.get_running_loop()
        listen.setdefault("backlog", self.limits.listen_backlog)
        self.server = await loop.create_server(self.new_connection, host, port, **listen)
        return self.server.sockets[0].getsockname()[1]

    def new_connection(self) -> H2Protocol:
        """The protocol factory: a connection, counted as open until it closes."""
        conn = H2Protocol(self._new_call, self.connections.discard, self.limits)
        conn.user = _Inflow()
        self.connections.add(conn)
        return conn

    def _new_call(self, conn: H2Protocol, st, headers):
        if headers is None:     # over Limits.max_header_list: this call only, as grpcio answers it
            _refuse(conn, st, grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"received metadata size exceeds limit ({self.limits.max_header_list})")
            return None
        path = method = content_type = timeout = encoding = None
        metadata = []
        for k, v in headers:
            if k[0] == 58:      # ':'
                if k == b":path":
                    path = v
                elif k == b":method":
                    method = v
            elif k in _TRANSPORT_HEADERS:
                if k == b"content-type":
                    content_type = v
                elif k == b"grpc-timeout":
                    timeout = parse_timeout(v)
                elif k == b"grpc-encoding":
                    encoding = v
            else:
                key = k.decode("ascii", "replace")
                metadata.append((key, _b64decode(v) if key.endswith("-bin") else v.decode("latin-1")))
        if method != b"POST" or path is None:
            return _NotGrpc(conn, st, 405)
        if content_type is None or not content_type.startswith(b"application/grpc"):
            return _NotGrpc(conn, st, 415)
        metadata = tuple(metadata)
        handler = self._lookup(path, metadata)
        if handler is None:
            _refuse(conn, st, grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {path.decode('ascii', 'replace')}")
            return None
        if encoding == b"identity":
            encoding = None
        deadline = None if timeout is None else time.monotonic() + timeout
        return Call(self, conn, st, handler, path.decode("ascii", "replace"), metadata, deadline, encoding)

    async def stop(self, grace: float | None) -> None:
        """As grpc.aio's stop: no new calls; those running get `grace` seconds, then are cancelled."""
        if self.server is not None:
            self.server.close()
        for conn in list(self.connections):
            conn.go_away()
        if self.calls and grace:
            await asyncio.wait(list(self.calls), timeout=grace)
        for task in list(self.calls):
            task.cancel()
        if self.calls:
            await asyncio.gather(*list(self.calls), return_exceptions=True)
        for conn in list(self.connections):
            conn._flush()
            if conn.transport is not None:
                conn.transport.close()
        self.stopped.set()

    async def wait_for_termination(self) -> None:
        """As grpc.aio's: returns once stop() has run."""
        await self.stopped.wait()


# grpcio's Linux default is SO_REUSEPORT on: a second server started on a port in use binds it
# too, and the kernel splits new connections between them unseen (two control planes each
# serving half the proxies). Every grpc.aio server here passes this option, so a port in use is
# an error; only `mcpctl serve --workers N` turns it on, deliberately.
EXCLUSIVE_PORT = ("grpc.so_reuseport", 0)


async def start_server(server, host: str, port: int, what: str, **listen) -> int:
    """Bind and start a GrpcLane (`listen`: create_server's options) or a grpc.aio server;
    the port bound, or OSError naming `what` and the address."""
    if isinstance(server, GrpcLane):
        try:
            return await server.start(host, port, **listen)
        except OSError as e:
            raise OSError(f"cannot bind {what} {host}:{port}: {e.strerror or e}") from None
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:          # grpcio raises where older versions returned 0, and says only "failed"
        bound = 0
    if not bound:
        raise OSError(f"cannot bind {what} {host}:{port}: in use, or not an address of this host")
    await server.start()
    return bound


class _NotGrpc:
    """The handler of a request that is not a gRPC call: a 405 or 415 with a line of text, once
    the request has ended (its body, up to NOT_GRPC_BODY bytes, read and dropped), so that a
    malformed request is still told so (a content-length its body does not match)."""
    __slots__ = ("conn", "stream", "status", "read")

    def __init__(self, conn: H2Protocol, stream, status: int):
        self.conn, self.stream, self.status, self.read = conn, stream, status, 0

    def data_received(self, data: bytes) -> None:
        self.read += len(data)
        if self.read > NOT_GRPC_BODY:
            self.end()

    def credit_now(self, length: int) -> bool:
        return True

    def end(self) -> None:
        if self.stream.user is self:
            self.stream.user = None
            self.conn.refuse(self.stream, http_status_block(self.status) + _NOT_GRPC_FIELDS, NOT_GRPC)

    def reset(self) -> None:
        self.stream.user = None


def _refuse(conn: H2Protocol, st, code: grpc.StatusCode, details: str) -> None:
    """A trailers-only answer to a call that never reaches a handler."""
    conn.refuse(st, RESPONSE_HEADERS + status_block(code, details))


def _b64decode(value: bytes) -> bytes:
    try:
        return base64.b64decode(value + b"=" * (-len(value) % 4))
    except ValueError:
        return value

