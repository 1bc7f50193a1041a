"""Samples and their summary: exact percentiles from every recorded sample.

Every request is kept (typed arrays, ~60 bytes each: a million is ~60 MB),
so p99.9 is a real order statistic, not an interpolation between buckets.
"""
from __future__ import annotations

import math
from array import array
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
# Refused by the server's admission (HTTP 429 / gRPC RESOURCE_EXHAUSTED): load shed, not a fault
SHED = frozenset({"overload/http-429", "overload/RESOURCE_EXHAUSTED"})


def percentile(sorted_values: np.ndarray, p: float) -> float | None:
    """Nearest-rank percentile (the smallest sample with at least p% of the
    samples at or below it), as HdrHistogram and wrk2 report it."""
    n = len(sorted_values)
    if n == 0:
        return None
    rank = max(1, math.ceil(p * n / 100.0 - 1e-9))   # 99.9% of 1000 is rank 999, not 1000
    return float(sorted_values[min(rank, n) - 1])


@dataclass
class Recorder:
    """One row per completed request; appended from the event loop."""
    intended: array = field(default_factory=lambda: array("d"))   # intended send time (s, perf_counter)
    sent: array = field(default_factory=lambda: array("d"))       # when it actually went out
    done: array = field(default_factory=lambda: array("d"))
    priority: array = field(default_factory=lambda: array("b"))   # index into the mix
    error: list[str | None] = field(default_factory=list)
    queue_us: array = field(default_factory=lambda: array("d"))   # NaN where the server did not say
    compute_us: array = field(default_factory=lambda: array("d"))
    waited: array = field(default_factory=lambda: array("b"))     # open loop: queued for a free slot

    def add(self, intended: float, sent: float, done: float, prio: int,
            error: str | None, queue_us: float | None, compute_us: float | None,
            waited: bool = False) -> None:
        self.intended.append(intended)
        self.sent.append(sent)
        self.done.append(done)
        self.priority.append(prio)
        self.error.append(error)
        self.queue_us.append(math.nan if queue_us is None else queue_us)
        self.compute_us.append(math.nan if compute_us is None else compute_us)
        self.waited.append(waited)

    def __len__(self) -> int:
        return len(self.done)


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1e3, 4)


def _dist_ms(seconds: np.ndarray) -> dict:
    s = np.sort(seconds)
    out = {f"p{p:g}": _ms(percentile(s, p)) for p in PERCENTILES}
    out["mean"] = _ms(float(s.mean())) if len(s) else None
    out["max"] = _ms(float(s[-1])) if len(s) else None
    return out


def _dist_us(values: np.ndarray) -> dict | None:
    values = values[~np.isnan(values)]
    if len(values) == 0:
        return None
    s = np.sort(values)
    return {"p50": percentile(s, 50), "p99": percentile(s, 99), "mean": round(float(s.mean()), 1)}


def summarize_rows(rec: Recorder, labels: list[str], t_start: float, t_end: float) -> list[dict]:
    """Rows per priority (when more than one) and an `all` row.

    Latency runs from the *intended* send time to the answer: in closed loop
    that is the send time; in open loop it includes any time the request
    waited for the generator or for a free connection (no coordinated omission).
    """
    intended = np.asarray(rec.intended)
    done = np.asarray(rec.done)
    prio = np.asarray(rec.priority, dtype=np.int64)
    ok = np.array([e is None for e in rec.error], dtype=bool)
    queue = np.asarray(rec.queue_us, dtype=float)
    compute = np.asarray(rec.compute_us, dtype=float)
    duration = max(t_end - t_start, 1e-9)
    groups = [("all", np.ones(len(done), dtype=bool))]
    if len(labels) > 1:
        groups += [(lab, prio == k) for k, lab in enumerate(labels)]
    rows = []
    for name, sel in groups:
        good = sel & ok
        errors = Counter(e for e, s in zip(rec.error, sel) if s and e is not None)
        rows.append({
            "priority": name,
            "requests": int(sel.sum()),
            "ok": int(good.sum()),
            "errors": int(sel.sum() - good.sum()),
            "shed": sum(n for e, n in errors.items() if e in SHED),
            "error_classes": dict(sorted(errors.items())),
            "throughput_rps": round(float(good.sum()) / duration, 2),
            "latency_ms": _dist_ms(done[good] - intended[good]),
            "server_queue_us": _dist_us(queue[good]),
            "server_compute_us": _dist_us(compute[good]),
        })
    return rows


def schedule_lag(rec: Recorder) -> dict:
    """How far behind its schedule each request went on the wire: in all, and
    for those that found a slot free (the generator's own lateness, apart
    from waiting behind a server that had all `-c` slots busy)."""
    lag = np.asarray(rec.sent) - np.asarray(rec.intended)
    waited = np.asarray(rec.waited, dtype=bool)
    out = {"p50_ms": None, "p99_ms": None, "max_ms": None, "generator_p99_ms": None,
           "generator_max_ms": None, "waited_for_slot": int(waited.sum())}
    if len(lag):
        s = np.sort(lag)
        out.update(p50_ms=_ms(percentile(s, 50)), p99_ms=_ms(percentile(s, 99)), max_ms=_ms(float(s[-1])))
    own = np.sort(lag[~waited])
    if len(own):
        out.update(generator_p99_ms=_ms(percentile(own, 99)), generator_max_ms=_ms(float(own[-1])))
    return out
