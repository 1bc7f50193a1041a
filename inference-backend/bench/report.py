"""Render a run's result as a table, CSV or JSON (the same rows in each).

CSV adds the server profiler's 17 metrics over the run (bench/server_profile.py), one
column each, the unit in the header (`ipc (ratio)`); a metric the server cannot give
is `n/a`, never 0.
"""
from __future__ import annotations

import csv
import io
import json

from mcp26.inference.profiler import METRICS

COLUMNS = [  # (CSV/JSON key, table header)
    ("priority", "priority"), ("qos_class", "qos class"), ("requests", "reqs"), ("ok", "ok"),
    ("errors", "err"), ("shed", "shed"), ("throughput_rps", "rps"),
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
            "requests": r["requests"], "ok": r["ok"], "errors": r["errors"], "shed": r.get("shed", 0),
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
    return "\n".join([head, *lines, tail, summary_line(result)])


def summary_line(result: dict) -> str:
    """One line: how much of the run was answered, shed (429) and failed otherwise."""
    row = result["rows"][0]
    n = max(1, row["requests"])
    other = row["errors"] - row.get("shed", 0)
    line = (f"mcp-bench: {row['requests']} requests, {row['ok']} ok ({100 * row['ok'] / n:.1f} %), "
            f"{row.get('shed', 0)} shed ({100 * row.get('shed', 0) / n:.1f} %: HTTP 429 / RESOURCE_EXHAUSTED, "
            f"refused by the server's admission), {other} other errors ({100 * other / n:.1f} %)")
    return line


PROFILE_COLUMNS = [f"{key} ({unit})" for key, unit, _, _ in METRICS] + ["kernel_by_op (ms)"]


def _profile_cells(values: dict | None) -> dict:
    if values is None:
        return {c: "n/a" for c in PROFILE_COLUMNS}
    out = {}
    for (key, unit, _, _), col in zip(METRICS, PROFILE_COLUMNS):
        v = values.get(key)
        out[col] = "n/a" if v is None else (f"{v:.6g}" if isinstance(v, float) else v)
    out["kernel_by_op (ms)"] = ";".join(f"{op}={ms:.4g}" for op, ms in values.get("kernel_by_op", {}).items())
    return out


def to_csv(result: dict) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=[k for k, _ in COLUMNS] + ["error_classes"] + PROFILE_COLUMNS,
                       lineterminator="\n")
    w.writeheader()
    profile = (result.get("server_profile") or {}).get("levels") or {}
    levels = list(profile)
    for i, (flat, row) in enumerate(zip(flat_rows(result), result["rows"])):
        errs = ";".join(f"{k}={v}" for k, v in row["error_classes"].items())
        values = profile.get(levels[i]) if i < len(levels) else None
        w.writerow({**{k: ("" if v is None else v) for k, v in flat.items()}, "error_classes": errs,
                    **_profile_cells(values)})
    return buf.getvalue()


def to_json(result: dict) -> str:
    return json.dumps(result, indent=2)


def render(result: dict, fmt: str) -> str:
    return {"table": table, "csv": to_csv, "json": to_json}[fmt](result)
