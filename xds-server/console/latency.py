"""Live p50/p99 per QoS class from a backend's Prometheus latency histogram.

A histogram's buckets are cumulative since the process started, so a
quantile over "now" needs two scrapes: the difference of their bucket counts
is the histogram of the requests in between (what Prometheus'
`histogram_quantile(q, rate(x_bucket[w]))` computes). Within a bucket the
value is interpolated linearly, as Prometheus does.
"""
from __future__ import annotations

import bisect
import math
import time
from collections import deque
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from mcp26.mesh.qos import PRIORITY_LEVELS, class_for_priority_level

# Label names a backend may use for the class; the first present wins.
# The inference backend labels by priority level, which maps 1:1 to a class.
QOS_LABELS = ("qos_class", "qos", "priority_level")
DEFAULT_METRIC = "mcp_inference_request_duration_seconds"   # inference-backend/telemetry.py

Buckets = dict[float, float]  # upper bound (le) -> cumulative count


def histograms_by_class(text: str, metric: str | None = None) -> tuple[str | None, dict[str, Buckets]]:
    """(metric name, {QoS class: buckets}) of the first histogram labelled by class.

    With `metric`, only that histogram family; buckets of other labels
    (model, method, ...) are summed per class.
    """
    for family in text_string_to_metric_families(text):
        if family.type != "histogram" or (metric and family.name != metric):
            continue
        out: dict[str, Buckets] = {}
        for s in family.samples:
            if not s.name.endswith("_bucket"):
                continue
            label = next((k for k in QOS_LABELS if k in s.labels), None)
            if label is None:
                break
            le = float(s.labels["le"])
            per = out.setdefault(_class_name(label, s.labels[label]), {})
            per[le] = per.get(le, 0.0) + s.value
        if out:
            return family.name, out
    return None, {}


def _class_name(label: str, value: str) -> str:
    if label == "priority_level" and value.isdigit() and 1 <= int(value) <= PRIORITY_LEVELS:
        return class_for_priority_level(int(value)).header_value
    return value


def quantile(q: float, buckets: Buckets) -> float | None:
    """histogram_quantile over cumulative buckets; None when there is no observation."""
    bounds = sorted(buckets)
    if not bounds or not math.isinf(bounds[-1]):
        return None
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    i = bisect.bisect_left([buckets[b] for b in bounds], rank)
    if i >= len(bounds) - 1:          # in the +Inf bucket: the highest finite bound
        return bounds[-2] if len(bounds) > 1 else None
    upper, count_at = bounds[i], buckets[bounds[i]]
    lower, count_below = (bounds[i - 1], buckets[bounds[i - 1]]) if i > 0 else (0.0, 0.0)
    if count_at == count_below:
        return upper
    return lower + (upper - lower) * (rank - count_below) / (count_at - count_below)


def unit_to_ms(metric: str | None) -> float:
    """Scale from the unit a metric's name ends in (Prometheus naming) to ms."""
    name = (metric or "").removesuffix("_total")
    for suffix, scale in (("_seconds", 1000.0), ("_milliseconds", 1.0), ("_ms", 1.0),
                          ("_microseconds", 0.001), ("_us", 0.001)):
        if name.endswith(suffix):
            return scale
    return 1000.0  # Prometheus' base unit for time is the second


def delta(now: Buckets, before: Buckets | None) -> Buckets:
    if not before:
        return dict(now)
    # A counter reset (backend restarted) shows as a drop: take `now` whole.
    if any(now.get(le, 0.0) < v for le, v in before.items()):
        return dict(now)
    return {le: v - before.get(le, 0.0) for le, v in now.items()}


@dataclass
class Scrape:
    t: float
    classes: dict[str, Buckets]


class LatencyWindow:
    """Scrapes kept for `keep_s`; each point is the quantiles of the last `window_s`."""

    def __init__(self, window_s: float = 10.0, keep_s: float = 300.0):
        self.window_s, self.keep_s = window_s, keep_s
        self.scrapes: deque[Scrape] = deque()
        self.metric: str | None = None

    def add(self, text: str, metric: str | None = None, t: float | None = None) -> None:
        name, classes = histograms_by_class(text, metric)
        self.metric = name or self.metric
        t = time.time() if t is None else t
        self.scrapes.append(Scrape(t, classes))
        while self.scrapes and self.scrapes[0].t < t - self.keep_s:
            self.scrapes.popleft()

    def _before(self, i: int) -> Scrape | None:
        """The newest scrape at least window_s older than scrape i."""
        t = self.scrapes[i].t - self.window_s
        for j in range(i - 1, -1, -1):
            if self.scrapes[j].t <= t:
                return self.scrapes[j]
        return None

    def series(self) -> dict[str, list[dict]]:
        """{class: [{t, p50, p99, n}]} in ms; t relative to the newest scrape."""
        out: dict[str, list[dict]] = {}
        if not self.scrapes:
            return out
        scale = unit_to_ms(self.metric)
        t_last = self.scrapes[-1].t
        for i, s in enumerate(self.scrapes):
            before = self._before(i)
            if before is None:
                continue  # not a whole window of history yet
            for cls, buckets in s.classes.items():
                d = delta(buckets, before.classes.get(cls))
                n = d.get(math.inf, 0.0)
                p50, p99 = quantile(0.5, d), quantile(0.99, d)
                out.setdefault(cls, []).append({
                    "t": round(s.t - t_last, 3), "n": n,
                    "p50": None if p50 is None else p50 * scale,
                    "p99": None if p99 is None else p99 * scale})
        return out
