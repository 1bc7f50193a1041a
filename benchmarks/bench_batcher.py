"""The dynamic batcher's own cost per request, in process, on an executor that does nothing:
what inference-backend/batcher.py (and the queue and formation under it) adds to every request,
apart from parsing, the model and the answer. With `--against REV` the batcher.py of git
revision REV (its queue inside it, as before the split of issue #39) runs in the same process,
interleaved with this tree's, so both see the same machine.

    .venv/bin/python -m benchmarks batcher [--against house] [--rounds 7] [--scale 1.0] [--json PATH]

Paths (REST and gRPC front ends call these):
  lone     run_alone: a lone request on the caller's thread (the gRPC lane's unary call)
  turn1    submit_deferred + flush of 1 request, run inline (REST on the loop at c=1)
  turn16   16 submit_deferred + one flush, run inline (a loop turn at c=16)
  thread   16 submit_deferred + flush, run by the compute thread, answers awaited
The first three are the calling thread's CPU time (time.thread_time_ns), which other processes
on the machine do not inflate; `thread` is wall time (a hand-over to another thread and back)
and moves with the machine's load. Median of the rounds; the load average is printed.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from mcp26.mesh.batching_policy import BatcherSettings
from mcp26.inference import batcher as current

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = BatcherSettings(max_batch_size=32, preferred_batch_sizes=(8, 16, 32), max_queue_delay_us=2000)
PATHS = {"lone": 20_000, "turn1": 20_000, "turn16": 32_000, "thread": 16_000}    # requests a round
X = np.ones((1, 4), np.float32)


class NoOp:
    def __init__(self, inline_ok: bool):
        self.inline_ok = inline_ok

    def run_batch(self, batch):
        return [{"y": p.inputs["x"]} for p in batch], [{} for _ in batch], 0.0, 0.0


def load_batcher(rev: str):
    """The batcher.py of git revision `rev` as a module of its own (it must define Pending)."""
    shown = subprocess.run(["git", "-C", ROOT, "show", f"{rev}:inference-backend/batcher.py"],
                           capture_output=True, text=True)
    if shown.returncode:
        raise SystemExit(f"--against {rev}: no inference-backend/batcher.py there ({shown.stderr.strip()})")
    src = shown.stdout
    name = f"batcher_at_{rev.replace('/', '_').replace('~', '_')}"
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
    sys.modules[name] = module          # (dataclasses look their module up)
    exec(compile(src, f"{rev}:inference-backend/batcher.py", "exec"), module.__dict__)
    if not hasattr(module, "Pending"):
        raise SystemExit(f"--against {rev}: its batcher.py defines no Pending")
    return module


def per_request_us(module, path: str, n: int) -> float:
    P = module.Pending                  # this tree's comes from batch_queue
    b = module.DynamicBatcher("m", NoOp(path != "thread"), SETTINGS, idle_dispatch=True)
    clock = time.perf_counter_ns if path == "thread" else time.thread_time_ns
    try:
        t0 = clock()
        if path == "lone":
            for _ in range(n):
                p = P(inputs={"x": X}, outputs=(), rows=1, key=(4,))
                if not b.run_alone(p):
                    raise RuntimeError("run_alone declined on an idle batcher")
                p.future.result()
            done = n
        else:
            k = 1 if path == "turn1" else 16
            for _ in range(n // k):
                ps = [P(inputs={"x": X}, outputs=(), rows=1, key=(4,)) for _ in range(k)]
                for p in ps:
                    b.submit_deferred(p)
                b.flush()
                for p in ps:
                    p.future.result(5)
            done = n // k * k
        return (clock() - t0) / done / 1000
    finally:
        b.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", help="a git revision whose batcher.py runs beside this tree's")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--scale", type=float, default=1.0, help="times the requests of a round (a quick look: 0.1)")
    ap.add_argument("--json", default=os.path.join(ROOT, "artifacts", "bench", "batcher.json"))
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: at least 1")
    if not 0 < args.scale <= 100:
        ap.error(f"--scale {args.scale}: from above 0 to 100")
    trees = [("this tree", current)] + ([(args.against, load_batcher(args.against))] if args.against else [])
    load_start = os.getloadavg()
    runs: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for path, n in PATHS.items():
            for name, module in (trees if r % 2 == 0 else trees[::-1]):
                runs.setdefault((path, name), []).append(per_request_us(module, path, max(16, int(n * args.scale))))
    load_end = os.getloadavg()
    med = {k: statistics.median(v) for k, v in runs.items()}
    head = f"{'path':7} {'clock':7} {'this tree us':>12}"
    if args.against:
        head += f" {args.against + ' us':>14} {'ratio':>6}"
    print(f"batcher cost per request, median of {args.rounds} rounds; load average "
          f"{load_start[0]:.2f} at start, {load_end[0]:.2f} at end")
    print(head)
    for path in PATHS:
        line = f"{path:7} {'wall' if path == 'thread' else 'cpu':7} {med[(path, 'this tree')]:12.2f}"
        if args.against:
            line += f" {med[(path, args.against)]:14.2f} {med[(path, 'this tree')] / med[(path, args.against)]:6.3f}"
        print(line)
    out = os.path.abspath(args.json)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as fh:
        json.dump({"against": args.against, "rounds": args.rounds, "load_average": [load_start[0], load_end[0]],
                   "us_per_request": {f"{p} {n}": v for (p, n), v in runs.items()}}, fh, indent=1)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
