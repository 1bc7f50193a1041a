"""The HTTP/2 abuse patterns against the sans-IO connection, on bytes: each ends with the
error code it should, soon, and what the server spends on it is bounded (CPU measured
beside the pattern, hits counted for /metrics). The same patterns through real sockets,
side by side with grpc-core, are benchmarks/bench_h2_abuse.py."""
from __future__ import annotations

import struct
import time

import pytest
from h2_peer import Peer, grpc_message, request

from mcp26.serving.h2 import limits as h2_limits
from mcp26.serving.h2.events import RequestReceived
from mcp26.serving.h2.frames import (CONTINUATION, DATA, END_HEADERS, END_STREAM, ENHANCE_YOUR_CALM, HEADERS,
                                     PING, PRIORITY, REFUSED_STREAM, RST_STREAM, SETTINGS, WINDOW_UPDATE, frame)

pytestmark = pytest.mark.adversarial
U32 = struct.Struct(">I")


def hit(name: str):
    """The counter `name` of limits.hits, read before and after: how many times it went up."""
    before = h2_limits.hits[name]
    return lambda: h2_limits.hits[name] - before


def opened(p: Peer) -> list:
    return [e.stream for e in p.events if type(e) is RequestReceived]


def test_rapid_reset_goaway_enhance_your_calm_past_the_burst():
    """CVE-2023-44487: HEADERS then RST_STREAM, over and over. The 1,001st reset of a burst
    ends the connection; until then each pair costs microseconds (no handler here)."""
    hits = hit("resets")
    p = Peer()
    pairs = b"".join(p.headers(1 + 2 * i, request()) + frame(RST_STREAM, 0, 1 + 2 * i, U32.pack(8))
                     for i in range(1200))
    t0 = time.process_time()
    p.send(pairs)
    cpu = time.process_time() - t0
    assert p.goaway() == (ENHANCE_YOUR_CALM, b"too many stream resets")
    assert len(opened(p)) == 1001 and hits() == 1
    assert cpu < 0.5, f"{cpu:.3f} s of CPU for 1,001 streams"


def test_resets_within_the_rate_keep_the_connection():
    p = Peer(h2_limits.Limits(reset_burst=10, resets_per_s=10))
    for i in range(40):             # 40 resets in 4 s: 10 a second, the rate
        sid = 1 + 2 * i
        p.send(p.headers(sid, request()) + frame(RST_STREAM, 0, sid, U32.pack(8)), dt=0.1)
    assert p.goaway() is None
    p.send(b"".join(p.headers(101 + 2 * i, request()) + frame(RST_STREAM, 0, 101 + 2 * i, U32.pack(8))
                    for i in range(20)))
    assert p.goaway()[0] == ENHANCE_YOUR_CALM


def test_streams_the_server_refuses_count_as_resets_too():
    """Streams past MAX_CONCURRENT_STREAMS, reset as they open: the client caused the reset."""
    p = Peer(h2_limits.Limits(max_concurrent_streams=1, reset_burst=5, resets_per_s=1))
    p.send(b"".join(p.headers(1 + 2 * i, request()) for i in range(7)))
    assert list(p.resets().values()) == [REFUSED_STREAM] * 5 and p.goaway()[0] == ENHANCE_YOUR_CALM


def test_empty_continuation_flood_goaway():
    """A block never finished, continued by empty CONTINUATIONs: the 33rd ends it (the 64 KiB
    cap never trips on empty frames; it pinned a core for as long as the client liked)."""
    hits = hit("continuations")
    p = Peer()
    p.send(frame(HEADERS, 0, 1, p.block(request())) + frame(CONTINUATION, 0, 1) * 1000)
    assert p.goaway()[0] == ENHANCE_YOUR_CALM and hits() == 1


def test_unfinished_header_block_times_out():
    hits = hit("header_block_timeout")
    p = Peer()
    p.send(frame(HEADERS, 0, 1, p.block(request())[:3]))
    assert p.conn.next_deadline() == pytest.approx(p.now + 1.0)
    assert p.conn.tick(p.now + 0.5) == [] and p.goaway() is None
    p.conn.tick(p.now + 1.5)
    p.read()
    assert p.goaway()[0] == ENHANCE_YOUR_CALM and hits() == 1
    p = Peer()                      # and a frame that comes late finds it too
    p.send(frame(HEADERS, 0, 1, p.block(request())[:3]))
    p.send(frame(CONTINUATION, 0, 1, b""), dt=2.0)
    assert p.goaway()[0] == ENHANCE_YOUR_CALM


def _bomb(p: Peer, sid: int, refs: int) -> bytes:
    """A block adding one 4 KB field to the table, then `refs` one-byte references to it."""
    add = b"\x40" + bytes([0x0A]) + b"x-big-name" + b"\x7f" + bytes([(4000 - 127) & 0x7F | 0x80, (4000 - 127) >> 7]) \
        + b"v" * 4000
    return frame(HEADERS, END_HEADERS | END_STREAM, sid, p.block(request()) + add + b"\xbe" * refs)


def test_hpack_bomb_stops_decoding_and_ends_the_connection_quickly():
    """60 KB of one-byte references to a 4 KB entry: decoding stops at the decoded-bytes cap
    (it walked every field, 48 ms of the loop per block) and the connection ends."""
    hits = hit("header_decoded")
    p = Peer()
    block = _bomb(p, 1, 12000)
    chunks = [block[9:][i:i + 16000] for i in range(0, len(block) - 9, 16000)]
    data = frame(HEADERS, END_STREAM, 1, chunks[0]) + b"".join(
        frame(CONTINUATION, END_HEADERS if i == len(chunks) - 1 else 0, 1, c) for i, c in enumerate(chunks) if i)
    t0 = time.process_time()
    p.send(data)
    cpu = time.process_time() - t0
    assert p.goaway()[0] == ENHANCE_YOUR_CALM and hits() == 1 and not opened(p)
    assert cpu < 0.005, f"{cpu * 1000:.1f} ms for one block"


def test_many_small_fields_past_the_field_cap_end_the_connection():
    hits = hit("header_fields")
    p = Peer()
    p.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, p.block(request()) + b"\x82" * 1200))    # :method GET
    assert p.goaway()[0] == ENHANCE_YOUR_CALM and hits() == 1


def test_a_block_over_the_list_limit_refuses_that_request_and_the_table_stays_in_step():
    hits = hit("header_list")
    p = Peer()
    p.send(_bomb(p, 1, 2))                  # ~12 KB decoded: under 16 KiB
    p.send(_bomb(p, 3, 6))                  # ~28 KB decoded: over it, under the hard caps
    refused = [e for e in p.events if type(e) is RequestReceived and e.headers is None]
    assert [e.stream.id for e in refused] == [3] and hits() == 1
    p.send(frame(HEADERS, END_HEADERS | END_STREAM, 5, p.block(request("/t.S/After")) + b"\xbe"))
    last = [e for e in p.events if type(e) is RequestReceived][-1]
    assert last.stream.id == 5 and (b"x-big-name", b"v" * 4000) in last.headers and p.goaway() is None


def test_settings_with_thousands_of_entries_goaway():
    hits = hit("settings_entries")
    p = Peer()
    p.send(frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 100) * 2730))
    assert p.goaway()[0] == ENHANCE_YOUR_CALM and hits() == 1


def test_initial_window_changes_over_a_thousand_streams_cost_once_per_frame():
    """20 SETTINGS frames of 30 window changes each, 1,000 streams open: the change is applied
    once per frame (it was per entry: 3 s of CPU for 20 frames of 2,730)."""
    p = Peer()
    p.send(b"".join(p.headers(1 + 2 * i, request()) for i in range(1000)))
    frames = b"".join(frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", 4, 1000 + j + k) for j in range(30)))
                      for k in range(20))
    t0 = time.process_time()
    p.send(frames)
    cpu = time.process_time() - t0
    assert p.goaway() is None and all(st.send_window == 1000 + 29 + 19 for st in opened(p))
    assert cpu < 0.1, f"{cpu * 1000:.0f} ms"


def test_ping_get_ping_repeat_is_stopped():
    """Refusals the client provokes (a `GET /`, an unknown method) do not clear PING strikes:
    PING, PING, GET, ... was never stopped (200,000 PINGs ACKed)."""
    hits = hit("pings")
    p = Peer()
    for i in range(5):
        p.send(frame(PING, 0, 0, b"%08d" % (2 * i)) + frame(PING, 0, 0, b"%08d" % (2 * i + 1))
               + p.headers(1 + 2 * i, [(":method", "GET"), (":scheme", "http"), (":path", "/"),
                                       (":authority", "x")], end_stream=True))
        st = opened(p)[-1]
        p.conn.refuse(st, b"\x88", b"not gRPC")         # what the gRPC lane answers a GET with
        p.read()
        if p.goaway():
            break
    assert p.goaway() == (ENHANCE_YOUR_CALM, b"too_many_pings") and hits() == 1


def test_pings_between_answers_are_not_abuse():
    p = Peer()
    for i in range(5):
        sid = 1 + 2 * i
        p.send(p.headers(sid, request(), end_stream=True) + frame(PING, 0, 0, b"%08d" % i))
        p.conn.send_answer(opened(p)[-1], b"\x88", grpc_message(b"x"), b"\x00\x0bgrpc-status\x010")
        p.read()
        p.send(frame(PING, 0, 0, b"x%07d" % i))
    assert p.goaway() is None and len(p.of(PING)) == 10


def test_ping_flood_ends_at_the_third_strike():
    p = Peer()
    p.send(frame(PING, 0, 0, b"12345678") * 4)
    assert len(p.of(PING)) == 3 and p.goaway() == (ENHANCE_YOUR_CALM, b"too_many_pings")


@pytest.mark.parametrize("flood", ["window_update", "priority", "empty_data", "settings", "unknown"])
def test_control_frame_floods_end_at_the_limit(flood):
    """Frames that each cost a little and move nothing: past 10,000 in a second, GOAWAY."""
    hits = hit("control_frames")
    p = Peer()
    p.send(p.headers(1, request()))
    one = {"window_update": frame(WINDOW_UPDATE, 0, 1, U32.pack(1)),
           "priority": frame(PRIORITY, 0, 3, struct.pack(">IB", 0, 1)),
           "empty_data": frame(DATA, 0, 1),
           "settings": frame(SETTINGS, 0, 0),
           "unknown": frame(0x20, 0, 0, b"abc")}[flood]
    t0 = time.process_time()
    p.send(one * 12000)
    cpu = time.process_time() - t0
    assert p.goaway()[0] == ENHANCE_YOUR_CALM and hits() == 1
    assert cpu < 0.2, f"{cpu:.3f} s for 10,000 frames"


def test_window_updates_answering_our_data_are_not_control_frames():
    """A client that sends a WINDOW_UPDATE (for the stream and the connection) for each DATA
    frame it gets is normal: 15,000 answers, 30,000 WINDOW_UPDATEs, all in one second."""
    p = Peer()
    for i in range(15000):
        sid = 1 + 2 * i
        p.send(p.headers(sid, request(), end_stream=True))
        p.conn.send_answer(opened(p)[-1], b"\x88", grpc_message(b"x"), b"\x00\x0bgrpc-status\x010")
        p.read()
        p.send(frame(WINDOW_UPDATE, 0, 0, U32.pack(6)) + frame(WINDOW_UPDATE, 0, sid, U32.pack(6)))
        p.events.clear()
        p.frames.clear()
    assert p.goaway() is None


def test_bytes_held_behind_the_clients_windows_are_capped():
    """A client that grants no window and keeps asking: past Limits.max_queued_bytes held for
    it, new streams are refused (REFUSED_STREAM) until it reads."""
    hits = hit("queued_bytes")
    p = Peer(h2_limits.Limits(max_queued_bytes=1 << 20), settings=struct.pack(">HI", 4, 0))
    answer = b"a" * (300 << 10)
    for i in range(6):
        for ev in p.send(p.headers(1 + 2 * i, request(), end_stream=True)):
            if type(ev) is RequestReceived:
                p.conn.send_answer(ev.stream, b"\x88", answer, b"\x00\x0bgrpc-status\x010")
        p.read()
    assert len(opened(p)) == 4 and p.conn.queued_bytes == 4 * len(answer)
    assert set(p.resets().values()) == {REFUSED_STREAM} and hits() >= 1
