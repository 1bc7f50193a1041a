"""Render a run's result as a table, CSV or JSON (the same rows in each)."""
from __future__ import annotations

import csv
import io
import json

COLUMNS = [  # (CSV/JSON key, table header)
    ("priority", "priority"), ("qos_class", "qos class"), ("requests", "reqs"), ("ok", "ok"),
    ("errors", "err"), ("throughput_rps", "rps"),
    ("p50_ms", "p50 ms"), ("p90_ms", "p90 ms"), ("p99_ms", "p99 ms"), ("p99.9_ms", "p99.9 ms"),
    ("max_ms", "max ms"), ("queue_p50_us", "queue p50 us"), ("queue_p99_us", "queue p99 us"),
    ("compute_p50_us", "compute p50 us"), ("compute_p99_us", "compute p99 us"),
]


def flat_rows(result: dict) -> list[dict]:
    """One flat dict per row, keys as in COLUMNS."""
    out = []
    for r in result["rows"]:
        lat, q, c = r["latency_ms"], r["server_queue_us"] or {}, r["server_compute_us"] or {}
        out.append({
            "priority": r["priority"], "qos_class": r.get("qos_class", ""),
            "requests": r["requests"], "ok": r["ok"], "errors": r["errors"],
            "throughput_rps": r["throughput_rps"],
            **{f"{k}_ms": lat[k] for k in ("p50", "p90", "p99", "p99.9", "max")},
            "queue_p50_us": q.get("p50"), "queue_p99_us": q.get("p99"),
            "compute_p50_us": c.get("p50"), "compute_p99_us": c.get("p99"),
        })
    return out


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def table(result: dict) -> str:
    rows = flat_rows(result)
    grid = [[h for _, h in COLUMNS]] + [[_cell(r[k]) for k, _ in COLUMNS] for r in rows]
    widths = [max(len(line[i]) for line in grid) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths)))
             for line in grid]
    lines.insert(1, "  ".join("-" * w for w in widths))
    run = result["run"]
    head = (f"mcp-bench {run['protocol']} {run['mode']} -c {run['concurrency']} "
            f"{run['target']}: {run['completed']} requests in {run['duration_s']:.2f} s")
    if run.get("client_cpu_us_per_request") is not None:
        head += f" (mcp-bench's own CPU: {run['client_cpu_us_per_request']:.0f} us a request)"
    if run["mode"] == "open-loop":
        lag = result["schedule_lag"]
        head += (f"\noffered {run['rate_rps']:g}/s, sent {run['sent_rate_rps']:.1f}/s; behind schedule: "
                 f"p50 {_cell(lag['p50_ms'])} ms, p99 {_cell(lag['p99_ms'])} ms, max {_cell(lag['max_ms'])} ms"
                 f" ({lag['waited_for_slot']} waited for a free slot; the generator's own lateness: "
                 f"p99 {_cell(lag['generator_p99_ms'])} ms, max {_cell(lag['generator_max_ms'])} ms)")
    errs = result["rows"][0]["error_classes"]
    tail = "errors: " + (", ".join(f"{k}={v}" for k, v in errs.items()) if errs else "none")
    return "\n".join([head, *lines, tail])


def to_csv(result: dict) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=[k for k, _ in COLUMNS] + ["error_classes"], lineterminator="\n")
    w.writeheader()
    for flat, row in zip(flat_rows(result), result["rows"]):
        errs = ";".join(f"{k}={v}" for k, v in row["error_classes"].items())
        w.writerow({**{k: ("" if v is None else v) for k, v in flat.items()}, "error_classes": errs})
    return buf.getvalue()


def to_json(result: dict) -> str:
    return json.dumps(result, indent=2)


def render(result: dict, fmt: str) -> str:
    return {"table": table, "csv": to_csv, "json": to_json}[fmt](result)
