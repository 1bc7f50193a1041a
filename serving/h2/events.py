"""What the sans-IO connection (connection.py) reports from the bytes it was given.

`stream` is the connection's Stream; its `user` slot is the caller's (the asyncio
shell keeps the stream's handler there). Classes with __slots__, not dataclasses:
the server makes two or three of these per gRPC call.
"""
from __future__ import annotations


class RequestReceived:
    """A request's header block opened `stream`. `headers` is None when the block was over
    the decoded-size limit (Limits.max_header_list): the caller refuses that request."""
    __slots__ = ("stream", "headers", "end_stream")

    def __init__(self, stream, headers, end_stream: bool):
        self.stream, self.headers, self.end_stream = stream, headers, end_stream


class DataReceived:
    """Request body bytes. `flow_length` (padding included) is what the stream's window lost:
    the caller gives it back with H2Connection.credit once it can take more."""
    __slots__ = ("stream", "data", "flow_length", "end_stream")

    def __init__(self, stream, data: bytes, flow_length: int, end_stream: bool):
        self.stream, self.data, self.flow_length, self.end_stream = stream, data, flow_length, end_stream


class TrailersReceived:
    """The request's trailers: its stream's end."""
    __slots__ = ("stream", "headers")

    def __init__(self, stream, headers):
        self.stream, self.headers = stream, headers


class StreamReset:
    """`stream` ended without an answer: the client reset it (`by_peer`) or the connection
    did, for what the client sent on it (`code`, RFC 9113 §7)."""
    __slots__ = ("stream", "code", "by_peer")

    def __init__(self, stream, code: int, by_peer: bool):
        self.stream, self.code, self.by_peer = stream, code, by_peer


class GoAwayReceived:
    """The client takes no more answers past `last_stream` and opens no new streams."""
    __slots__ = ("code", "last_stream")

    def __init__(self, code: int, last_stream: int):
        self.code, self.last_stream = code, last_stream


class ConnectionTerminated:
    """A connection error (RFC 9113 §5.4.1): GOAWAY with `code` is queued; send it and close."""
    __slots__ = ("code", "why")

    def __init__(self, code: int, why: str):
        self.code, self.why = code, why
