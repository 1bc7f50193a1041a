"""The cyclic garbage collector on a serving loop: the startup heap moved out of
its sight, and every collection's pause timed by generation.

Used by the model server (a Prometheus histogram, inference-backend/telemetry.py)
and the Endpoint Picker (a tally in its /stats, scheduler/server.py).

Why: a full (generation 2) collection walks every tracked object. A model
server's heap after start (onnx, onnxruntime, grpc, aiohttp, numpy: ~100,000
objects) takes 35-41 ms to walk on this 2-core VM, and the requests in flight
survive gen-0/1 collections often enough to start one every 2-3 s under load:
each stops the loop (and so the batcher) mid-burst. Measured, the builtin MLP at
64 requests in flight: p99 56-57 ms with the collector as it is, 27-35 ms with
the startup heap frozen (full collections 1 ms). The picker's heap is smaller
(~45,000 objects) and its requests leave less behind: a full collection every
~3,000 requests, 16-22 ms each. The xds-server freezes its config after each
apply for the same reason (xds-server/server.py).

Frozen objects are still freed by reference counting; only a reference cycle
among them would now be kept. The heap is collected once before it is frozen,
so nothing already garbage is kept.
"""
from __future__ import annotations

import gc
import time

PAUSE_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
PAUSE_METRIC = "mcp_python_gc_pause_seconds"       # histogram by generation (Go's go_gc_duration_seconds)
FROZEN_METRIC = "mcp_python_gc_frozen_objects"     # gauge: gc.get_freeze_count()


def freeze_startup_heap() -> int:
    """Collect once, then move every tracked object to the permanent generation;
    returns how many objects are frozen. Call once the server is loaded and serving."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class PauseRecorder:
    """Times each collection (gc.callbacks) into `observe(seconds, generation)`.

    A collection holds the GIL from its start to its stop callback and none nests,
    so one start time serves every thread that may trigger one."""

    def __init__(self, observe):
        self._observe = observe
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self._observe(time.perf_counter() - self._start, info["generation"])

    def close(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)


def export_metrics(registry, frozen_help: str) -> "PauseRecorder":
    """PAUSE_METRIC and FROZEN_METRIC in a prometheus_client `registry`, the pauses recorded from
    now on; `frozen_help` says when this process freezes. Once per process: gc callbacks are global."""
    from prometheus_client import Gauge, Histogram
    pause = Histogram(PAUSE_METRIC, "Time each cyclic garbage collection held the interpreter, by generation",
                      ("generation",), buckets=PAUSE_BUCKETS_S, registry=registry)
    by_generation = [pause.labels(generation=str(g)) for g in range(3)]
    Gauge(FROZEN_METRIC, frozen_help, registry=registry).set_function(gc.get_freeze_count)
    return PauseRecorder(lambda seconds, g: by_generation[g].observe(seconds))


class PauseTally:
    """Collections, seconds and the longest pause by generation, for a JSON status page."""

    def __init__(self):
        self.by_generation = {g: [0, 0.0, 0.0] for g in range(3)}     # count, seconds, longest
        self.recorder = PauseRecorder(self._add)

    def _add(self, seconds: float, generation: int) -> None:
        t = self.by_generation[generation]
        t[0] += 1
        t[1] += seconds
        t[2] = max(t[2], seconds)

    def snapshot(self) -> dict:
        return {"frozen_objects": gc.get_freeze_count(),
                "pauses": {str(g): {"count": n, "seconds": round(s, 6), "longest_ms": round(m * 1e3, 3)}
                           for g, (n, s, m) in self.by_generation.items()}}


def pauses_from_metrics(text: str) -> dict[str, dict]:
    """{generation: {count, seconds, buckets}} from a /metrics text's PAUSE_METRIC histogram;
    buckets: [(upper bound s, pauses at most that long)], ascending."""
    from prometheus_client.parser import text_string_to_metric_families
    out: dict[str, dict] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != PAUSE_METRIC:
            continue
        for s in fam.samples:
            g = out.setdefault(s.labels["generation"], {"count": 0, "seconds": 0.0, "buckets": []})
            if s.name.endswith("_count"):
                g["count"] = int(s.value)
            elif s.name.endswith("_sum"):
                g["seconds"] = s.value
            elif s.name.endswith("_bucket"):
                g["buckets"].append((float(s.labels["le"]), s.value))
    for g in out.values():
        g["buckets"].sort()
    return out


def pauses_between(before: dict, after: dict, generation: str = "2") -> dict:
    """The pauses of one generation between two pauses_from_metrics readings: count, seconds and
    longest_le, the smallest bucket bound holding every one of them (a histogram keeps no maximum;
    0.0 when there were none)."""
    a, b = after[generation], before.get(generation, {"count": 0, "seconds": 0.0, "buckets": []})
    count = a["count"] - b["count"]
    earlier = dict(b["buckets"])
    longest = next((le for le, n in a["buckets"] if n - earlier.get(le, 0.0) >= count), None) if count else 0.0
    return {"count": count, "seconds": a["seconds"] - b["seconds"], "longest_le": longest}
