"""serving.h2.connection on bytes, no sockets: the frame and stream-state rules of RFC 9113
(the cases h2spec checks, and those the lane's socket tests checked), flow control both ways,
and what a request's header block must be (§8.1-8.3). Each case feeds the client's bytes
and reads the frames the server answers with."""
from __future__ import annotations

import dataclasses
import struct

import pytest
from h2_peer import Peer, grpc_message, request

from mcp26.serving.h2 import limits as h2_limits
from mcp26.serving.h2.connection import H2Connection, Stream
from mcp26.serving.h2.events import DataReceived, RequestReceived, StreamReset, TrailersReceived
from mcp26.serving.h2.frames import (ACK, COMPRESSION_ERROR, CONTINUATION, DATA, END_HEADERS, END_STREAM,
                                     ENHANCE_YOUR_CALM, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, GOAWAY, HEADERS,
                                     NO_ERROR, PADDED, PING, PREFACE, PRIORITY, PRIORITY_FLAG, PROTOCOL_ERROR,
                                     REFUSED_STREAM, RST_STREAM, SETTINGS, STREAM_CLOSED, WINDOW_UPDATE, frame,
                                     split)

U32 = struct.Struct(">I")


def opened(p: Peer) -> list:
    return [e.stream for e in p.events if type(e) is RequestReceived]


def answer(p: Peer, st: Stream, body: bytes = b"ok") -> None:
    p.conn.send_answer(st, b"\x88", grpc_message(body), b"\x00\x0bgrpc-status\x010")
    p.read()


# -- the preface, frames, the connection's errors ------------------------------------------


@pytest.mark.parametrize("payload", [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n",
                                     b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40])
def test_bad_preface_goaway(payload):
    p = Peer(preface=False)
    p.send(payload)
    assert p.goaway()[0] == PROTOCOL_ERROR and p.terminated()


def test_preface_then_something_else_than_settings_goaway():
    p = Peer(preface=False)
    p.send(PREFACE + frame(PING, 0, 0, b"12345678"))
    assert p.goaway()[0] == PROTOCOL_ERROR


def test_preface_in_pieces_is_read():
    p = Peer(preface=False)
    for i in range(0, len(PREFACE), 5):
        p.send(PREFACE[i:i + 5])
    p.send(frame(SETTINGS, 0, 0) + frame(PING, 0, 0, b"abcdefgh"))
    assert p.of(PING) == [(PING, ACK, 0, b"abcdefgh")] and p.goaway() is None


def test_frame_over_16384_goaway_from_its_header_alone():
    p = Peer()
    p.send(struct.pack(">BHBBI", 0, 16385, DATA, 0, 1))
    assert p.goaway()[0] == FRAME_SIZE_ERROR


def test_nothing_is_read_after_a_connection_error():
    p = Peer()
    p.send(frame(DATA, 0, 0, b"x") + p.headers(1, request(), end_stream=True))
    assert p.goaway()[0] == PROTOCOL_ERROR and not opened(p)
    assert p.send(p.headers(3, request(), end_stream=True)) == []


@pytest.mark.parametrize("bad, code", [
    (frame(DATA, 0, 0, b"x"), PROTOCOL_ERROR),                               # DATA on stream 0
    (frame(HEADERS, END_HEADERS, 0, b"\x83"), PROTOCOL_ERROR),               # HEADERS on stream 0
    (frame(PRIORITY, 0, 0, b"\x00\x00\x00\x01\x10"), PROTOCOL_ERROR),        # PRIORITY on stream 0
    (frame(RST_STREAM, 0, 0, U32.pack(8)), PROTOCOL_ERROR),                  # RST_STREAM on stream 0
    (frame(RST_STREAM, 0, 1, b"\x00\x00\x08"), FRAME_SIZE_ERROR),
    (frame(RST_STREAM, 0, 1, U32.pack(8)), PROTOCOL_ERROR),                  # on an idle stream
    (frame(WINDOW_UPDATE, 0, 1, U32.pack(1)), PROTOCOL_ERROR),               # on an idle stream
    (frame(DATA, 0, 1, b"x"), PROTOCOL_ERROR),                               # on an idle stream
    (frame(WINDOW_UPDATE, 0, 0, b"\x00\x00\x01"), FRAME_SIZE_ERROR),
    (frame(WINDOW_UPDATE, 0, 0, U32.pack(0)), PROTOCOL_ERROR),
    (frame(WINDOW_UPDATE, 0, 0, U32.pack(0x7FFFFFFF)), FLOW_CONTROL_ERROR),  # 65,535 + 2^31-1
    (frame(PING, 0, 1, b"12345678"), PROTOCOL_ERROR),
    (frame(PING, 0, 0, b"1234567"), FRAME_SIZE_ERROR),
    (frame(SETTINGS, 0, 1), PROTOCOL_ERROR),
    (frame(SETTINGS, 0, 0, b"\x00\x04\x00"), FRAME_SIZE_ERROR),
    (frame(SETTINGS, ACK, 0, b"\x00\x04\x00\x00\x00\x01"), FRAME_SIZE_ERROR),  # an ACK with a payload
    (frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 1 << 31)), FLOW_CONTROL_ERROR),
    (frame(SETTINGS, 0, 0, struct.pack(">HI", 5, 16383)), PROTOCOL_ERROR),
    (frame(SETTINGS, 0, 0, struct.pack(">HI", 5, 1 << 24)), PROTOCOL_ERROR),
    (frame(SETTINGS, 0, 0, struct.pack(">HI", 2, 2)), PROTOCOL_ERROR),
    (frame(5, END_HEADERS, 1, b"\x00\x00\x00\x02\x83"), PROTOCOL_ERROR),    # PUSH_PROMISE from a client
    (frame(CONTINUATION, END_HEADERS, 1, b"\x83"), PROTOCOL_ERROR),          # no HEADERS before it
    (frame(GOAWAY, 0, 1, b"\x00" * 8), PROTOCOL_ERROR),
    (frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\xff\x49"), COMPRESSION_ERROR),   # index 200, empty table
    (frame(HEADERS, END_HEADERS | PADDED, 1, b"\x05\x83"), PROTOCOL_ERROR),  # padding past the frame
])
def test_connection_errors(bad, code):
    p = Peer()
    p.send(bad)
    assert p.goaway() is not None and p.goaway()[0] == code, p.goaway()
    assert p.terminated() and p.conn.data_to_send() == b""


def test_interrupted_header_block_and_even_stream_goaway():
    p = Peer()
    p.send(frame(HEADERS, 0, 1, p.block(request())) + frame(PING, 0, 0, b"12345678"))
    assert p.goaway()[0] == PROTOCOL_ERROR
    p = Peer()
    p.send(p.headers(2, request(), end_stream=True))
    assert p.goaway()[0] == PROTOCOL_ERROR


def test_continuation_of_another_stream_goaway():
    p = Peer()
    block = p.block(request())
    p.send(frame(HEADERS, 0, 1, block[:3]) + frame(CONTINUATION, END_HEADERS, 3, block[3:]))
    assert p.goaway()[0] == PROTOCOL_ERROR


def test_header_block_in_continuations_opens_the_stream():
    p = Peer()
    block = p.block(request())
    p.send(frame(HEADERS, END_STREAM, 1, block[:2]) + frame(CONTINUATION, 0, 1, block[2:5])
           + frame(CONTINUATION, END_HEADERS, 1, block[5:]))     # END_STREAM is the HEADERS frame's
    (ev,) = [e for e in p.events if type(e) is RequestReceived]
    assert ev.end_stream and dict(ev.headers)[b":path"] == b"/t.S/Echo"


def test_padded_data_and_priority_headers_and_ping():
    p = Peer()
    block = p.block(request())
    pad = 7
    msg = grpc_message(b"padded!")
    p.send(frame(HEADERS, END_HEADERS | PADDED | PRIORITY_FLAG, 1, bytes([pad]) + struct.pack(">IB", 0, 15) + block
                 + b"\x00" * pad)
           + frame(PRIORITY, 0, 1, struct.pack(">IB", 0, 3))
           + frame(DATA, PADDED, 1, bytes([3]) + msg[:4] + b"\x00" * 3)
           + frame(DATA, END_STREAM | PADDED, 1, bytes([0]) + msg[4:])
           + frame(PING, 0, 0, b"12345678"))
    data = [e for e in p.events if type(e) is DataReceived]
    assert b"".join(e.data for e in data) == msg and [e.end_stream for e in data] == [False, True]
    assert [e.flow_length for e in data] == [1 + 4 + 3, 1 + len(msg) - 4]     # padding counts against windows
    assert p.of(PING) == [(PING, ACK, 0, b"12345678")] and p.goaway() is None


def test_unknown_frame_types_and_flags_are_ignored():
    p = Peer()
    p.send(frame(0x42, 0xFF, 0, b"whatever") + frame(PING, 0x10, 0, b"12345678"))
    assert p.goaway() is None and len(p.of(PING)) == 1


def test_header_block_over_64k_goaway():
    p = Peer()
    block = p.block(request()) + b"\x00" * (80 << 10)
    chunks = [block[i:i + 16384] for i in range(0, len(block), 16384)]
    p.send(frame(HEADERS, 0, 1, chunks[0]) + b"".join(frame(CONTINUATION, 0, 1, c) for c in chunks[1:]))
    assert p.goaway()[0] == ENHANCE_YOUR_CALM


def test_hpack_table_size_update_only_at_the_start_of_a_block():
    p = Peer()
    p.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x20" + p.block(request())))   # at the start: fine
    assert len(opened(p)) == 1 and p.goaway() is None
    p.send(frame(HEADERS, END_HEADERS | END_STREAM, 3, p.block(request()) + b"\x20"))
    assert p.goaway()[0] == COMPRESSION_ERROR


# -- stream states (§5.1) -------------------------------------------------------------------


def test_headers_below_the_last_stream_is_a_protocol_error_not_late_trailers():
    """It was taken for late trailers and dropped: that client's call hung with no error."""
    p = Peer()
    p.send(p.headers(5, request(), end_stream=True))
    p.send(p.headers(3, request(), end_stream=True))
    assert p.goaway()[0] == PROTOCOL_ERROR and len(opened(p)) == 1


def test_data_on_a_half_closed_remote_stream_is_stream_closed():
    p = Peer()
    p.send(p.headers(1, request()) + frame(DATA, END_STREAM, 1, grpc_message(b"a")))
    p.send(frame(DATA, 0, 1, b"more"))
    assert p.resets() == {1: STREAM_CLOSED} and p.goaway() is None
    assert [type(e) for e in p.events][-1] is StreamReset


def test_data_and_headers_after_both_ends_closed_are_stream_closed_for_the_connection():
    for late in (frame(DATA, 0, 1, b"x"), "headers"):
        p = Peer()
        p.send(p.headers(1, request()) + frame(DATA, END_STREAM, 1, grpc_message(b"a")))
        answer(p, opened(p)[0])
        p.send(p.headers(1, request(), end_stream=True) if late == "headers" else late)
        assert p.goaway()[0] == STREAM_CLOSED


def test_window_update_rst_and_priority_after_both_ends_closed_are_fine():
    p = Peer()
    p.send(p.headers(1, request(), end_stream=True))
    answer(p, opened(p)[0])
    p.send(frame(WINDOW_UPDATE, 0, 1, U32.pack(10)) + frame(PRIORITY, 0, 1, struct.pack(">IB", 0, 1))
           + frame(RST_STREAM, 0, 1, U32.pack(0)))
    assert p.goaway() is None and p.resets() == {}


def test_frames_after_the_clients_rst_stream_are_stream_closed():
    p = Peer()
    p.send(p.headers(1, request()) + frame(RST_STREAM, 0, 1, U32.pack(8)))
    assert [type(e) for e in p.events] == [RequestReceived, StreamReset]
    p.send(frame(DATA, 0, 1, b"x"))
    assert p.resets() == {1: STREAM_CLOSED}
    p.send(frame(RST_STREAM, 0, 1, U32.pack(8)) + frame(PRIORITY, 0, 1, struct.pack(">IB", 0, 1)))
    assert p.resets() == {1: STREAM_CLOSED} and len(p.of(RST_STREAM)) == 1      # never a reset for a reset


def test_what_was_in_flight_when_we_reset_a_stream_is_dropped():
    p = Peer()
    p.send(p.headers(1, request()))
    p.conn.reset_stream(opened(p)[0], 8)
    p.read()
    p.send(frame(DATA, 0, 1, b"in flight") + frame(WINDOW_UPDATE, 0, 1, U32.pack(5))
           + frame(HEADERS, END_HEADERS | END_STREAM, 1, p.block([("grpc-status", "0")])))
    assert p.goaway() is None and p.resets() == {1: 8}


def test_no_reset_after_answering_a_request_already_complete():
    """The END_STREAM of a request is recorded as it comes, before its handler runs: the answer
    to a complete request is not followed by a gratuitous RST_STREAM(NO_ERROR)."""
    p = Peer()
    p.send(p.headers(1, request()) + frame(DATA, END_STREAM, 1, grpc_message(b"a")))
    answer(p, opened(p)[0])
    assert p.resets() == {} and 1 not in p.conn.streams


def test_an_answer_before_the_request_ends_stops_its_upload_with_no_error():
    p = Peer()
    p.send(p.headers(1, request()) + frame(DATA, 0, 1, b"part"))
    answer(p, opened(p)[0])
    assert p.resets() == {1: NO_ERROR}
    p.send(frame(DATA, END_STREAM, 1, b"rest"))         # in flight: dropped
    assert p.goaway() is None


def test_streams_past_max_concurrent_are_refused_and_slots_come_back():
    p = Peer(h2_limits.Limits(max_concurrent_streams=4))
    p.send(b"".join(p.headers(1 + 2 * i, request()) for i in range(6)))
    assert p.resets() == {9: REFUSED_STREAM, 11: REFUSED_STREAM} and len(opened(p)) == 4
    p.send(frame(DATA, END_STREAM, 1, grpc_message(b"a")))
    answer(p, opened(p)[0])
    p.send(p.headers(13, request(), end_stream=True))
    assert opened(p)[-1].id == 13 and p.goaway() is None


def test_priority_self_dependency_is_a_stream_error():
    p = Peer()
    p.send(frame(PRIORITY, 0, 1, struct.pack(">IB", 1, 10)))
    assert p.resets() == {1: PROTOCOL_ERROR}
    p = Peer()
    block = p.block(request())
    p.send(frame(HEADERS, END_HEADERS | PRIORITY_FLAG | END_STREAM, 3, struct.pack(">IB", 3, 10) + block))
    assert p.resets() == {3: PROTOCOL_ERROR} and not opened(p)
    p.send(p.headers(5, request(), end_stream=True))      # the table still in step
    assert opened(p)[0].id == 5


def test_priority_of_the_wrong_length_is_a_stream_error():
    p = Peer()
    p.send(frame(PRIORITY, 0, 1, b"\x00\x00\x00\x00"))
    assert p.resets() == {1: FRAME_SIZE_ERROR} and p.goaway() is None


def test_trailers_end_the_request_and_a_second_headers_without_end_stream_is_malformed():
    p = Peer()
    p.send(p.headers(1, request()) + frame(DATA, 0, 1, grpc_message(b"a"))
           + p.headers(1, [("x-trailer", "1")], end_stream=True))
    assert type(p.events[-1]) is TrailersReceived and p.events[-1].stream.remote_closed
    p.send(p.headers(3, request()) + p.headers(3, [("x-trailer", "1")]))
    assert p.resets() == {3: PROTOCOL_ERROR}


# -- requests: §8.1-8.3 -------------------------------------------------------------------------

MALFORMED = {
    "upper-case name": request("/t.S/Echo", ("X-Upper", "1")),
    "connection-specific": request("/t.S/Echo", ("connection", "keep-alive")),
    "transfer-encoding": request("/t.S/Echo", ("transfer-encoding", "chunked")),
    "te not trailers": request("/t.S/Echo")[:5] + [("te", "gzip")],
    "unknown pseudo": request() + [(":foo", "bar")],
    "response pseudo": [(":status", "200")] + request(),
    "pseudo after regular": [("x-a", "1")] + request(),
    "no :method": request()[1:],
    "no :scheme": [request()[0]] + request()[2:],
    "no :path": request()[:2] + request()[3:],
    "empty :path": request("")[:],
    "empty :method": [(":method", "")] + request()[1:],
    "two :method": [(":method", "POST")] + request(),
    "two :scheme": [(":scheme", "http")] + request(),
    "two :path": request()[:3] + [(":path", "/t.S/Other")] + request()[3:],
    "value with NUL": request("/t.S/Echo", ("x-a", "a\x00b")),
    "value with a space at its end": request("/t.S/Echo", ("x-a", "a ")),
    "empty name": request("/t.S/Echo", ("", "v")),
    "content-length not digits": request("/t.S/Echo", ("content-length", "1x")),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_requests_are_reset_protocol_error_and_never_reach_a_handler(name):
    p = Peer()
    p.send(p.headers(1, MALFORMED[name], end_stream=True))
    assert p.resets() == {1: PROTOCOL_ERROR}, name
    assert not opened(p) and p.goaway() is None
    p.send(p.headers(3, request(), end_stream=True))     # the connection and its table go on
    assert [s.id for s in opened(p)] == [3]


def test_pseudo_header_in_trailers_is_malformed():
    p = Peer()
    p.send(p.headers(1, request()) + p.headers(1, [(":path", "/x")], end_stream=True))
    assert p.resets() == {1: PROTOCOL_ERROR}


@pytest.mark.parametrize("length, parts, ok", [(1, [b"test"], False), (4, [b"te", b"st!"], False),
                                               (4, [b"te", b"st"], True), (4, [], False)])
def test_content_length_must_be_the_body_length(length, parts, ok):
    p = Peer()
    out = p.headers(1, request("/t.S/Echo", ("content-length", str(length))), end_stream=not parts)
    for i, part in enumerate(parts):
        out += frame(DATA, END_STREAM if i == len(parts) - 1 else 0, 1, part)
    p.send(out)
    assert p.resets() == ({} if ok else {1: PROTOCOL_ERROR})


def test_connect_needs_authority_and_no_scheme_or_path():
    p = Peer()
    p.send(p.headers(1, [(":method", "CONNECT"), (":authority", "x:1")], end_stream=True))
    assert len(opened(p)) == 1
    p.send(p.headers(3, [(":method", "CONNECT"), (":authority", "x:1"), (":path", "/")], end_stream=True))
    assert p.resets() == {3: PROTOCOL_ERROR}


# -- flow control -----------------------------------------------------------------------------


def _answered(one_write: bool, data: bytes, stream_window: int) -> bytes:
    """What the server sends for one stream's answer, after the request (its bytes)."""
    p = Peer(settings=struct.pack(">HI", 4, stream_window))
    p.send(p.headers(1, request(), end_stream=True))
    st = opened(p)[0]
    before = len(p.frames)
    if one_write:
        p.conn.send_answer(st, b"\x88", data, b"\x00\x01a\x01b")
    else:
        p.conn.send_headers(st, b"\x88")
        p.conn.send_data(st, data)
        p.conn.send_trailers(st, b"\x00\x01a\x01b")
    p.read()
    assert (1 not in p.conn.streams and st.local_closed) == (len(data) <= stream_window)
    return b"".join(frame(k, f, s, pl) for k, f, s, pl in p.frames[before:])


@pytest.mark.parametrize("size,window", [(1000, 1 << 20), (20000, 1 << 20), (1000, 10)])
def test_send_answer_sends_what_the_three_calls_send(size, window):
    """One write of three frames when the data fits one frame and the windows; past the frame size
    (20,000 > 16,384) or the stream's window (10 bytes) the same frames the three calls send, the
    rest waiting for the window."""
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    sent = _answered(True, data, window)
    assert sent == _answered(False, data, window)
    assert sent.endswith(b"\x00\x01a\x01b") == (window > size)     # the trailers, or still waiting


def test_queued_data_waits_for_the_stream_window_then_flows_in_order():
    p = Peer(settings=struct.pack(">HI", 4, 0))
    p.send(p.headers(1, request(), end_stream=True))
    st = opened(p)[0]
    p.conn.send_headers(st, b"\x88")
    body = bytes(range(256)) * 100
    p.conn.send_data(st, body)
    p.conn.send_trailers(st, b"\x00\x01a\x01b")
    p.read()
    assert not p.of(DATA) and p.conn.queued(st) and p.conn.queued_bytes == len(body)
    p.send(frame(WINDOW_UPDATE, 0, 1, U32.pack(1000)))
    assert [len(f[3]) for f in p.of(DATA)] == [1000]
    p.send(frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 60000)))      # + 60,000 on the open stream
    p.send(frame(WINDOW_UPDATE, 0, 0, U32.pack(1 << 20)) + frame(WINDOW_UPDATE, 0, 1, U32.pack(1 << 20)))
    assert b"".join(f[3] for f in p.of(DATA)) == body and p.of(HEADERS)[-1][1] & END_STREAM
    assert p.conn.queued_bytes == 0 and 1 not in p.conn.streams


def test_initial_window_change_can_make_a_window_negative_and_it_is_tracked():
    p = Peer(settings=struct.pack(">HI", 4, 3))
    p.send(p.headers(1, request(), end_stream=True))
    st = opened(p)[0]
    p.conn.send_data(st, b"abcde")
    p.read()
    assert [f[3] for f in p.of(DATA)] == [b"abc"]
    p.send(frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 2)))           # window 3 - 3 - 1 = -1
    p.send(frame(WINDOW_UPDATE, 0, 1, U32.pack(2)))                   # -1 + 2 = 1
    assert [f[3] for f in p.of(DATA)] == [b"abc", b"d"]


def test_settings_window_change_over_2_31_is_a_flow_control_error():
    p = Peer()
    p.send(p.headers(1, request(), end_stream=True))
    p.send(frame(WINDOW_UPDATE, 0, 1, U32.pack(0x7FFFFFFF - 65535)))      # the stream at 2^31-1
    assert p.goaway() is None
    p.send(frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 65536)))
    assert p.goaway()[0] == FLOW_CONTROL_ERROR


def test_stream_window_overflow_resets_that_stream_only():
    p = Peer()
    p.send(p.headers(1, request(), end_stream=True))
    p.send(frame(WINDOW_UPDATE, 0, 1, U32.pack(0x7FFFFFFF)))
    assert p.resets() == {1: FLOW_CONTROL_ERROR} and p.goaway() is None
    assert type(p.events[-1]) is StreamReset and not p.events[-1].by_peer


def test_window_update_of_zero_on_a_stream_is_a_stream_error():
    p = Peer()
    p.send(p.headers(1, request()) + frame(WINDOW_UPDATE, 0, 1, U32.pack(0)))
    assert p.resets() == {1: PROTOCOL_ERROR} and p.goaway() is None


def test_data_past_the_stream_window_is_a_flow_control_error():
    """Receive windows are enforced: a stream whose window is not given back may get no more;
    a client that sends past it ignores windows, and its connection ends."""
    lim = h2_limits.Limits(stream_window=32768)
    p = Peer(lim)
    p.send(p.headers(1, request()))
    p.send(frame(DATA, 0, 1, b"x" * 16384) + frame(DATA, 0, 1, b"x" * 16384))
    assert p.resets() == {}
    p.send(frame(DATA, 0, 1, b"x"))
    assert p.goaway()[0] == FLOW_CONTROL_ERROR


def test_credit_gives_the_stream_window_back():
    lim = h2_limits.Limits(stream_window=32768)
    p = Peer(lim)
    p.send(p.headers(1, request()))
    st = opened(p)[0]
    for _ in range(4):
        p.send(frame(DATA, 0, 1, b"x" * 16384) + frame(DATA, 0, 1, b"x" * 16384))
        p.conn.credit(st, 32768)
        p.read()
    assert p.resets() == {} and len(p.of(WINDOW_UPDATE, 1)) == 4


def test_connection_window_comes_back_by_itself_at_half():
    p = Peer(h2_limits.Limits(connection_window=65536))
    p.send(p.headers(1, request()))
    p.send(frame(DATA, 0, 1, b"x" * 16384))
    assert len(p.of(WINDOW_UPDATE, 0)) == 1         # the one after our SETTINGS (65,536 - 65,535)
    p.send(frame(DATA, 0, 1, b"x" * 16384))
    assert [U32.unpack(f[3])[0] for f in p.of(WINDOW_UPDATE, 0)] == [1, 32768]


def test_data_past_the_connection_window_goaway():
    """Streams given their window back, the connection's not (as when its bytes arrive faster
    than we get to them): past it is a connection error."""
    p = Peer(h2_limits.Limits(stream_window=1 << 20, connection_window=65536))
    p.send(p.headers(1, request()) + p.headers(3, request()))
    p.conn.recv_consumed = -(1 << 30)           # keeps it from coming back in this test
    p.send(b"".join(frame(DATA, 0, 1 + 2 * (i % 2), b"x" * 16384) for i in range(4)))
    assert p.goaway() is None
    p.send(frame(DATA, 0, 1, b"x"))
    assert p.goaway()[0] == FLOW_CONTROL_ERROR


def test_our_settings_and_connection_window_come_first():
    conn = H2Connection(dataclasses.replace(h2_limits.DEFAULT, max_concurrent_streams=7))
    conn.initiate()
    frames, _ = split(conn.data_to_send(), 1 << 24)
    assert [f[0] for f in frames] == [SETTINGS, WINDOW_UPDATE]
    assert struct.pack(">HI", 3, 7) in frames[0][3]
