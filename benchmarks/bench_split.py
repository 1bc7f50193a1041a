"""Split under load on builtin:mlp, side by side: `mcpctl serve` with one
instance on both ONNX threads (`wide`, what it did before), the same with
`--split-under-load` (`split`), and Triton (its peer venv from `benchmarks
peers`, when it exists): REST, c = 16 and 64, mcp-bench closed loop, the
servers taking turns. Besides req/s, where the two cores went: each server's
CPU per request (every thread of its processes, /proc), mcp-bench's, and the
share of the machine left idle (/proc/stat) - the figure split under load
exists to shrink (inference-backend/README.md, "Split under load").

    .venv/bin/python -m benchmarks split [--rounds 2] [--concurrency 16,64] [--seconds 5]
        [--servers wide,split,triton] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from benchmarks import bench_peers as peers
from benchmarks.bench_xds import cpu_s

ROOT = peers.ROOT
FLAGS = ["--qos-policy", "balanced", "--workers", "1", "--intra-op-threads", "2"]
SERVERS = {"wide": FLAGS, "split": FLAGS + ["--split-under-load"]}


def descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout.split()
    children: dict[int, list[int]] = {}
    for child, parent in zip(out[::2], out[1::2]):
        children.setdefault(int(parent), []).append(int(child))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return found


def cpu_of(pids: list[int]) -> float:
    """CPU seconds of `pids` so far (each process's stat counts all its threads)."""
    total = 0.0
    for pid in pids:
        try:
            total += cpu_s(pid)
        except (FileNotFoundError, ProcessLookupError):     # a process that ended meanwhile
            continue
    return total


def machine() -> list[int]:
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def measure(server, c: int, seconds: float) -> dict:
    url = server.rest_url("mlp")
    peers.run_load(peers.bench_argv(url, False, c, 2, peers.MLP_IN), 60)        # warm-up
    pids = descendants(server.proc.proc.pid)
    cpu0, m0, kids0 = cpu_of(pids), machine(), resource.getrusage(resource.RUSAGE_CHILDREN)
    point = peers.run_load(peers.bench_argv(url, False, c, seconds, peers.MLP_IN), seconds + 60)
    cpu1, m1, kids1 = cpu_of(pids), machine(), resource.getrusage(resource.RUSAGE_CHILDREN)
    requests = max(1.0, point["rps"] * seconds)
    delta = [b - a for a, b in zip(m0, m1)]
    bench_s = (kids1.ru_utime - kids0.ru_utime) + (kids1.ru_stime - kids0.ru_stime)
    return {"rps": point["rps"], "p50_ms": point["p50_ms"], "p99_ms": point["p99_ms"], "errors": point["errors"],
            "server_us": 1e6 * (cpu1 - cpu0) / requests, "bench_us": 1e6 * bench_s / requests,
            "idle_pct": 100.0 * delta[3] / max(1, sum(delta))}


def make(label: str, model: dict):
    if label in SERVERS:
        return peers.Ours(model, SERVERS[label])
    return peers.make_server(label, model)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", default="16,64")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--servers", default="wide,split,triton")
    ap.add_argument("--json", default=os.path.join(ROOT, "artifacts", "bench", "split.json"))
    args = ap.parse_args(argv)
    try:
        levels = [int(c) for c in args.concurrency.split(",") if c]
    except ValueError:
        ap.error(f"--concurrency {args.concurrency!r}: comma-separated integers")
    if args.seconds <= 0 or args.rounds < 1 or not levels or any(c < 1 for c in levels):
        ap.error("--seconds > 0, --rounds >= 1 and concurrency >= 1")
    labels = args.servers.split(",")
    unknown = [x for x in labels if x not in (*SERVERS, "triton")]
    if unknown or "wide" not in labels:
        print(f"--servers: {', '.join(unknown) or 'wide is the baseline and must be one'}: "
              f"choose from wide, split, triton", file=sys.stderr)
        return 2
    if "triton" in labels and not os.path.isdir(os.path.join(ROOT, ".cache", "peers", "triton")):
        print("triton: no peer venv (.cache/peers/triton; `python -m benchmarks peers` creates it): left out")
        labels.remove("triton")
    model = peers.model_spec("mlp", peers.model_files()["mlp"])
    runs: dict = {(label, c): [] for label in labels for c in levels}
    load0, t0 = os.getloadavg()[0], time.monotonic()
    for r in range(args.rounds):
        for label in peers.turn_order(labels, r):
            server = make(label, model).start()
            try:
                for c in levels:
                    runs[(label, c)].append(measure(server, c, args.seconds))
                    print(f"  round {r + 1} {label} c={c}: {runs[(label, c)][-1]['rps']:.0f}/s", flush=True)
            finally:
                server.stop()
    med = {k: {f: statistics.median(x[f] for x in v) for f in ("rps", "server_us", "bench_us", "idle_pct")}
           for k, v in runs.items()}
    print(f"\nmlp REST, median of {args.rounds} rounds of {args.seconds:g} s; load average {load0:.2f} at start, "
          f"{os.getloadavg()[0]:.2f} at end; {time.monotonic() - t0:.0f} s")
    print(f"{'c':>3}  {'server':7} {'req/s':>7} {'x wide':>7} {'server us/req':>14} {'bench us/req':>13} {'idle %':>7}")
    for c in levels:
        for label in labels:
            m = med[(label, c)]
            print(f"{c:>3}  {label:7} {m['rps']:7.0f} {m['rps'] / med[('wide', c)]['rps']:7.2f} "
                  f"{m['server_us']:14.0f} {m['bench_us']:13.0f} {m['idle_pct']:7.1f}")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"rounds": {f"{k[0]} c={k[1]}": v for k, v in runs.items()},
                   "median": {f"{k[0]} c={k[1]}": v for k, v in med.items()}}, f, indent=1)
    print(f"wrote {os.path.relpath(args.json, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
