"""The sans-IO connection (connection.py) on asyncio: a thin shell.

It feeds the transport's bytes to the connection with the loop's clock, hands each
stream's events to its handler, and writes what the connection has to send once per
loop turn (what a turn's answers make goes out in one transport.write). A timer
covers the connection's one time limit (an unfinished header block).

Backpressure, the two ways a peer can stop reading:
- its flow-control windows: the connection queues the data (views of the caller's bytes)
  and a writer waits in drained() until its stream's queue has gone out;
- its TCP window: once the transport's buffer is over its high-water mark
  (pause_writing) queued DATA stays queued, writers wait, and the transport stops
  reading, so that PINGs and new calls cannot make us owe it more.

The stream handler (serving/grpc/server.py's Call) is made by `new_handler(protocol,
stream, headers)` (headers None: the block was over Limits.max_header_list, and the
handler refuses the stream) or None when the new_handler answered the stream itself
(refuse()). It gets data_received(bytes), end(), reset(), and says with
credit_now(n) whether the n bytes' window comes back now or later (credit()).
On connection loss every handler is reset and let go of: nothing of a closed
connection waits for the cyclic collector.
"""
from __future__ import annotations

import asyncio
import logging
import time

from mcp26.serving.h2 import limits as _limits
from mcp26.serving.h2.connection import OUT_HIGH, H2Connection, Stream
from mcp26.serving.h2.events import (ConnectionTerminated, DataReceived, RequestReceived, StreamReset,
                                     TrailersReceived)
from mcp26.serving.h2.frames import CANCEL, ERROR_NAMES

log = logging.getLogger("mcp26.serving.h2.protocol")


class H2Protocol(asyncio.Protocol):
    """One server connection on asyncio (see the module's docstring)."""

    def __init__(self, new_handler, on_close=None, limits: _limits.Limits = _limits.DEFAULT):
        self.core = H2Connection(limits)
        self.new_handler = new_handler
        self.on_close = on_close
        self.transport = None
        # The loop, once connected: asyncio.get_running_loop() is a getpid() system call a time
        # on Python 3.11, and each write and each call would ask.
        self.loop: asyncio.AbstractEventLoop | None = None
        self.peer = ""
        self.flush_scheduled = False
        self.write_paused = False           # the transport's buffer is over its high-water mark
        self.closed = False
        self.timer: asyncio.TimerHandle | None = None
        self.waiting: dict[int, tuple[Stream, asyncio.Future]] = {}   # writers in drained()
        self.user = None                    # the caller's own state for this connection

    @property
    def streams(self) -> dict[int, Stream]:
        return self.core.streams

    # -- asyncio.Protocol --------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.loop = asyncio.get_running_loop()
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"ipv6:[{peer[0]}]:{peer[1]}" if ":" in peer[0] else f"ipv4:{peer[0]}:{peer[1]}"
        self.core.initiate()
        transport.write(self.core.data_to_send())

    def data_received(self, data: bytes) -> None:
        core = self.core
        for ev in core.receive(data, time.monotonic()):
            kind = type(ev)
            if kind is DataReceived:
                st = ev.stream
                h = st.user
                if h is None:                   # answered without a handler: its body is dropped
                    if not ev.end_stream:
                        core.credit(st, ev.flow_length)
                    continue
                if ev.flow_length and not ev.end_stream and h.credit_now(ev.flow_length):
                    core.credit(st, ev.flow_length)
                if ev.data:
                    h.data_received(ev.data)
                if ev.end_stream:
                    h.end()
            elif kind is RequestReceived:
                st = ev.stream
                st.user = h = self.new_handler(self, st, ev.headers)
                if h is not None and ev.end_stream:
                    h.end()
            elif kind is TrailersReceived:
                if ev.stream.user is not None:
                    ev.stream.user.end()
            elif kind is StreamReset:
                h, ev.stream.user = ev.stream.user, None
                if h is not None:
                    h.reset()
            elif kind is ConnectionTerminated:
                log.debug("HTTP/2 %s: %s %s", self.peer, ERROR_NAMES[ev.code], ev.why)
                self.transport.pause_reading()
        if core.block is not None and self.timer is None:
            self.timer = self.loop.call_later(core.next_deadline() - time.monotonic(), self._tick)
        if core.out or core.ready:      # else nothing to write yet: a unary call's answer comes later
            self._schedule()

    def _tick(self) -> None:
        self.timer = None
        if self.core.tick(time.monotonic()):
            self._flush()
        elif self.core.block is not None:
            self.timer = self.loop.call_later(self.core.next_deadline() - time.monotonic(), self._tick)

    def pause_writing(self) -> None:
        """The peer is not reading what we send: stop reading what it sends (PINGs, new
        calls), so that what we owe it cannot grow without bound; writers wait (drained())."""
        self.write_paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.transport is not None and not self.closed and not self.core.terminated:
            self.transport.resume_reading()
        self._flush()

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self._wake_all()
        streams = list(self.core.streams.values())
        self.core.streams.clear()
        self.core.ready.clear()
        self.core.stalled.clear()
        self.core.events = []
        for st in streams:
            h, st.user = st.user, None
            st.queue.clear()
            if h is not None:
                h.reset()
        if self.on_close:
            self.on_close(self)

    # -- the handlers' calls -------------------------------------------------

    def send_headers(self, st: Stream, block: bytes, end_stream: bool = False) -> None:
        self.core.send_headers(st, block, end_stream)
        self._schedule()

    def send_answer(self, st: Stream, headers: bytes, data: bytes, trailers: bytes) -> None:
        self.core.send_answer(st, headers, data, trailers)
        self._schedule()

    def send_data(self, st: Stream, data) -> None:
        self.core.send_data(st, data)
        self._schedule()

    def send_trailers(self, st: Stream, block: bytes) -> None:
        self.core.send_trailers(st, block)
        self._schedule()

    def refuse(self, st: Stream, block: bytes, body: bytes = b"") -> None:
        """An answer without a handler (connection.H2Connection.refuse)."""
        self.core.refuse(st, block, body)
        self._schedule()

    def credit(self, st: Stream, n: int) -> None:
        """Give `n` bytes of the stream's window back (what its handler held, now read)."""
        if not self.closed:
            self.core.credit(st, n)
            self._schedule()

    def reset(self, st: Stream, code: int = CANCEL) -> None:
        """Ends the stream with RST_STREAM; its handler is told, as when the peer resets it."""
        self.core.reset_stream(st, code)
        st.local_closed = st.remote_closed = True
        h, st.user = st.user, None
        if h is not None:
            h.reset()
        self._schedule()

    def go_away(self) -> None:
        """No new streams; close once those open have finished."""
        if not self.closed:
            self.core.go_away()
            self._flush()

    # -- writing -----------------------------------------------------------------

    def _schedule(self) -> None:
        if not self.flush_scheduled:
            self.flush_scheduled = True
            (self.loop or asyncio.get_running_loop()).call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        if self.closed or self.transport is None:
            return
        core = self.core
        data = core.data_to_send(0 if self.write_paused else OUT_HIGH)
        if data:
            self.transport.write(data)          # may call pause_writing
        if core.terminated or core.idle_after_goaway:
            self.transport.close()
            return
        if not self.write_paused and core.has_ready_data():
            self._schedule()                    # more queued DATA the windows let go: next turn
        if self.waiting:
            self._wake_all()

    # -- a writer's backpressure -----------------------------------------------------

    def drained(self, st: Stream) -> asyncio.Future | None:
        """None when what `st` sent has left for the transport and the transport takes more;
        else a future that resolves once it has (or the stream or connection is over).

        Without it a streaming writer never waits: a 5 MB message to a peer that reads
        slowly (or a push to a thousand) piles up here, unbounded.
        """
        if self._is_drained(st):
            return None
        fut = (self.loop or asyncio.get_running_loop()).create_future()
        self.waiting[st.id] = (st, fut)
        return fut

    def _is_drained(self, st: Stream) -> bool:
        return st.local_closed or self.closed or not (st.queue or self.write_paused)

    def _wake_all(self) -> None:
        for sid, (st, fut) in list(self.waiting.items()):
            if self._is_drained(st):
                del self.waiting[sid]
                if not fut.done():
                    fut.set_result(None)
