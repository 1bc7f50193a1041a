"""The REST infer path's own CPU per request, in-process: no sockets, no client.

`python -m benchmarks infer_path` (or `python -m benchmarks.bench_infer_path
--turns 1500`). `builtin:relu` (overhead-bound: onnxruntime runs it in
microseconds, so the figure is the server's Python) served by one
ModelServer; each loop turn starts `c` concurrent `InferCore.answer` calls
(what the REST fast lane does with the requests one read brought) and waits
for them. Measured: process CPU (every thread) per request over `--turns`
turns, the median of `--rounds` rounds, for

  inline      the default: a cheap model's batch runs on the event loop when
              the compute thread is idle, results handed over directly
  thread      `--no-fast-path`: every batch on the compute thread, results
              back through call_soon_threadsafe

side by side in one run (rounds interleaved). What the network costs (HTTP
parsing, the socket writes, the kernel) is not in it: mcp-bench against a
running server measures that (inference-backend/README.md).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import statistics
import sys
import time

import numpy as np
import orjson
import uvloop

from mcp26.inference.builtin_models import builtin_path
from mcp26.inference.model_server import ModelServer
from mcp26.inference.rest import InferCore
from mcp26.inference.telemetry import Telemetry
from mcp26.mesh.batching_policy import preset

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODES = {"inline": True, "thread": False}          # name -> fast_path


def body(width: int = 256) -> bytes:
    data = np.random.default_rng(3).random(width, dtype=np.float32).tolist()
    return orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1, width], "datatype": "FP32", "data": data}]})


async def turns(core: InferCore, model: str, payload: bytes, concurrency: int, n: int) -> None:
    headers = [("content-type", "application/json"), ("content-length", str(len(payload)))]

    async def read_body() -> bytes:
        return payload

    async def one() -> None:
        a = await core.answer(model, "", headers, read_body)
        if a.status != 200:
            raise RuntimeError(f"{model}: {a.status} {a.body[:200]!r}")
    for _ in range(n):
        await asyncio.gather(*(one() for _ in range(concurrency)))


def cpu_per_request_us(core: InferCore, model: str, payload: bytes, concurrency: int, n: int) -> float:
    uvloop.run(turns(core, model, payload, concurrency, max(5, n // 20)))      # warm
    t = time.process_time()
    uvloop.run(turns(core, model, payload, concurrency, n))
    return (time.process_time() - t) / (n * concurrency) * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_infer_path", description=__doc__.split("\n")[0])
    p.add_argument("--concurrency", default="1,8,32", help="requests started per loop turn, comma-separated")
    p.add_argument("--turns", type=int, default=600, help="loop turns per measurement (default 600)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, modes interleaved; the median is kept")
    p.add_argument("--out", default=str(ROOT / "artifacts" / "bench" / "infer_path.json"))
    args = p.parse_args(argv)
    counts = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if not counts or min(counts) < 1 or args.turns < 1 or args.rounds < 1:
        p.error("--concurrency: positive integers; --turns and --rounds at least 1")
    models = ModelServer(Telemetry.get(None))
    for name, fast in MODES.items():
        models.add(name, builtin_path("relu"), preset("balanced"), "cpu", 1, 0, fast_path=fast)
    models.ready = True
    core = InferCore(models, 64 << 20)
    payload = body()
    load0 = os.getloadavg()[0]
    samples: dict[tuple[str, int], list[float]] = {}
    for rnd in range(args.rounds):
        order = list(MODES) if rnd % 2 == 0 else list(reversed(MODES))
        for c in counts:
            for mode in order:
                samples.setdefault((mode, c), []).append(cpu_per_request_us(core, mode, payload, c, args.turns))
    models.stop()
    print(f"REST infer path, in-process CPU per request (µs, median of {args.rounds}; relu, "
          f"{args.turns} turns each; load average {load0:.2f} -> {os.getloadavg()[0]:.2f})")
    print(f"{'requests a turn':>16}  {'inline':>8}  {'thread':>8}  {'inline/thread':>13}")
    rows = []
    for c in counts:
        inline, thread = (statistics.median(samples[(m, c)]) for m in MODES)
        rows.append({"concurrency": c, "inline_us": round(inline, 1), "thread_us": round(thread, 1),
                     "ratio": round(inline / thread, 3), "samples": {m: samples[(m, c)] for m in MODES}})
        print(f"{c:>16}  {inline:>8.1f}  {thread:>8.1f}  {inline / thread:>12.2f}x")
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "turns": args.turns, "rounds": args.rounds,
                               "loadavg": [load0, os.getloadavg()[0]]}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
