"""serving/gc_pauses.py: the recorder sees the interpreter's own collections, the tally and the
/metrics reader report them as the servers export them."""
from __future__ import annotations

import gc

from prometheus_client import CollectorRegistry, generate_latest

from mcp26.serving import gc_pauses


def test_a_collection_is_timed_by_generation_and_read_back_from_metrics():
    registry = CollectorRegistry()
    recorder = gc_pauses.export_metrics(registry, "frozen")     # the servers' histogram and gauge
    tally = gc_pauses.PauseTally()
    try:
        gc.collect()            # a full collection, as the interpreter runs it
        gc.collect(0)
    finally:
        recorder.close()
        tally.recorder.close()
    text = generate_latest(registry).decode()
    assert f"{gc_pauses.FROZEN_METRIC} {float(gc.get_freeze_count())}" in text
    read = gc_pauses.pauses_from_metrics(text)
    assert read["2"]["count"] == 1 and read["0"]["count"] >= 1, read     # (young ones may also start by themselves)
    full = gc_pauses.pauses_between({}, read, "2")
    assert full["count"] == 1 and 0 < full["seconds"] <= full["longest_le"], full
    snap = tally.snapshot()
    assert snap["pauses"]["2"]["count"] == 1 and snap["pauses"]["2"]["longest_ms"] > 0, snap
    gc.collect()                # closed: nothing more is recorded
    assert tally.snapshot()["pauses"]["2"]["count"] == 1


def test_the_pauses_between_two_readings_are_bounded_by_their_own_buckets():
    def reading(buckets: dict[str, float], total: float) -> str:
        lines = ["# TYPE mcp_python_gc_pause_seconds histogram"]
        lines += [f'mcp_python_gc_pause_seconds_bucket{{generation="2",le="{le}"}} {n}' for le, n in buckets.items()]
        lines += [f'mcp_python_gc_pause_seconds_count{{generation="2"}} {buckets["+Inf"]}',
                  f'mcp_python_gc_pause_seconds_sum{{generation="2"}} {total}', ""]
        return "\n".join(lines)
    # before: one 80 ms collection (at start); between: two short ones, 0.5 ms and 20 ms
    before = gc_pauses.pauses_from_metrics(reading({"0.001": 0, "0.025": 0, "0.1": 1, "+Inf": 1}, 0.08))
    after = gc_pauses.pauses_from_metrics(reading({"0.001": 1, "0.025": 2, "0.1": 3, "+Inf": 3}, 0.1005))
    between = gc_pauses.pauses_between(before, after, "2")
    assert between["count"] == 2 and abs(between["seconds"] - 0.0205) < 1e-9
    assert between["longest_le"] == 0.025       # not the 80 ms one from before
    assert gc_pauses.pauses_between(after, after, "2") == {"count": 0, "seconds": 0.0, "longest_le": 0.0}
