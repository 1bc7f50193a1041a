"""The REST fast lane: KServe v2 infer over a bare asyncio.Protocol + httptools.

Why: profiled on relu REST at c=16, ~40 % of the server's CPU went to aiohttp's
request/response machinery (Request, StreamReader, multidicts, the response
writer), and Triton's C++ front end was ahead (0.81x at c=16, 0.70x at c=64).
This lane parses with httptools (llhttp, C) and writes each answer as one
bytes object; the infer semantics are rest.InferCore's, the same code the
aiohttp route runs (inference-backend/README.md: figures).

What it serves: `POST /v2/models/{name}/infer`,
`POST /v2/models/{name}/versions/{version}/infer` and the short form `POST /infer` / `/v2/infer`. Anything else (health,
metadata, Triton's extensions, OpenAI SSE, /metrics, a percent-encoded path,
an Upgrade) is handed to aiohttp for the rest of the connection: a
RequestHandler is created from the same AppRunner's web.Server, the transport
is switched to it (set_protocol, connection_made) and it is fed every byte not
yet consumed, from the first byte of that request on. Answers to infers before
it on the connection are written first.

Where that request starts: a fresh parser fed from a known message boundary
(the start of a read that began between messages) begins message k in the
first byte of it, so the offset is found by bisecting on prefix length. Only a
request pipelined behind others in one read needs this; the bytes since that
boundary are kept for it, up to RETAIN_BYTES (beyond, such a handoff closes the
connection after the answers before it, which a pipelining client retries:
RFC 9112 9.3.2).

HTTP/1.1: keep-alive (HTTP/1.0: when asked), Connection: close, Expect:
100-continue, chunked bodies (httptools de-chunks), pipelining (answers are
written in request order, however they complete), the body limit (413 as the
aiohttp route answers it), a head that never ends (431 past MAX_HEAD_BYTES),
malformed input (400, then close). Flow control:
reading pauses while MAX_IN_FLIGHT requests of a connection are unanswered or
while the transport asks us to stop writing.
"""
from __future__ import annotations

import asyncio
import collections
import http
import logging
import re
import time
from email.utils import formatdate

import httptools
from aiohttp import web
from aiohttp.http import SERVER_SOFTWARE

from mcp26.inference.errors import TooLarge
from mcp26.inference.rest import Answer, InferCore, error_answer
from mcp26.inference.rest_body import INLINE_JSON_BYTES

log = logging.getLogger("mcp26.inference")

# aiohttp's {name}: [^{}/]+; `/infer` and `/v2/infer`: the default model (model name "")
INFER_PATH = re.compile(r"/v2/models/([^{}/]+)(?:/versions/([^{}/]+))?/infer|/(?:v2/)?infer")
MAX_IN_FLIGHT = 32          # unanswered requests per connection before reading pauses
RETAIN_BYTES = 1 << 20      # bytes kept since the last known request start, for a pipelined handoff
LINGER_S = 5.0              # after a 413, how long the rest of the body is read (and dropped) before closing
# The request line and headers are held until complete (httptools joins a header's pieces itself):
# past this many bytes read while they are, 431 and close. Counted by reads, so a read in which a
# head starts counts whole (up to 256 KiB with uvloop); aiohttp refuses a field over 8,190 bytes,
# Envoy a head over 60 KiB, so no request they pass comes near it.
MAX_HEAD_BYTES = 1 << 20
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_REASONS = {s.value: s.phrase.encode() for s in http.HTTPStatus}


class _Stop(Exception):
    """Raised in a parser callback to end feed_data (a handoff, or no more requests taken)."""


class _Date:
    """The Date header, formatted once a second."""
    second, value = -1, b""

    @classmethod
    def get(cls) -> bytes:
        now = int(time.time())
        if now != cls.second:
            cls.second, cls.value = now, formatdate(now, usegmt=True).encode()
        return cls.value


def encode(a: Answer, version: bytes, keep_alive: bool) -> bytes:
    ctype = f"{a.content_type}; charset={a.charset}" if a.charset else a.content_type
    head = [b"HTTP/%s %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nDate: %s\r\nServer: %s\r\n"
            % (version, a.status, _REASONS.get(a.status, b"Unknown"), ctype.encode(), len(a.body), _Date.get(),
               SERVER_SOFTWARE.encode())]
    for k, v in a.headers:
        head.append(f"{k}: {v}\r\n".encode())
    if not keep_alive and version == b"1.1":
        head.append(b"Connection: close\r\n")
    elif keep_alive and version == b"1.0":
        head.append(b"Connection: keep-alive\r\n")
    head.append(b"\r\n")
    head.append(a.body)
    return b"".join(head)


class _Counter:
    """A scratch parser's protocol: how many requests began."""
    def __init__(self):
        self.n = 0

    def on_message_begin(self):
        self.n += 1


def message_start(raw: bytes, index: int) -> int:
    """Offset of request `index` (0: the first) in `raw`, which starts at a request boundary."""
    def begun(n: int) -> int:
        c = _Counter()
        try:
            httptools.HttpRequestParser(c).feed_data(raw[:n])
        except httptools.HttpParserError:
            pass
        return c.n
    lo, hi = 1, len(raw)
    while lo < hi:                      # the shortest prefix in which request `index` has begun
        mid = (lo + hi) // 2
        if begun(mid) > index:
            hi = mid
        else:
            lo = mid + 1
    return lo - 1


class FastLane:
    """The protocol factory for loop.create_server, and the connections it serves."""

    def __init__(self, core: InferCore, runner: web.AppRunner, connections: set | None = None):
        self.core = core
        self.runner = runner            # its web.Server makes the aiohttp handler a connection is handed to
        # the open connections (connection_balance.CountedSet with --workers: it publishes their number)
        self.connections: set[_Connection] = set() if connections is None else connections
        self.tasks: set[asyncio.Task] = set()   # answers awaited by a task (the loop keeps only weak references)
        self.server = None              # asyncio's server, or connection_balance.BalancedListener

    def __call__(self) -> "_Connection":
        return _Connection(self)

    async def start(self, host: str, port: int, **kwargs) -> int:
        """Listen (kwargs: loop.create_server's backlog, reuse_address, reuse_port); the port bound."""
        self.server = await asyncio.get_running_loop().create_server(self, host, port, **kwargs)
        return self.server.sockets[0].getsockname()[1]

    async def close(self, grace: float = 5.0) -> None:
        """Stop listening; connections close once their answers are written (at most `grace` s)."""
        if self.server:
            self.server.close()
        for c in list(self.connections):
            c.finish()
        deadline = time.monotonic() + grace
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for c in list(self.connections):
            c.transport.abort()


class _Connection(asyncio.Protocol):
    def __init__(self, lane: FastLane):
        self.lane = lane
        self.core = lane.core
        self.limit = lane.core.max_body_bytes
        self.transport = None
        self.parser = httptools.HttpRequestParser(self)
        self.answers: collections.deque[list] = collections.deque()   # [bytes or None, close after]
        self.closing = False            # no more requests are taken; close once answered
        self.write_paused = self.read_paused = False
        self.in_message = False
        self.in_head = False            # between a request's first byte and its headers' end
        self.head_bytes = 0             # bytes read while in_head (an over-count: see MAX_HEAD_BYTES)
        self.raw: list[bytes] | None = []   # bytes since the last known request start (None: dropped)
        self.raw_len = 0
        self.begun = 0                  # requests begun since then
        self.handoff: bytearray | None = None   # bytes for aiohttp, waiting for the answers before them
        self.linger = None              # after a 413 or 431: the request is still arriving
        self.discarding = False         # after a 431: nothing more is parsed

    # -- transport events ----------------------------------------------------------
    def connection_made(self, transport):
        self.transport = transport
        self.lane.connections.add(self)

    def connection_lost(self, exc):
        self.lane.connections.discard(self)
        self.closing = True
        self.answers.clear()
        if self.linger:
            self.linger.cancel()

    def pause_writing(self):
        self.write_paused = True
        self._reading()

    def resume_writing(self):
        self.write_paused = False
        self._reading()

    def data_received(self, data: bytes):
        if self.handoff is not None:
            self.handoff += data
            return
        if self.discarding:             # after a 431: read and dropped until the connection closes
            return
        if self.closing and self.linger is None:
            return
        if not self.in_message:         # a request starts here: a known boundary
            self.raw, self.raw_len, self.begun = [data], len(data), 0
        elif self.raw is not None:
            self.raw.append(data)
            self.raw_len += len(data)
            if self.raw_len > RETAIN_BYTES:
                self.raw = None
        was_in_head = self.in_head
        try:
            self.parser.feed_data(data)
            if self.in_head:
                self.head_bytes = self.head_bytes + len(data) if was_in_head else len(data)
                if self.head_bytes > MAX_HEAD_BYTES and not self.closing:
                    self._head_too_large()
        except httptools.HttpParserError as e:
            if isinstance(e, httptools.HttpParserCallbackError) and isinstance(e.__context__, _Stop):
                pass                    # a handoff, or no more requests taken
            elif not self.closing:
                if isinstance(e, httptools.HttpParserCallbackError):
                    log.error("REST fast lane: callback failed", exc_info=e.__context__)
                self.closing = True
                self._queue(error_answer(400, f"malformed HTTP request: {e}"), b"1.1", False)
        self._reading()

    def eof_received(self):
        if self.handoff is None:
            self.finish()
        return True                      # half-open: answers already due are still written

    # -- parser callbacks ----------------------------------------------------------
    def on_message_begin(self):
        if self.closing:
            raise _Stop
        self.in_message = self.in_head = True
        self.index = self.begun
        self.begun += 1
        self.url = b""
        self.headers = []
        self.body = []
        self.body_len = 0
        self.too_large = False
        self.slot = None

    def on_url(self, url: bytes):
        self.url += url

    def on_header(self, name: bytes, value: bytes):
        # as aiohttp decodes them (request_meta.wire_pairs turns them back into bytes)
        self.headers.append((name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape")))

    def on_headers_complete(self):
        self.in_head = False
        p = self.parser
        path = self.url.split(b"?", 1)[0]
        # a percent-encoded or non-ASCII path is aiohttp's to decode
        m = INFER_PATH.fullmatch(path.decode()) if path.isascii() and b"%" not in path else None
        if m is None or p.get_method() != b"POST" or p.should_upgrade():
            self._hand_off()
            raise _Stop
        self.model, self.version = m.group(1) or "", m.group(2) or ""
        self.http_version = p.get_http_version().encode()
        length = expect = None
        for k, v in self.headers:
            k = k.lower()
            if k == "content-length":
                length = v
            elif k == "expect":
                expect = v
        if length is not None and length.isdigit() and int(length) > self.limit:
            self._too_large()           # refused before the body is sent
        elif expect is not None and expect.lower() == "100-continue" and self.http_version == b"1.1":
            self.answers.append([CONTINUE, False])      # in order, after the answers before it
            self._flush()

    def on_body(self, chunk: bytes):
        if self.too_large:
            return
        self.body_len += len(chunk)
        if self.body_len > self.limit:
            self.body.clear()
            self._too_large()
        else:
            self.body.append(chunk)

    def on_message_complete(self):
        self.in_message = False
        if self.too_large:
            if self.linger:             # the refused body is all in: close once answered
                self.linger.cancel()
                self.linger = None
                self._flush()
            raise _Stop
        keep_alive = self.parser.should_keep_alive()
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self._dispatch(body, keep_alive)
        if not keep_alive:
            self.closing = True
            raise _Stop

    # -- requests and answers ------------------------------------------------------
    def _dispatch(self, body: bytes | None, keep_alive: bool) -> None:
        slot = [None, not keep_alive]
        self.answers.append(slot)
        # this message's; the parser callbacks overwrite them with the next one's
        model, version, headers, http_version = self.model, self.version, self.headers, self.http_version

        def write(a: Answer) -> None:
            slot[0] = encode(a, http_version, keep_alive)
            self._flush()

        if body is not None and len(body) <= INLINE_JSON_BYTES:     # its JSON is decoded here: no task
            self.core.answer_soon(model, version, headers, body, write)
            return

        async def read_body() -> bytes:
            if body is None:
                raise TooLarge(f"request body exceeds {self.limit} bytes")
            return body

        async def answer() -> None:     # a refused or large body (its JSON may go to the parser process)
            write(await self.core.answer(model, version, headers, read_body))

        task = asyncio.get_running_loop().create_task(answer())
        self.lane.tasks.add(task)
        task.add_done_callback(self.lane.tasks.discard)

    def _too_large(self) -> None:
        """Answer 413 at once (after the answers before it); the rest of the body is read and
        dropped, for at most LINGER_S, then the connection closes."""
        self.too_large = True
        self.closing = True
        self._dispatch(None, False)
        self.linger = asyncio.get_running_loop().call_later(LINGER_S, self._linger_over)

    def _head_too_large(self) -> None:
        """431 after the answers before it; what still arrives is dropped unparsed, for at most
        LINGER_S, then the connection closes (closing at once, with unread bytes, would reset it
        and could take the 431 from the client)."""
        self.closing = self.discarding = True
        self.linger = asyncio.get_running_loop().call_later(LINGER_S, self._linger_over)
        self._queue(error_answer(431, f"request line and headers exceed {MAX_HEAD_BYTES} bytes"), b"1.1", False)

    def _linger_over(self) -> None:
        self.linger = None
        self._flush()

    def _queue(self, a: Answer, version: bytes, keep_alive: bool) -> None:
        self.answers.append([encode(a, version, keep_alive), not keep_alive])
        self._flush()

    def _flush(self) -> None:
        """Write the answers that are ready, in request order."""
        t = self.transport
        if t is None or t.is_closing():
            return
        answers = self.answers
        while answers and answers[0][0] is not None:
            data, close = answers.popleft()
            t.write(data)
            if close:
                if self.linger is None:
                    t.close()
                else:                   # still reading the refused body: close when it ends
                    answers.appendleft([b"", True])
                return
        if not answers:
            if self.handoff is not None:
                self._to_aiohttp()
            elif self.closing and self.linger is None:
                t.close()
        self._reading()

    def finish(self) -> None:
        """Take no more requests; close once the ones taken are answered."""
        self.closing = True
        if self.linger:
            self.linger.cancel()
            self.linger = None
        self._flush()

    def _reading(self) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        pause = self.write_paused or len(self.answers) >= MAX_IN_FLIGHT or self.handoff is not None \
            or (self.closing and self.linger is None)
        if pause != self.read_paused:
            self.read_paused = pause
            (t.pause_reading if pause else t.resume_reading)()

    # -- the handoff to aiohttp ----------------------------------------------------
    def _hand_off(self) -> None:
        """The request now being parsed is not ours: from its first byte on, the
        connection is aiohttp's, once the answers before it are written."""
        if self.raw is None:            # its start is no longer known: see the module docstring
            log.warning("REST fast lane: a request pipelined past %d bytes cannot be handed off; closing", RETAIN_BYTES)
            self.finish()
            return
        raw = b"".join(self.raw)
        self.handoff = bytearray(raw[message_start(raw, self.index):] if self.index else raw)
        self.parser = None
        if not self.answers:
            self._to_aiohttp()

    def _to_aiohttp(self) -> None:
        self.lane.connections.discard(self)
        data, self.handoff = bytes(self.handoff), None
        t, self.transport = self.transport, None        # no longer ours
        handler = self.lane.runner.server()     # aiohttp's per-connection protocol
        t.set_protocol(handler)
        handler.connection_made(t)
        if self.write_paused:
            handler.pause_writing()
        if self.read_paused:            # before data_received: aiohttp may pause it again
            t.resume_reading()
        handler.data_received(data)
