"""A minimal HTTP/1.1 keep-alive client on asyncio.Protocol.

One connection carries one request at a time (no pipelining). Requests are
pre-encoded bytes, written with one `transport.write`; the response is parsed
just enough to find its end (Content-Length or chunked) and the server-timing
headers. No coroutine per request: completion is a plain callback, which on
two cores is what lets a Python generator outrun the server it measures.
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable

from mcp26.inference.bench import errors
from mcp26.mesh.headers import COMPUTE_TIME_US, QUEUE_TIME_US

# on_done(status or None, error label or None, queue_us, compute_us, body)
Done = Callable[[int | None, str | None, float | None, float | None, bytes], None]

_QUEUE = QUEUE_TIME_US.encode()
_COMPUTE = COMPUTE_TIME_US.encode()


def encode_request(method: str, path: str, host: str, headers: dict[str, str],
                   body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class _Response:
    __slots__ = ("status", "length", "chunked", "close", "queue_us", "compute_us")


def _parse_head(head: bytes) -> _Response:
    r = _Response()
    if not head.startswith(b"HTTP/1.") or len(head) < 12:
        raise ValueError("not an HTTP/1.x status line")
    r.status = int(head[9:12])
    r.length, r.chunked, r.close = None, False, head[7:8] == b"0"
    r.queue_us = r.compute_us = None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            r.length = int(value)
        elif name == b"transfer-encoding":
            r.chunked = b"chunked" in value.lower()
        elif name == b"connection":
            v = value.strip().lower()
            r.close = v == b"close" if v in (b"close", b"keep-alive") else r.close
        elif name == _QUEUE:
            r.queue_us = float(value)
        elif name == _COMPUTE:
            r.compute_us = float(value)
    if r.length is None and not r.chunked and (r.status in (204, 304) or r.status < 200):
        r.length = 0
    return r


class _Wire(asyncio.Protocol):
    """One TCP connection's callbacks. Kept apart from Http1Connection so a
    late callback of a connection already dropped (a timeout) cannot touch
    the request the next connection carries."""

    def __init__(self, owner: "Http1Connection"):
        self.owner = owner

    def data_received(self, data: bytes) -> None:
        if self.owner.wire is self:
            self.owner.data_received(data)

    def connection_lost(self, exc) -> None:
        if self.owner.wire is self:
            self.owner.connection_lost(exc)


class Http1Connection:
    """One keep-alive connection; `request()` may be called when `idle`."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.transport: asyncio.Transport | None = None
        self.wire: _Wire | None = None
        self.buf = bytearray()
        self.resp: _Response | None = None
        self.on_done: Done | None = None
        self.started = 0.0          # perf_counter of the request in flight
        self.connecting = False

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.on_done is not None:
            try:
                self._parse()
            except (ValueError, IndexError):
                self._finish(None, errors.PROTOCOL, None, None, b"")
                self._drop()

    def connection_lost(self, exc) -> None:
        self.transport = self.wire = None
        if self.on_done is not None:
            self._finish(None, errors.CLOSED, None, None, b"")

    # -- client ----------------------------------------------------------
    @property
    def connected(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    async def connect(self, timeout: float = 5.0) -> None:
        loop = asyncio.get_running_loop()
        self.connecting = True
        wire = _Wire(self)
        try:
            transport, _ = await asyncio.wait_for(
                loop.create_connection(lambda: wire, self.host, self.port), timeout)
            self.transport, self.wire = transport, wire
        finally:
            self.connecting = False

    def request(self, payload: bytes, on_done: Done) -> None:
        """Send one pre-encoded request; `on_done` runs when it ends."""
        self.on_done = on_done
        self.resp = None
        self.buf.clear()
        self.started = time.perf_counter()
        if not self.connected:
            asyncio.get_running_loop().create_task(self._connect_then_send(payload))
            return
        self.transport.write(payload)

    async def _connect_then_send(self, payload: bytes) -> None:
        try:
            await self.connect()
        except (OSError, asyncio.TimeoutError):
            await asyncio.sleep(0.01)   # a dead target must not turn into a busy loop
            self._finish(None, errors.CONNECT, None, None, b"")
            return
        self.transport.write(payload)

    def abort(self, label: str) -> None:
        """End the request in flight with `label` (used for --timeout)."""
        if self.on_done is not None:
            self._finish(None, label, None, None, b"")
        self._drop()

    def close(self) -> None:
        self._drop()

    # -- internals -------------------------------------------------------
    def _drop(self) -> None:
        transport, self.transport, self.wire = self.transport, None, None
        if transport is not None:
            transport.abort()

    def _finish(self, status, label, queue_us, compute_us, body) -> None:
        cb, self.on_done = self.on_done, None
        cb(status, label, queue_us, compute_us, body)

    def _parse(self) -> None:
        buf = self.buf
        r = self.resp
        if r is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            r = self.resp = _parse_head(bytes(buf[:end]))
            del buf[:end + 4]
        if r.chunked:
            body = self._dechunk()
            if body is None:
                return
        else:
            if r.length is None:
                raise ValueError("response without length (read-until-close is not supported)")
            if len(buf) < r.length:
                return
            body = bytes(buf[:r.length])
            del buf[:r.length]
        close = r.close
        self._finish(r.status, errors.http_error(r.status), r.queue_us, r.compute_us, body)
        if close:
            self._drop()

    def _dechunk(self) -> bytes | None:
        """The whole body once every chunk (and the last, empty one) is in."""
        buf, pos, parts = self.buf, 0, []
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                return None
            size = int(bytes(buf[pos:eol]).split(b";")[0], 16)
            start = eol + 2
            if size == 0:
                trailer_end = buf.find(b"\r\n\r\n", eol)
                if trailer_end < 0:
                    return None
                del buf[:trailer_end + 4]
                return b"".join(parts)
            if len(buf) < start + size + 2:
                return None
            parts.append(bytes(buf[start:start + size]))
            pos = start + size + 2
