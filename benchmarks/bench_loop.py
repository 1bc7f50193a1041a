"""bench_loop: the decision loop's period jitter (p99) and CPU per cycle at 2 and 20
replicas, and the built-in policy's call cost.

Simulated replicas: one subprocess serving `GET /v1/load` on N loopback ports (idle
figures, so the built-in decides no remap and nothing is posted). The loop runs in this
process (scheduler.loop.loop.DecisionLoop), 200 ms period, for --seconds each.
Measured in benchmarks/bench_loop_overload.py (`python -m benchmarks loop_overload`), on
the real stack: time from overload to Envoy applying the class, the loop-on/off overload
scenario, and a batcher policy change's time to the replica's first batch under it.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.processes import stop_process

SIM = r"""
import json, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
LOAD = json.dumps({"ready": True, "waiting": 0, "running": 1, "kv_cache_utilization": 0.2,
  "prefix_cache_hit_rate": 0.5, "tokens_per_second": 100.0, "kv_cache_bytes": 200, "kv_cache_capacity_bytes": 1000,
  "models": [{"model": "m", "waiting_by_priority_level": {"3": 1}}]}).encode()
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.send_response(200); self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(LOAD))); self.end_headers(); self.wfile.write(LOAD)
    def log_message(self, *a): pass
for p in sys.argv[1:]:
    s = ThreadingHTTPServer(("127.0.0.1", int(p)), H); threading.Thread(target=s.serve_forever, daemon=True).start()
print("ready", flush=True); sys.stdin.read()
"""


async def _measure(n: int, seconds: float, period_s: float) -> dict:
    from mcp26.scheduler.loop.actions import ActionApplier
    from mcp26.scheduler.loop.builtin_policy import BuiltinPolicy
    from mcp26.scheduler.loop.loop import DecisionLoop
    ports = [free_port() for _ in range(n)]
    sim = subprocess.Popen([sys.executable, "-c", SIM, *map(str, ports)], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    try:
        assert sim.stdout.readline().strip() == "ready"
        eps = [f"127.0.0.1:{p}" for p in ports]
        loop = DecisionLoop(BuiltinPolicy(), "builtin", lambda: eps, ActionApplier("127.0.0.1:1"), period_s=period_s)
        cycles = int(seconds / period_s)
        started = time.monotonic()
        await loop.run(cycles)
        wall = time.monotonic() - started
        st = loop.status()
        await loop.close()
        return {"replicas": n, "cycles": cycles, "wall_s": round(wall, 3),
                "drift_ms": round((wall - (cycles - 1) * period_s) * 1e3, 1),
                "jitter_p50_ms": st["jitter_ms"]["p50"], "jitter_p99_ms": st["jitter_ms"]["p99"],
                "jitter_max_ms": st["jitter_ms"]["max"], "cpu_per_cycle_ms": st["cycle_cpu_ms"]["mean"],
                "cpu_per_cycle_p99_ms": st["cycle_cpu_ms"]["p99"], "policy_call_p50_ms": st["policy_call_ms"]["p50"],
                "policy_call_p99_ms": st["policy_call_ms"]["p99"],
                "read_errors": len(st["latest"]["inputs"]["read_errors"])}
    finally:
        sim.stdin.close()
        stop_process(sim)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench_loop")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--period-ms", type=float, default=200.0)
    args = ap.parse_args(argv)
    rows = [asyncio.run(_measure(n, args.seconds, args.period_ms / 1e3)) for n in (2, 20)]
    print(f"{'replicas':>8} {'cycles':>6} {'jit p50':>8} {'jit p99':>8} {'jit max':>8} {'cpu/cyc':>8} "
          f"{'cpu p99':>8} {'call p50':>9} {'call p99':>9} {'errors':>6}")
    for r in rows:
        print(f"{r['replicas']:>8} {r['cycles']:>6} {r['jitter_p50_ms']:>8.2f} {r['jitter_p99_ms']:>8.2f} "
              f"{r['jitter_max_ms']:>8.2f} {r['cpu_per_cycle_ms']:>8.2f} {r['cpu_per_cycle_p99_ms']:>8.2f} "
              f"{r['policy_call_p50_ms']:>9.3f} {r['policy_call_p99_ms']:>9.3f} {r['read_errors']:>6}")
    print(f"CPU per cycle 20 vs 2 replicas: {rows[1]['cpu_per_cycle_ms'] / max(1e-9, rows[0]['cpu_per_cycle_ms']):.1f}x "
          "(ms of process CPU per cycle; jitter = wake-up minus deadline)")
    os.makedirs("artifacts/bench", exist_ok=True)
    with open("artifacts/bench/loop.json", "w") as f:
        json.dump({"period_ms": args.period_ms, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
