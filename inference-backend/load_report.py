"""ORCA per-request load reports (`endpoint-load-metrics`), as Envoy parses them.

Envoy's orca_parser reads `endpoint-load-metrics: TEXT k:v, k:v` - a "TEXT "
prefix, then comma-separated `name:value` pairs, the standard fields
(cpu_utilization, mem_utilization, application_utilization, rps_fractional,
eps) and `named_metrics.<name>`. Client-side weighted round robin and LRS
read them; `application_utilization` here is the compute thread's busy
fraction, which is the real capacity signal of a batching server.
"""
from __future__ import annotations

import os
import threading
import time

SAMPLE_INTERVAL_S = 0.25
# The whole header (queue depth and named metrics included) is reused for this long: the answers
# of one batch leave within it and would each rebuild the same text (a load snapshot per answer
# was ~5 % of the REST fast lane's Python time at c=64); the picker scrapes every 50 ms.
HEADER_REUSE_S = 0.001


class LoadSampler:
    """Utilisation over the last sample interval, refreshed at most every 250 ms
    so that a response pays a dictionary lookup, not a system call."""

    def __init__(self, busy_ns, completed, queue_depth, cpus: int | None = None, named=None):
        self._busy_ns, self._completed, self._queue_depth = busy_ns, completed, queue_depth
        self._named = named       # -> more named_metrics (waiting, running, kv_cache_utilization)
        self.cpus = cpus or os.cpu_count() or 1
        self._lock = threading.Lock()
        self._last = (time.monotonic(), self._cpu_s(), busy_ns(), completed())
        self.values = {"cpu_utilization": 0.0, "application_utilization": 0.0, "rps_fractional": 0.0}
        self._text = format_text_report(self.values)    # the report of `values`, formatted once per sample
        self._header, self._header_at = "", float("-inf")

    @staticmethod
    def _cpu_s() -> float:
        t = os.times()
        return t.user + t.system

    def sample(self) -> dict:
        now = time.monotonic()
        if now - self._last[0] >= SAMPLE_INTERVAL_S and self._lock.acquire(blocking=False):
            try:
                t0, cpu0, busy0, done0 = self._last
                cpu, busy, done = self._cpu_s(), self._busy_ns(), self._completed()
                dt = now - t0
                self.values = {
                    "cpu_utilization": min(1.0, max(0.0, (cpu - cpu0) / dt / self.cpus)),
                    "application_utilization": min(1.0, max(0.0, (busy - busy0) / 1e9 / dt)),
                    "rps_fractional": max(0.0, (done - done0) / dt),
                }
                self._last = (now, cpu, busy, done)
                self._text = format_text_report(self.values)
            finally:
                self._lock.release()
        return self.values

    def header_value(self) -> str:
        """format_text_report(sample(), named metrics), with the sampled part formatted once per
        sample rather than per response (it was ~4 % of the REST fast lane's CPU at c=64)."""
        now = time.monotonic()
        if now - self._header_at < HEADER_REUSE_S:
            return self._header
        self.sample()
        named = {"queue_depth": float(self._queue_depth())}
        if self._named is not None:
            named.update(self._named())
        self._header = self._text + "".join(f", named_metrics.{k}:{_num(v)}" for k, v in named.items())
        self._header_at = now
        return self._header


def format_text_report(fields: dict[str, float], named: dict[str, float] | None = None) -> str:
    parts = [f"{k}:{_num(v)}" for k, v in fields.items()]
    parts += [f"named_metrics.{k}:{_num(v)}" for k, v in (named or {}).items()]
    return "TEXT " + ", ".join(parts)


def _num(v: float) -> str:
    return f"{v:.4f}".rstrip("0").rstrip(".") if v != int(v) else str(int(v))


def parse_text_report(value: str) -> dict[str, float]:
    """The inverse, as Envoy's parser reads it (used by tests and mcp-bench)."""
    if not value.startswith("TEXT "):
        raise ValueError(f"not a TEXT ORCA report: {value!r}")
    out = {}
    for item in value[5:].split(","):
        name, _, num = item.strip().partition(":")
        if name in out:
            raise ValueError(f"duplicate metric {name!r}")
        out[name] = float(num)
    return out
