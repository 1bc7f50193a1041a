"""The model server's per-request fast path, before and after, side by side in one run.

Run from the repo root: `python -m benchmarks fastpath`. Prints one table and writes
artifacts/bench/fastpath.json.

Two models: builtin:relu (one Relu node on [1, 256]: overhead-bound, ORT runs it in
microseconds, so the figures are the server's own cost per request) and builtin:mlp
(77 MB of weights: compute-bound, batching pays). Each is served twice, `balanced`
preset: as shipped (fast path on: idle dispatch, inline runs of cheap models,
inference_backend/batcher.py) and with `--no-fast-path` (plain Triton batching: a lone
request waits max_queue_delay, every batch is handed to the compute thread). Both
servers are up together and every load point runs on one, then the other, so both
see the same machine.

Load: REST with h2load --h1 (nghttp2, C; the 1.4 KB JSON body of one [1, 256] FP32
tensor, or [1, 64] for the MLP; p50/p99 from its per-request log), REST with
mcp-bench (aiohttp), gRPC with mcp-bench (raw_input_contents); closed loop,
c = 1, 16, 64. The load average is printed before and after: this machine has two
cores, shared with whatever else runs.

Floors judged (overhead-bound model, fast path): c=1 REST p50 <= 0.5 ms (h2load and
mcp-bench), and the c=1 REST throughput beside KServe ModelServer's (benchmarks/peers
measures it; the issue's figure on this machine was ~1,000 req/s, `KSERVE_C1_RPS`
overrides it): floor 2x.

Environment: BENCH_SECONDS (per point, default 3), BENCH_MODELS (default relu,mlp),
BENCH_CONCURRENCY (default 1,16,64).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from benchmarks import h2load_log
from mcp26.demo.stack.ports import free_port
from mcp26.inference.bench.serve_process import ServeProcess
from mcp26.serving.executables import executable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECONDS = float(os.environ.get("BENCH_SECONDS", "3"))
MODELS = os.environ.get("BENCH_MODELS", "relu,mlp").split(",")
CONCURRENCY = [int(c) for c in os.environ.get("BENCH_CONCURRENCY", "1,16,64").split(",")]
KSERVE_C1_RPS = float(os.environ.get("KSERVE_C1_RPS", "1000"))
WIDTH = {"relu": 256, "mlp": 64}
MODES = (("off", ("--no-fast-path",)), ("fast", ()))


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def body_file(model: str) -> str:
    rng = np.random.default_rng(1)
    data = [round(float(x), 2) for x in rng.standard_normal(WIDTH[model])]
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, WIDTH[model]], "data": data}]}
    fd, path = tempfile.mkstemp(prefix=f"fastpath-{model}-", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        json.dump(doc, fh, separators=(",", ":"))
    return path


def h2load(url: str, body: str, c: int) -> dict:
    """REST closed loop with h2load; p50/p99 from its per-request log."""
    log = tempfile.NamedTemporaryFile(prefix="h2load-", suffix=".log", delete=False).name
    cmd = ["h2load", "--h1", "-c", str(c), "-D", str(max(1, round(SECONDS))), "--warm-up-time", "1", f"--log-file={log}",
           "-d", body, "-H", "content-type: application/json", f"{url}/infer"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=SECONDS + 60).stdout
    try:
        got = h2load_log.summary(h2load_log.read(log))
    finally:
        os.unlink(log)
    if not got["ok"]:
        return {"rps": 0.0, "p50": None, "p99": None, "errors": got["errors"], "raw": out[-500:]}
    return {"rps": round(got["ok"] / (got["span_s"] or SECONDS), 1), "p50": got["p50_ms"], "p99": got["p99_ms"],
            "errors": got["errors"]}


def mcp_bench(url: str, c: int, grpc: bool) -> dict:
    cmd = [executable("mcp-bench"), "-c", str(c), "--duration", str(SECONDS),
           "--warmup", str(min(200, 20 * c)), "-u", url, "--output-format", "json"] + (["--grpc"] if grpc else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=SECONDS + 60)
    if p.returncode != 0:
        return {"rps": 0.0, "p50": None, "p99": None, "errors": -1, "raw": p.stderr[-500:]}
    row = json.loads(p.stdout)["rows"][0]
    return {"rps": row["throughput_rps"], "p50": row["latency_ms"]["p50"], "p99": row["latency_ms"]["p99"],
            "errors": row["errors"], "server_queue_p50_us": row.get("server_queue_us", {}).get("p50")}


def fmt(x, nd=2) -> str:
    return "-" if x is None else f"{x:,.{nd}f}"


def main() -> int:
    if not shutil.which("h2load"):
        print("h2load (nghttp2-client) is not installed: the REST h2load rows are skipped", file=sys.stderr)
    print(f"load average at start: {loadavg()}  ({os.cpu_count()} cores)", flush=True)
    results = []
    for model in MODELS:
        body = body_file(model)
        servers = {}
        try:
            for mode, flags in MODES:
                servers[mode] = ServeProcess(f"builtin:{model}", free_port(), free_port(), *flags).start(120)
            for c in CONCURRENCY:
                for tool in ("h2load", "mcp-bench", "mcp-bench-grpc"):
                    if tool == "h2load" and not shutil.which("h2load"):
                        continue
                    for mode, _ in MODES:           # the two servers back to back, same machine state
                        s = servers[mode]
                        if tool == "h2load":
                            r = h2load(s.rest_url, body, c)
                        else:
                            r = mcp_bench(s.grpc_url if tool.endswith("grpc") else s.rest_url, c, tool.endswith("grpc"))
                        row = {"model": model, "mode": mode, "protocol": "gRPC" if tool.endswith("grpc") else "REST",
                               "tool": tool.removesuffix("-grpc"), "c": c, **r}
                        results.append(row)
                        print(f"  {model:5} {mode:4} {row['protocol']:4} {row['tool']:9} c={c:<3} "
                              f"{fmt(r['rps'], 0):>7} req/s  p50 {fmt(r['p50'], 3)} ms  p99 {fmt(r['p99'], 3)} ms"
                              + (f"  errors {r['errors']}" if r.get("errors") else ""), flush=True)
        finally:
            for s in servers.values():
                s.stop()
            os.unlink(body)
    end_load = loadavg()

    print(f"\nfast path vs --no-fast-path (balanced preset), {SECONDS:.0f} s per point; load average at end: {end_load}")
    print(f"{'model':6} {'proto':5} {'tool':9} {'c':>3} | {'off req/s':>9} {'p50 ms':>7} {'p99 ms':>7} | "
          f"{'fast req/s':>10} {'p50 ms':>7} {'p99 ms':>7} | {'x':>5}")
    print("-" * 96)
    index = {(r["model"], r["protocol"], r["tool"], r["c"], r["mode"]): r for r in results}
    for r in results:
        if r["mode"] != "fast":
            continue
        off = index.get((r["model"], r["protocol"], r["tool"], r["c"], "off"), {})
        ratio = r["rps"] / off["rps"] if off.get("rps") else None
        print(f"{r['model']:6} {r['protocol']:5} {r['tool']:9} {r['c']:>3} | {fmt(off.get('rps'), 0):>9} "
              f"{fmt(off.get('p50'), 3):>7} {fmt(off.get('p99'), 3):>7} | {fmt(r['rps'], 0):>10} {fmt(r['p50'], 3):>7} "
              f"{fmt(r['p99'], 3):>7} | {fmt(ratio, 2):>5}")

    floors = []
    for tool in ("h2load", "mcp-bench"):
        r = index.get(("relu", "REST", tool, 1, "fast"))
        if r and r["p50"] is not None:
            floors.append((f"relu c=1 REST p50 ({tool}) <= 0.5 ms", r["p50"], r["p50"] <= 0.5))
    r = index.get(("relu", "REST", "h2load", 1, "fast")) or index.get(("relu", "REST", "mcp-bench", 1, "fast"))
    if r:
        floors.append((f"relu c=1 REST req/s >= 2x KServe's {KSERVE_C1_RPS:,.0f}", r["rps"],
                       r["rps"] >= 2 * KSERVE_C1_RPS))
    print()
    for name, value, ok in floors:
        print(f"{'HOLDS' if ok else 'MISSED'}  {name}: {value}")

    out = os.path.join(ROOT, "artifacts", "bench", "fastpath.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as fh:
        json.dump({"seconds": SECONDS, "load_average_end": end_load, "results": results,
                   "floors": [{"name": n, "value": v, "holds": ok} for n, v, ok in floors]}, fh, indent=1)
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
