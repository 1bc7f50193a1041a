"""h2load's per-request log (`--log-file`), for the benchmarks that drive h2load.

One line a request, tab-separated: when it started (µs, wall clock),
its HTTP status, its latency (µs). A gRPC error still arrives as HTTP 200:
bench_peers counts those from h2load's DATA bytes."""
from __future__ import annotations

import statistics


def read(path: str) -> list[tuple[int, int, int]]:
    """(start µs, HTTP status, latency µs) per request."""
    with open(path) as fh:
        return [(int(a), int(b), int(c)) for a, b, c, *_ in (line.split("\t") for line in fh if line.strip())]


def summary(rows: list[tuple[int, int, int]]) -> dict:
    """ok (HTTP 200s), errors (any other status), span_s (first start to last), and the
    p50/p99 latency of the 200s in ms (None without any)."""
    lat = sorted(r[2] / 1000 for r in rows if r[1] == 200)
    span_s = (max(r[0] for r in rows) - min(r[0] for r in rows)) / 1e6 if rows else 0.0
    return {"ok": len(lat), "errors": len(rows) - len(lat), "span_s": span_s,
            "p50_ms": round(statistics.median(lat), 3) if lat else None,
            "p99_ms": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 3) if lat else None}
