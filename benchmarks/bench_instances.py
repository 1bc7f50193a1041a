"""Model instances (`mcpctl serve --instances N`, Triton's instance_group count)
on the compute-bound MLP: one instance on both cores' ONNX threads against two
instances of one thread each, with Triton's count 1 and count 2 beside them
when its peer venv exists (`python -m benchmarks peers` installs it).

Run from the repo root: `python -m benchmarks instances` (~4 min with Triton).
Load: mcp-bench closed loop as in bench_peers (REST: one keep-alive connection
per request in flight; gRPC: 4 channels), `--seconds` per run, each cell the
median of `--rounds` runs with the servers taking turns (rotated each round).
Prints one table; writes artifacts/bench/instances.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from benchmarks import bench_peers as bp

# label -> ("ours", mcpctl serve flags) or ("triton", (max batch, queue delay us, count, intra-op threads))
CONFIGS = {
    "ours 1x2": ("ours", "--qos-policy balanced --workers 1 --intra-op-threads 2"),
    "ours 2x1": ("ours", "--qos-policy balanced --workers 1 --instances 2"),
    "ours 2x2": ("ours", "--qos-policy balanced --workers 1 --instances 2 --intra-op-threads 2"),
    "triton 1x0": ("triton", (32, 0, 1, 0)),
    "triton 2x1": ("triton", (32, 0, 2, 1)),
}


def make(label: str, model: dict):
    from mcp26.demo.stack.ports import free_port
    kind, cfg = CONFIGS[label]
    if kind == "ours":
        return bp.Ours(model, cfg.split())
    from benchmarks.peers.triton import TritonPeer
    max_batch, delay, count, intra = cfg
    return TritonPeer(bp.ROOT, [{**model, "max_batch": max_batch, "max_queue_delay_us": delay, "instances": count,
                                 "intra_op_threads": intra}], free_port(), free_port(), free_port())


def triton_ready() -> bool:
    from benchmarks.peers import common, triton
    return common.venv_ready(common.venv_dir(bp.ROOT, "triton"), triton.REQUIREMENTS)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--protocols", default="rest,grpc")
    ap.add_argument("--concurrency", default="16,64")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"any of {', '.join(CONFIGS)}")
    ap.add_argument("--json", default=os.path.join(bp.ROOT, "artifacts", "bench", "instances.json"))
    a = ap.parse_args(argv)
    labels = [c for c in a.configs.split(",") if c]
    unknown = set(labels) - set(CONFIGS)
    if unknown:
        ap.error(f"unknown --configs {', '.join(sorted(unknown))}; there are: {', '.join(CONFIGS)}")
    if any(CONFIGS[c][0] == "triton" for c in labels) and not triton_ready():
        print("no Triton peer venv (python -m benchmarks peers installs it): ours only", file=sys.stderr)
        labels = [c for c in labels if CONFIGS[c][0] == "ours"]
    points = [(p, int(c)) for p in a.protocols.split(",") for c in a.concurrency.split(",")]
    model = bp.model_spec("mlp", bp.model_files()["mlp"])
    load0, t0 = os.getloadavg()[0], time.time()
    runs: dict = {}
    for r in range(a.rounds):
        for label in bp.turn_order(labels, r):
            server = make(label, model).start()
            try:
                for proto, c in points:
                    url = server.grpc_url("mlp") if proto == "grpc" else server.rest_url("mlp")
                    out = bp.run_load(bp.bench_argv(url, proto == "grpc", c, a.seconds, bp.MLP_IN),
                                      timeout=a.seconds + 60)
                    runs.setdefault(f"{proto} c={c}", {}).setdefault(label, []).append(out)
            finally:
                server.stop()
    table = {pt: {label: bp.median_point(rs) for label, rs in by.items()} for pt, by in runs.items()}
    print(f"builtin:mlp, req/s (median of {a.rounds}; p50 ms), load average {load0:.2f} -> {os.getloadavg()[0]:.2f}")
    print(f"{'point':10s} " + " ".join(f"{label:>18s}" for label in labels) + "   2x1 / 1x2")
    for pt, cells in table.items():
        row = " ".join(f"{cells[lb]['rps']:9.0f} {cells[lb]['p50_ms'] or 0:6.1f} ms " for lb in labels)
        ratio = bp.ratio(cells.get("ours 2x1"), cells.get("ours 1x2"))
        print(f"{pt:10s} {row}  {'' if ratio is None else f'{ratio:.2f}x'}")
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({"configs": {lb: CONFIGS[lb] for lb in labels}, "load_average_start": load0,
                   "load_average_end": os.getloadavg()[0], "wall_s": round(time.time() - t0, 1),
                   "points": table}, f, indent=1)
    print(f"wrote {os.path.relpath(a.json)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
