"""A small gRPC-Web client (no browser) for tests: framing, unary, server-streaming.

gRPC-Web (github.com/grpc/grpc/blob/master/doc/PROTOCOL-WEB.md) keeps gRPC's
length-prefixed messages, `flags(1) | length(4, big-endian) | payload`, and
moves the trailers into the body as one last frame whose flags have the MSB
(0x80) set and whose payload is HTTP/1-style `name: value\\r\\n` lines. A
"trailers-only" reply (an error before any message) carries grpc-status in
the response headers instead. The `-text` variant base64-encodes the body;
a server may send it as several separately padded base64 chunks.

Every call has a socket timeout, so a peer that never answers fails the test
with TimeoutError instead of hanging it.
"""
from __future__ import annotations

import base64
import http.client
import struct
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Iterable, Iterator

GRPC_WEB = "application/grpc-web+proto"
GRPC_WEB_TEXT = "application/grpc-web-text+proto"

TRAILER_FLAG = 0x80
COMPRESSED_FLAG = 0x01
_HEADER = struct.Struct(">BI")


class FramingError(ValueError):
    """The byte stream is not valid gRPC-Web framing."""


def encode_frame(payload: bytes, flags: int = 0) -> bytes:
    return _HEADER.pack(flags, len(payload)) + payload


def encode_trailers(trailers: dict[str, str]) -> bytes:
    block = "".join(f"{k}: {v}\r\n" for k, v in trailers.items()).encode()
    return encode_frame(block, TRAILER_FLAG)


@dataclass(frozen=True)
class Frame:
    flags: int
    payload: bytes

    @property
    def is_trailers(self) -> bool:
        return bool(self.flags & TRAILER_FLAG)


class FrameDecoder:
    """Incremental: feed() any slice of the body, get the frames it completes."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        self._buf += data
        frames = []
        while len(self._buf) >= _HEADER.size:
            flags, length = _HEADER.unpack_from(self._buf)
            if flags & ~(TRAILER_FLAG | COMPRESSED_FLAG):
                raise FramingError(f"reserved flag bits set in frame header: 0x{flags:02x}")
            if len(self._buf) < _HEADER.size + length:
                break
            frames.append(Frame(flags, bytes(self._buf[_HEADER.size:_HEADER.size + length])))
            del self._buf[:_HEADER.size + length]
        return frames

    def close(self) -> None:
        """At end of body: anything left over is a truncated frame."""
        if self._buf:
            raise FramingError(f"body ends inside a frame ({len(self._buf)} bytes left over)")


class TextDecoder:
    """Base64 for grpc-web-text, tolerating chunks that each end in padding."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> bytes:
        self._buf += b"".join(data.split())  # whitespace is not part of the alphabet
        out = bytearray()
        while len(self._buf) >= 4:
            # A padded quantum ends a chunk; decode up to and including it.
            pad = self._buf.find(b"=")
            end = len(self._buf) - len(self._buf) % 4 if pad < 0 else (pad // 4 + 1) * 4
            if end > len(self._buf):
                break
            try:
                out += base64.b64decode(self._buf[:end], validate=True)
            except ValueError as e:
                raise FramingError(f"invalid base64 in grpc-web-text body: {e}") from None
            self._buf = self._buf[end:]
        return bytes(out)

    def close(self) -> None:
        if self._buf:
            raise FramingError(f"grpc-web-text body ends with {len(self._buf)} stray base64 characters")


def parse_trailers(block: bytes) -> dict[str, str]:
    out = {}
    for line in block.decode("latin-1").split("\r\n"):
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise FramingError(f"trailer line without ':': {line!r}")
        out[name.strip().lower()] = value.strip()
    return out


@dataclass
class Result:
    http_status: int
    headers: dict[str, str]
    messages: list[bytes] = field(default_factory=list)
    trailers: dict[str, str] = field(default_factory=dict)
    arrivals: list[float] = field(default_factory=list)  # monotonic time of each message

    @property
    def status(self) -> int | None:
        """grpc-status from the trailer frame, or from the headers (trailers-only)."""
        raw = self.trailers.get("grpc-status", self.headers.get("grpc-status"))
        return int(raw) if raw is not None else None

    @property
    def message(self) -> str:
        raw = self.trailers.get("grpc-message", self.headers.get("grpc-message", ""))
        return urllib.parse.unquote(raw)  # grpc-message is percent-encoded

    @property
    def trailers_only(self) -> bool:
        return "grpc-status" in self.headers and not self.trailers


class GrpcWebClient:
    """HTTP/1.1 to a gRPC-Web endpoint (Envoy's grpc_web filter), as browsers speak it."""

    def __init__(self, host: str, port: int, timeout: float = 10.0, text: bool = False):
        self.host, self.port, self.timeout, self.text = host, port, timeout, text

    def _headers(self, metadata: dict[str, str] | None) -> dict[str, str]:
        h = {"content-type": GRPC_WEB_TEXT if self.text else GRPC_WEB,
             "accept": GRPC_WEB_TEXT if self.text else GRPC_WEB,
             "x-grpc-web": "1", "x-user-agent": "mcp-mesh-tests/grpcweb"}
        h.update(metadata or {})
        return h

    def body(self, messages: Iterable[bytes]) -> bytes:
        raw = b"".join(encode_frame(m) for m in messages)
        return base64.b64encode(raw) if self.text else raw

    def stream(self, path: str, messages: Iterable[bytes] = (), metadata: dict[str, str] | None = None,
               raw_body: bytes | None = None) -> Iterator[bytes | Result]:
        """Yields each response message as it arrives, then the final Result."""
        body = raw_body if raw_body is not None else self.body(messages)
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request("POST", path, body=body, headers=self._headers(metadata))
            resp = conn.getresponse()
            result = Result(resp.status, {k.lower(): v for k, v in resp.getheaders()})
            ctype = result.headers.get("content-type", "")
            if not ctype.startswith("application/grpc-web"):
                # e.g. an HTTP error page: keep the body readable for the assertion message.
                result.trailers["x-body"] = resp.read().decode("utf-8", "replace")
                yield result
                return
            text = TextDecoder() if ctype.startswith(GRPC_WEB_TEXT.split("+")[0]) else None
            frames = FrameDecoder()
            while True:
                chunk = resp.read1(65536)
                if not chunk:
                    break
                data = text.feed(chunk) if text else chunk
                for frame in frames.feed(data):
                    if frame.is_trailers:
                        result.trailers.update(parse_trailers(frame.payload))
                    else:
                        result.messages.append(frame.payload)
                        result.arrivals.append(time.monotonic())
                        yield frame.payload
            if text:
                text.close()
            frames.close()
            yield result
        finally:
            conn.close()

    def call(self, path: str, messages: Iterable[bytes] = (), metadata: dict[str, str] | None = None,
             raw_body: bytes | None = None) -> Result:
        """The whole exchange: every message, then trailers (unary or streaming)."""
        *_, result = self.stream(path, messages, metadata, raw_body)
        return result

    def unary(self, path: str, request: bytes, metadata: dict[str, str] | None = None) -> Result:
        return self.call(path, [request], metadata)

    def preflight(self, path: str, origin: str, request_headers: str) -> tuple[int, dict[str, str]]:
        """A browser's CORS preflight for a gRPC-Web POST."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request("OPTIONS", path, headers={
                "origin": origin, "access-control-request-method": "POST",
                "access-control-request-headers": request_headers})
            resp = conn.getresponse()
            resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}
        finally:
            conn.close()
