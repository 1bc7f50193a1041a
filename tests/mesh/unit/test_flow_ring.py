"""The shared-memory flow ring (mesh/flow_ring.py), socket-free: the seed's layout, wraparound,
a slow reader (drops counted, traffic never waits), a file-backed mmap shared by two mappings,
and the loop's FlowSource turning samples into FlowSignals with their age."""
import struct

import pytest

from mcp26.mesh import flow_ring as R
from mcp26.scheduler.loop.flows import FlowSource


def _ring():
    buf = bytearray(R.SIZE)
    R.init(buf)
    return buf, R.FlowRingWriter(buf), R.FlowRingReader(buf)


def test_layout_is_the_seeds():
    buf, w, _ = _ring()
    assert struct.unpack_from("<I", buf, 0)[0] == 0x52494E47 and R.RING_OFF == 0x1000 and R.RING_BYTES == 65536
    w.write("10.0.0.1", 40000, "10.0.0.2", 8000, rtt_us=1234, payload_bytes=1_500_000, ts_ns=99)
    assert struct.unpack_from("<QQ", buf, 0x8) == (1, 0)           # producer at 0x8, consumer at 0x10
    rec = buf[0x1000:0x1040]
    assert rec[:16] == b"\0" * 10 + b"\xff\xff" + bytes([10, 0, 0, 1])
    # rtt at 40 and the commit word's seq (record 0 -> 1) at 44
    assert struct.unpack_from("<HHBxxxII QQ".replace(" ", ""), rec, 32) == (40000, 8000, 4, 1234, 1, 1_500_000, 99)
    with pytest.raises(ValueError):
        R.FlowRingReader(bytearray(R.SIZE))                          # no magic


def test_wraparound_keeps_order_across_the_ring_end():
    buf, w, r = _ring()
    seen = []
    for k in range(3 * R.SLOTS + 17):
        assert w.write("127.0.0.1", 1000 + k % 50000, "127.0.0.2", 80, k, k * 10, k)
        if k % 300 == 299:
            seen += r.read()
    seen += r.read()
    assert [s.rtt_us for s in seen] == list(range(3 * R.SLOTS + 17)) and r.drops == 0
    assert seen[-1].flow == f"127.0.0.1:{1000 + (3 * R.SLOTS + 16) % 50000}->127.0.0.2:80"


def test_a_slow_reader_drops_new_records_and_counts_them():
    buf, w, r = _ring()
    ok = [w.write("::1", 5, "::1", 6, i, 0, i) for i in range(R.SLOTS + 100)]
    assert ok.count(True) == R.SLOTS and r.drops == 100 and r.pending() == R.SLOTS
    got = r.read()
    assert [s.rtt_us for s in got] == list(range(R.SLOTS)) and got[0].src == "[::1]:5"
    assert w.write("::1", 5, "::1", 6, 7, 0, 7) and [s.rtt_us for s in r.read()] == [7]


def test_a_file_backed_ring_is_shared_between_mappings_and_the_loop_ages_flows(tmp_path):
    path = str(tmp_path / "flows.ring")
    a = R.MappedRing(path, create=True)
    w = a.writer()
    now = [10_000_000_000]
    src = FlowSource.at(path, keep_s=1.0, clock_ns=lambda: now[0])     # the loop's own mapping
    w.write("127.0.0.1", 41000, "127.0.0.1", 8080, rtt_us=800, payload_bytes=2 << 20, ts_ns=now[0] - 5_000_000)
    w.write("127.0.0.1", 41001, "127.0.0.1", 8080, rtt_us=90_000, payload_bytes=10, ts_ns=now[0])
    flows = {f.flow: f for f in src()}
    f = flows["127.0.0.1:41000->127.0.0.1:8080"]
    assert (f.rtt_ms, f.payload_bytes, f.age_ms) == (0.8, 2 << 20, 5.0) and len(flows) == 2
    now[0] += 998_000_000                                             # older than keep_s: gone
    assert [f.flow for f in src()] == ["127.0.0.1:41001->127.0.0.1:8080"]
    st = src.stats()
    assert {k: st[k] for k in ("samples", "drops", "flows", "source")} == {"samples": 2, "drops": 0, "flows": 1,
                                                                         "source": "file"}
    assert st["rings"][0]["mlocked"] and st["rings"][0]["bell"] == "Doorbell"
    src.close()


def test_the_loop_merges_each_flows_kinds_and_hands_write_bursts_out_once(tmp_path):
    kernel, server = str(tmp_path / "kernel.ring"), str(tmp_path / "server.ring")   # two producers' rings
    now = [50_000_000_000]
    src = FlowSource.at(kernel, server, clock_ns=lambda: now[0])
    k, s = R.MappedRing(kernel).writer(), R.MappedRing(server).writer()
    flow = ("10.0.0.1", 40000, "10.0.0.2", 8000)
    k.write(*flow, rtt_us=1500, payload_bytes=2_000_000, ts_ns=now[0] - 3_000_000)
    k.write(*flow, rtt_us=2500, payload_bytes=2_000_000, ts_ns=now[0] - 2_000_000, kind=R.KIND_INGRESS)
    s.write_serving(*flow, tokens_per_second=640, kv_hit_rate=0.5, ts_ns=now[0] - 1_000_000)
    k.write_burst(pid=77, writes=40, length_us=900, nbytes=1 << 20, ts_ns=now[0] - 4_000_000)
    (f,) = src()
    assert (f.flow, f.rtt_ms, f.ingress_rtt_ms, f.payload_bytes) == ("10.0.0.1:40000->10.0.0.2:8000", 1.5, 2.5, 2_000_000)
    assert (f.tokens_per_second, f.kv_hit_rate, f.age_ms) == (640.0, 0.5, 1.0)
    (b,) = src.take_bursts({77: "10.0.0.2:8000"})
    assert (b.pid, b.endpoint, b.bytes, b.writes, b.length_ms, b.age_ms) == (77, "10.0.0.2:8000", 1 << 20, 40, 0.9, 4.0)
    assert src.take_bursts() == ()
    src.close()


def _reserve(buf, n):
    """What a kernel writer's fetch-and-add does: reserve n records, publish none yet."""
    struct.pack_into("<Q", buf, R.OFF_PROD, struct.unpack_from("<Q", buf, R.OFF_PROD)[0] + n)


def _publish(buf, index, rtt_us):
    off = R.RING_OFF + (index % R.SLOTS) * R.RECORD
    struct.pack_into("<IIQQ", buf, off + 40, rtt_us, R.seq_of(index), 10, index)


def test_a_reserved_but_unpublished_record_stops_the_reader_until_it_is_published():
    buf, _, r = _ring()
    _reserve(buf, 3)
    _publish(buf, 0, 100)
    _publish(buf, 2, 102)                        # record 1's writer is still writing
    assert [t[6] for t in r.read_raw()] == [100] and r.pending() == 2
    _publish(buf, 1, 101)
    assert [t[6] for t in r.read_raw()] == [101, 102] and r.skipped == 0


def test_records_overwritten_a_ring_ahead_are_skipped_not_read_as_old_data():
    buf, _, r = _ring()
    _reserve(buf, R.SLOTS + 2)                   # writers raced past a full ring: 0 and 1 overwritten
    for i in range(2, R.SLOTS + 2):
        _publish(buf, i, i)
    got = r.read_raw()
    assert [t[6] for t in got] == list(range(2, R.SLOTS + 2)) and r.skipped == 2 and r.pending() == 0


def test_the_seq_wraps_at_2_to_the_31_and_is_never_0():
    assert R.seq_of(0) == 1 and R.seq_of(R.SEQ_MASK) == R.SEQ_MASK + 1 and R.seq_of(R.SEQ_MASK + 1) == 1
    buf, w, r = _ring()
    start = (1 << 31) - 2                        # a ring that has carried 2^31 - 2 records
    struct.pack_into("<QQ", buf, R.OFF_PROD, start, start)
    for k in range(5):
        assert w.write("127.0.0.1", 1, "127.0.0.1", 2, k, 0, k)
    assert [s.rtt_us for s in r.read()] == list(range(5))


def test_every_producers_record_kind_round_trips_in_the_one_layout():
    buf, w, r = _ring()
    w.write("10.0.0.1", 40000, "10.0.0.2", 8000, 900, 64, 1, kind=R.KIND_INGRESS)
    w.write_serving("10.0.0.1", 40000, "10.0.0.2", 8000, tokens_per_second=812.4, kv_hit_rate=0.625, ts_ns=2)
    w.write_burst(pid=4242, writes=17, length_us=350, nbytes=1 << 20, ts_ns=3)
    assert buf[R.RING_OFF + 2 * R.RECORD + R.REC_OFF_KIND] == R.KIND_WRITE_BURST      # byte 37: the kind
    ingress, serving, burst = r.read()
    assert ingress == R.FlowSample("10.0.0.1:40000", "10.0.0.2:8000", 900, 64, 1, R.KIND_INGRESS)
    assert serving == R.ServingSample("10.0.0.1:40000", "10.0.0.2:8000", 812, 0.625, 2)
    assert burst == R.WriteBurst(pid=4242, writes=17, length_us=350, bytes=1 << 20, ts_ns=3)
    struct.pack_into("<B", buf, R.RING_OFF + R.REC_OFF_KIND, 9)                        # a kind from the future
    struct.pack_into("<QQ", buf, R.OFF_PROD, 1, 0)
    assert r.read() == [] and r.unknown == 1


def _locked_kb(addr: int) -> int:
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "Locked:":
                return int(line.split()[1])
    return -1


def test_the_file_ring_is_mlocked(tmp_path):
    import ctypes
    ring = R.MappedRing(str(tmp_path / "ring"), create=True)
    view = (ctypes.c_char * 1).from_buffer(ring.buf)
    addr = ctypes.addressof(view)
    del view
    assert ring.locked and _locked_kb(addr) * 1024 >= R.SIZE


def test_a_producer_rings_the_readers_eventfd_handed_over_the_doorbell_socket(tmp_path):
    import selectors
    path = str(tmp_path / "ring.bell")
    bell = R.Doorbell(path)
    sel = selectors.DefaultSelector()
    sel.register(bell.fd, selectors.EVENT_READ)
    sel.register(bell.sock, selectors.EVENT_READ)
    producer = R.RingBell(path)
    import threading
    t = threading.Thread(target=lambda: [bell.serve() for _ in range(50) if not __import__("time").sleep(0.01)])
    t.start()
    try:
        assert producer.ring() and producer.ring()
    finally:
        t.join()
    assert any(key.fd == bell.fd for key, _ in sel.select(timeout=1))
    assert bell.drain() == 2 and bell.drain() == 0
    assert not any(key.fd == bell.fd for key, _ in sel.select(timeout=0.05))
    bell.close()
    again = R.Doorbell(path)                 # the reader restarted: the producer asks the new one
    t = threading.Thread(target=lambda: [again.serve() for _ in range(50) if not __import__("time").sleep(0.01)])
    t.start()
    producer._checked -= 10
    try:
        assert producer.ring()
    finally:
        t.join()
    assert again.drain() == 1
    producer.close()
    again.close()
    assert not R.RingBell(str(tmp_path / "nobody.bell")).ring()      # no reader: nothing, no error
