"""Triton's perf_analyzer driving `mcpctl serve`, beside mcp-bench at the same load.

Run from the repo root: `python -m benchmarks perf_analyzer`. Installs perf_analyzer
(tritonclient 2.50.0's, harness/perf_analyzer.py) on first use; if it cannot be
installed or loaded, prints why and exits 0 (nothing measured).

builtin:relu (overhead-bound), `balanced` preset, fast path on. For gRPC and HTTP, at
c = 1, 16, 64 closed loop: perf_analyzer (C++, synchronous calls, one [1, 256] FP32
tensor, binary on HTTP) and then mcp-bench (gRPC: raw_input_contents; REST: JSON) on
the same server. perf_analyzer's server-side breakdown (from our ModelStatistics RPC)
is printed with it. Writes artifacts/bench/perf_analyzer.json.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from harness import perf_analyzer
from mcp26.demo.stack.ports import free_port
from mcp26.inference.bench.serve_process import ServeProcess
from mcp26.serving.executables import executable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECONDS = float(os.environ.get("BENCH_SECONDS", "3"))
CONCURRENCY = [int(c) for c in os.environ.get("BENCH_CONCURRENCY", "1,16,64").split(",")]


def mcp_bench(url: str, c: int, grpc: bool) -> dict:
    cmd = [executable("mcp-bench"), "-c", str(c), "--duration", str(SECONDS),
           "--warmup", str(min(200, 20 * c)), "-u", url, "--output-format", "json"] + (["--grpc"] if grpc else [])
    row = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=SECONDS + 60).stdout)["rows"][0]
    return {"rps": row["throughput_rps"], "p50": row["latency_ms"]["p50"], "p99": row["latency_ms"]["p99"]}


def main() -> int:
    try:
        binary, env = perf_analyzer.install()
    except perf_analyzer.Unavailable as e:
        print(f"perf_analyzer unavailable, nothing measured: {e}")
        return 0
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    rows = []
    with ServeProcess("builtin:relu", free_port(), free_port()) as s:
        for protocol in ("grpc", "http"):
            for c in CONCURRENCY:
                url = f"127.0.0.1:{s.grpc_port if protocol == 'grpc' else s.http_port}"
                pa = perf_analyzer.run(binary, env, "relu", url, protocol, c, window_ms=int(SECONDS * 1000))
                mb = mcp_bench(s.grpc_url if protocol == "grpc" else s.rest_url, c, protocol == "grpc")
                pa.pop("output")
                rows.append({"protocol": protocol, "c": c, "perf_analyzer": pa, "mcp_bench": mb})
                srv = pa["server_request_us"] or {}
                print(f"  {protocol:4} c={c:<3} perf_analyzer {pa['rps'] or 0:>7,.0f}/s p50 {pa['p50']} ms p99 {pa['p99']} ms"
                      f" (server {srv.get('total')} us: queue {srv.get('queue')}, infer {srv.get('compute_infer')})"
                      f" | mcp-bench {mb['rps']:>7,.0f}/s p50 {mb['p50']} ms p99 {mb['p99']} ms", flush=True)
    end_load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nload average at end: {end_load}")
    out = os.path.join(ROOT, "artifacts", "bench", "perf_analyzer.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as fh:
        json.dump({"load_average_end": end_load, "rows": rows}, fh, indent=1)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
