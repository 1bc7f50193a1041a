"""Heterogeneous serving, side by side in one run (inference-backend/README.md, "Model
repository, ensembles, partitioning"), on the example repository (vision / audio / text
branches and a fusion model, inference.examples.build_repository):

- ensemble: the `multimodal` ensemble served by `mcpctl serve --model-repository`, one
  REST request each, against the same DAG driven by the client step by step (vision,
  audio, text concurrently, then fusion: four requests), tritonclient, closed loop, c=1/16;
- partition: the vision model served whole (one session, both intra-op threads) against
  `--partition stages=2` (two stages, one thread each, pipelined over micro-batches),
  REST batch-1 requests, c=16/64;
- reconfiguration: the cut moved on the vision model, in process, 50 times: decision to
  swapped (split + build + warm the new stages + swap), and the swap alone, p50/p99;
- repository load: process start to ready, `mcpctl serve --model-repository` against
  Triton (benchmarks/peers: PyTriton's tritonserver, whose build has only the python
  backend, so each ONNX model is its python-backend wrapper of onnxruntime, and the
  ensemble is Triton's own) on the same five models, when its peer venv exists
  (`python -m benchmarks peers` installs it).

    .venv/bin/python -m benchmarks repository [--seconds 4] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def closed_loop(clients: int, seconds: float, make_call) -> dict:
    """`clients` threads, each calling its own `make_call()` in a loop for `seconds`; req/s, p50/p99 ms."""
    lat: list[float] = []
    errors = [0]
    stop = time.monotonic() + seconds
    lock = threading.Lock()

    def worker():
        call = make_call()
        mine = []
        while time.monotonic() < stop:
            t = time.perf_counter()
            try:
                call()
            except Exception as e:     # noqa: BLE001 - counted, reported
                if not errors[0]:
                    print(f"first error: {type(e).__name__}: {e}", file=sys.stderr)
                errors[0] += 1
                continue
            mine.append(time.perf_counter() - t)
        with lock:
            lat.extend(mine)
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    lat.sort()
    return {"rps": len(lat) / wall, "p50_ms": 1e3 * lat[len(lat) // 2] if lat else None,
            "p99_ms": 1e3 * lat[int(len(lat) * 0.99)] if lat else None, "errors": errors[0]}


def _inputs(module, arrays: dict):
    out = []
    for name, a in arrays.items():
        i = module.InferInput(name, list(a.shape), "INT64" if a.dtype == np.int64 else "FP32")
        i.set_data_from_numpy(a)
        out.append(i)
    return out


def bench_ensemble(repo: str, seconds: float) -> list[dict]:
    import tritonclient.http as thttp
    from concurrent.futures import ThreadPoolExecutor
    from mcp26.demo.stack.inference_server import InferenceServer
    from mcp26.inference.examples.build_repository import example_request
    req = example_request(1)
    rows = []
    with InferenceServer("repository:" + repo, "--intra-op-threads", "1") as s:
        def server_side():
            c = thttp.InferenceServerClient(s.http)
            ins = _inputs(thttp, req)
            return lambda: c.infer("multimodal", ins).as_numpy("PROBS")

        def client_side():
            # a client per thread: tritonclient.http's is a gevent connection, usable on its own thread only
            pool = ThreadPoolExecutor(3)
            mine = threading.local()
            branches = [("vision", {"IMAGE": req["IMAGE"]}), ("audio", {"AUDIO": req["AUDIO"]}),
                        ("text", {"TOKENS": req["TOKENS"]})]
            prepared = [(m, _inputs(thttp, a)) for m, a in branches]
            fusion = thttp.InferenceServerClient(s.http)

            def branch(m, i):
                if not hasattr(mine, "c"):
                    mine.c = thttp.InferenceServerClient(s.http)
                return mine.c.infer(m, i).as_numpy("EMBEDDING")

            def call():
                futures = [pool.submit(branch, m, i) for m, i in prepared]
                v, a, t = (f.result() for f in futures)
                return fusion.infer("fusion", _inputs(thttp, {"VISION": v, "AUDIO": a, "TEXT": t})).as_numpy("PROBS")
            return call
        for c in (1, 16):
            closed_loop(c, 1.0, server_side)            # warm both paths
            ens = closed_loop(c, seconds, server_side)
            cli = closed_loop(c, seconds, client_side)
            rows.append({"row": f"ensemble vs client-driven DAG, REST c={c}", "a": ens, "b": cli,
                         "ratio": ens["rps"] / cli["rps"] if cli["rps"] else None, "load": os.getloadavg()[0]})
    return rows


def bench_partition(repo: str, seconds: float) -> list[dict]:
    import tritonclient.http as thttp
    from mcp26.demo.stack.inference_server import InferenceServer
    path = os.path.join(repo, "vision", "1", "model.onnx")
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    results = {}
    configs = {"whole": ["--intra-op-threads", "2"],
               "partition": ["--intra-op-threads", "2", "--partition", "stages=2;devices=cpu,cpu;micro=2"]}
    for label, flags in configs.items():
        with InferenceServer(path, "--qos-policy", "throughput", *flags) as s:
            def call_factory():
                c = thttp.InferenceServerClient(s.http)
                ins = _inputs(thttp, {"IMAGE": x})
                return lambda: c.infer("model", ins)
            closed_loop(4, 1.0, call_factory)
            for c in (16, 64):
                results[(label, c)] = closed_loop(c, seconds, call_factory)
    return [{"row": f"partition 2 stages (cpu,cpu) vs whole graph, REST c={c}", "a": results[("partition", c)],
             "b": results[("whole", c)], "ratio": results[("partition", c)]["rps"] / results[("whole", c)]["rps"],
             "load": os.getloadavg()[0]} for c in (16, 64)]


def bench_reconfigure(repo: str, n: int = 50) -> dict:
    from mcp26.inference import partition as P
    path = os.path.join(repo, "vision", "1", "model.onnx")
    m = P.PartitionedModel.load_partitioned("vision", "1", path, P.Spec.parse("stages=2"), intra_op_threads=2)
    cuts = P.valid_cuts(m.graph)
    try:
        swaps = [m.move_to([cuts[i % len(cuts)]]) for i in range(1, n + 1)]
    finally:
        m.pipeline.stop()
    total = sorted(s.seconds * 1e3 for s in swaps)
    alone = sorted(s.swap_seconds * 1e3 for s in swaps)
    pct = lambda xs, q: xs[min(len(xs) - 1, int(len(xs) * q))]   # noqa: E731
    return {"row": f"reconfiguration (cut moved, {n} times)", "total_p50_ms": pct(total, 0.5),
            "total_p99_ms": pct(total, 0.99), "swap_p50_ms": pct(alone, 0.5), "swap_p99_ms": pct(alone, 0.99),
            "load": os.getloadavg()[0]}


def _ready_seconds(start) -> float:
    t0 = time.perf_counter()
    server = start()
    return time.perf_counter() - t0, server


def bench_load(repo: str, rounds: int = 3) -> dict:
    from mcp26.demo.stack.inference_server import InferenceServer
    from mcp26.demo.stack.ports import free_port
    ours = []
    for _ in range(rounds):
        s = InferenceServer("repository:" + repo)
        dt, _ = _ready_seconds(s.start)
        s.stop()
        ours.append(dt)
    out = {"row": "repository load, start to ready (5 models)", "mcp26_s": statistics.median(ours), "triton_s": None,
           "load": os.getloadavg()[0]}
    if not os.path.isdir(os.path.join(ROOT, ".cache", "peers", "triton")):
        out["triton"] = "not installed: `python -m benchmarks peers` installs Triton's peer"
        return out
    from benchmarks.peers.triton import TritonPeer
    from mcp26.inference.model_repository import scan
    entries = scan(repo)
    models = []
    for name, e in entries.items():
        if e.is_ensemble:
            continue
        c = e.config
        spec = lambda ts: [{"name": t.name, "datatype": "INT64" if t.data_type == 9 else "FP32",   # noqa: E731
                            "shape": [-1, *t.dims]} for t in ts]
        models.append({"name": name, "onnx_path": e.model_path, "inputs": spec(c.input), "outputs": spec(c.output),
                       "max_batch": c.max_batch_size, "max_queue_delay_us": 500})
    theirs = []
    for _ in range(rounds):
        peer = TritonPeer(ROOT, models, free_port(), free_port(), free_port(), intra_op_threads=1)
        shutil.copytree(os.path.join(repo, "multimodal"), os.path.join(peer.dir, "models", "multimodal"))
        try:
            dt, _ = _ready_seconds(peer.start)
            theirs.append(dt)
        finally:
            peer.stop()
    out["triton_s"] = statistics.median(theirs)
    out["triton"] = peer.version
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks repository", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--json", default=os.path.join(ROOT, "artifacts", "bench", "repository.json"))
    args = ap.parse_args(argv)
    from mcp26.inference.examples.build_repository import build
    repo = build(os.path.join(ROOT, ".cache", "bench-multimodal-repository"))
    rows = bench_ensemble(repo, args.seconds) + bench_partition(repo, args.seconds)
    recon = bench_reconfigure(repo)
    load = bench_load(repo)
    print(f"{'row':58} {'A req/s':>9} {'B req/s':>9} {'A/B':>6} {'A p99 ms':>9} {'B p99 ms':>9} {'load':>5}")
    for r in rows:
        print(f"{r['row']:58} {r['a']['rps']:9.0f} {r['b']['rps']:9.0f} {r['ratio']:6.2f} "
              f"{r['a']['p99_ms']:9.2f} {r['b']['p99_ms']:9.2f} {r['load']:5.2f}")
    print(f"{recon['row']:58} total p50 {recon['total_p50_ms']:.2f} ms, p99 {recon['total_p99_ms']:.2f} ms; "
          f"swap alone p50 {recon['swap_p50_ms'] * 1e3:.1f} us, p99 {recon['swap_p99_ms'] * 1e3:.1f} us "
          f"(load {recon['load']:.2f})")
    triton = f"{load['triton_s']:.2f} s ({load['mcp26_s'] / load['triton_s']:.2f}x)" if load["triton_s"] \
        else load["triton"]
    print(f"{load['row']:58} mcp26 {load['mcp26_s']:.2f} s; Triton {triton} (load {load['load']:.2f})")
    errors = sum(r["a"]["errors"] + r["b"]["errors"] for r in rows)
    print(f"errors: {errors}")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"rows": rows, "reconfiguration": recon, "load": load, "uptime": os.getloadavg()}, fh, indent=2)
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
