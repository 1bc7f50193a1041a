"""builtin:mlp in onnxruntime alone, no server: what a row costs by batch size
and by thread layout, with and without a front end's share of the cores.

Why the model server splits under load (inference_backend/batcher.py, "Split
under load") and why a lead over Triton at MLP c=64 can only come from the
front end (inference-backend/README.md, "relu gRPC c=1 from a C client too"):
both servers run these same GEMMs.

Rows:
- `1 thread, batch B`: one session of one intra-op thread, one batch at a time:
  CPU per row and the GFLOP/s it reaches.
- `2 x 1 thread, batch 32`: two threads each running batches of 32 on one
  one-thread session (the split layout's narrow instances).
- `1 x 2 threads, batch 64`: one session of two intra-op threads, batches of
  64 (the wide instance at c=64).
- `... + front end`: the same beside a process at normal priority that burns
  1 ms of every 3 (a Python loop's share at MLP c=64), the compute at
  SCHED_IDLE as the server runs its narrow instances, or at normal priority.

    .venv/bin/python -m benchmarks gemm [--seconds 3]

Prints one table; writes artifacts/bench/gemm.json. The load average is
printed before and after: this machine has two cores, shared.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BURN = """
import sys, time
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    t = time.perf_counter()
    while time.perf_counter() - t < 0.001:
        pass
    time.sleep(0.002)
"""


def mlp_flops_per_row() -> float:
    from mcp26.inference.builtin_models import MLP_HIDDEN, MLP_IN, MLP_LAYERS, MLP_OUT
    dims = [MLP_IN] + [MLP_HIDDEN] * MLP_LAYERS + [MLP_OUT]
    return 2.0 * sum(a * b for a, b in zip(dims, dims[1:]))


def session(threads: int):
    import onnxruntime as ort
    from mcp26.inference.builtin_models import builtin_path
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")     # as runtime.py runs it
    return ort.InferenceSession(builtin_path("mlp"), opts, providers=["CPUExecutionProvider"])


def every_thread(policy: int) -> None:
    """`policy` (os.SCHED_IDLE or os.SCHED_OTHER) for every thread of this process, onnxruntime's
    pool threads too; back from SCHED_IDLE needs CAP_SYS_NICE or RLIMIT_NICE room (else it stays)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setscheduler(int(tid), policy, os.sched_param(0))
        except OSError:
            pass


def run(sess, batch: int, runners: int, seconds: float, idle: bool, front_end: bool) -> dict:
    """`runners` threads each running batches of `batch` on `sess` for `seconds`: rows/s and CPU/row."""
    feeds = {"INPUT0": np.random.default_rng(1).standard_normal((batch, 64)).astype(np.float32)}
    for _ in range(2):
        sess.run(None, feeds)
    every_thread(os.SCHED_IDLE if idle else os.SCHED_OTHER)
    burner = subprocess.Popen([sys.executable, "-c", BURN, str(seconds + 1)]) if front_end else None
    rows, start = [0] * runners, threading.Barrier(runners + 1)

    def loop(i: int) -> None:
        start.wait()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            sess.run(None, feeds)
            rows[i] += batch
    threads = [threading.Thread(target=loop, args=(i,)) for i in range(runners)]
    for t in threads:
        t.start()
    start.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if burner is not None:
        burner.wait()
    every_thread(os.SCHED_OTHER)
    done = sum(rows)
    return {"rows_per_s": round(done / wall, 1), "cpu_us_per_row": round(cpu / done * 1e6, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks gemm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="per row of the table")
    ap.add_argument("--json", default=os.path.join(ROOT, "artifacts", "bench", "gemm.json"))
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if args.seconds <= 0:
        ap.error("--seconds > 0")
    load0 = os.getloadavg()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in load0)}  ({os.cpu_count()} cores)", flush=True)
    one, two = session(1), session(2)
    flops = mlp_flops_per_row()
    cases = [(f"1 thread, batch {b}", one, b, 1, False, False) for b in (1, 8, 32, 64)] + [
        ("2 x 1 thread, batch 32", one, 32, 2, False, False),
        ("1 x 2 threads, batch 64", two, 64, 1, False, False),
        ("2 x 1 thread, batch 32 + front end, SCHED_IDLE", one, 32, 2, True, True),
        ("1 x 2 threads, batch 64 + front end", two, 64, 1, False, True),
        ("1 x 2 threads, batch 64 + front end, SCHED_IDLE", two, 64, 1, True, True),
    ]
    rows = []
    for label, sess, batch, runners, idle, front_end in cases:
        got = run(sess, batch, runners, args.seconds, idle, front_end)
        got.update(label=label, batch=batch, runners=runners, sched_idle=idle, front_end=front_end,
                   gflops_per_core=round(flops / got["cpu_us_per_row"] / 1e3, 1))
        rows.append(got)
        print(f"  {label}: {got['rows_per_s']:,.0f} rows/s, {got['cpu_us_per_row']:.0f} us CPU a row", flush=True)
    base = {r["front_end"]: r["rows_per_s"] for r in rows if r["runners"] == 2}   # the split layout's
    load1 = os.getloadavg()
    print(f"\nbuiltin:mlp in onnxruntime, {flops / 1e6:.1f} MFLOP a row, {args.seconds:.0f} s a row; "
          f"load average at end: {' '.join(f'{x:.2f}' for x in load1)}")
    print(f"{'layout':50} {'rows/s':>8} {'us CPU/row':>11} {'GFLOP/s/core':>13} {'x 2x1 b=32':>11}")
    print("-" * 97)
    for r in rows:
        versus = f"{r['rows_per_s'] / base[r['front_end']]:.2f}" if r["batch"] >= 32 else "-"
        print(f"{r['label']:50} {r['rows_per_s']:>8,.0f} {r['cpu_us_per_row']:>11.0f} {r['gflops_per_core']:>13.1f} "
              f"{versus:>11}")
    print("(front end: a normal-priority process busy 1 ms of every 3; x: rows/s over the two one-thread "
          "instances' in the same conditions)")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"load_average_start": load0, "load_average_end": load1, "seconds": args.seconds,
                   "mflop_per_row": flops / 1e6, "rows": rows}, fh, indent=2)
    print(f"wrote {os.path.relpath(args.json, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
