"""HTTP/2 frames (RFC 9113 §4, §6): the numbers, building a frame, splitting bytes into frames.

One codec for both ends: the server's connection (connection.py) and mcp-bench's
client (inference-backend/bench/h2_grpc.py). Frames are (type, flags, stream,
payload) tuples, not python-hyper/hyperframe's objects: parsing a gRPC call's
HEADERS and DATA frames took hyperframe 4.4 µs a frame here, split() 0.7 µs
(load average ~6), and the server reads two or three frames per call.
"""
from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# frame types (§6)
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
# flags
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
# error codes (§7)
(NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, SETTINGS_TIMEOUT, STREAM_CLOSED,
 FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, CONNECT_ERROR, ENHANCE_YOUR_CALM) = range(12)
ERROR_NAMES = ("NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR", "SETTINGS_TIMEOUT",
               "STREAM_CLOSED", "FRAME_SIZE_ERROR", "REFUSED_STREAM", "CANCEL", "COMPRESSION_ERROR",
               "CONNECT_ERROR", "ENHANCE_YOUR_CALM", "INADEQUATE_SECURITY", "HTTP_1_1_REQUIRED")
# settings (§6.5.2)
S_HEADER_TABLE_SIZE, S_ENABLE_PUSH, S_MAX_CONCURRENT_STREAMS, S_INITIAL_WINDOW_SIZE, S_MAX_FRAME_SIZE, \
    S_MAX_HEADER_LIST_SIZE = range(1, 7)

MAX_WINDOW = (1 << 31) - 1
DEFAULT_WINDOW = 65535
DEFAULT_FRAME = 16384
MAX_FRAME_LIMIT = (1 << 24) - 1

U32 = struct.Struct(">I")
SETTING = struct.Struct(">HI")
_HEAD = struct.Struct(">I")         # a frame header's length (24 bits) and type, read together


class ProtocolError(Exception):
    """A connection error (§5.4.1): GOAWAY with `code`, then close."""

    def __init__(self, code: int, why: str):
        super().__init__(why)
        self.code = code


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return bytes((n >> 16, (n >> 8) & 255, n & 255, kind, flags)) + U32.pack(stream) + payload


def frame_header(kind: int, flags: int, stream: int, length: int) -> bytes:
    """A frame's 9 bytes alone (its payload written after it, not copied into it)."""
    return bytes((length >> 16, (length >> 8) & 255, length & 255, kind, flags)) + U32.pack(stream)


def settings(*pairs: tuple[int, int]) -> bytes:
    """A SETTINGS frame's payload."""
    return b"".join(SETTING.pack(k, v) for k, v in pairs)


def goaway(last_stream: int, code: int, why: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, U32.pack(last_stream) + U32.pack(code) + why)


def split(buf, max_size: int) -> tuple[list, int]:
    """The whole frames at the start of `buf` as (type, flags, stream, payload) and how many
    bytes they took; ProtocolError(FRAME_SIZE_ERROR) at a frame longer than `max_size` (its
    header alone is enough to know)."""
    out = []
    append, head_at, u32_at = out.append, _HEAD.unpack_from, U32.unpack_from
    copy = type(buf) is not bytes           # a bytearray's slices are views to copy; bytes' are bytes
    i, n = 0, len(buf)
    while n - i >= 9:
        head = head_at(buf, i)[0]
        length = head >> 8
        if length > max_size:
            raise ProtocolError(FRAME_SIZE_ERROR, f"frame of {length} bytes over {max_size}")
        end = i + 9 + length
        if end > n:
            break
        payload = buf[i + 9:end]
        append((head & 0xFF, buf[i + 4], u32_at(buf, i + 5)[0] & 0x7FFFFFFF, bytes(payload) if copy else payload))
        i = end
    return out, i


def unpad(payload: bytes) -> bytes:
    """A PADDED frame's payload less its pad-length octet and the padding (§6.1)."""
    if not payload or payload[0] >= len(payload):
        raise ProtocolError(PROTOCOL_ERROR, "padding as long as the frame")
    return payload[1:len(payload) - payload[0]]


def header_fragment(flags: int, payload: bytes) -> tuple[bytes, int | None]:
    """A HEADERS frame's block fragment, less its padding and PRIORITY fields (§6.2), and the
    stream it says it depends on (None without the PRIORITY flag)."""
    if flags & PADDED:
        payload = unpad(payload)
    if flags & PRIORITY_FLAG:
        if len(payload) < 5:
            raise ProtocolError(FRAME_SIZE_ERROR, "HEADERS too short for its priority fields")
        return payload[5:], U32.unpack_from(payload)[0] & 0x7FFFFFFF
    return payload, None
