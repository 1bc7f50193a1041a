"""Policy plugin call cost: the same policy as a Wasm component (componentize-py, wasmtime) and
as plain Python, side by side in one run.

- decide(): the seed table (scheduler/plugins/policies/seed_table.py), one host import per call
  (its log line); score(): the latency example (one WASI-NN inference per call, ONNX Runtime);
  each at 2 and 20 replicas/endpoints (4 flows).
- The component through PolicyHost (encoding from mcp26.scheduler.decisions and checking the answer
  included) with fuel metering on (fuel + epoch deadline) and off (epoch deadline only); the
  export call alone (already-encoded signals) too.
- Plain Python: the very same plugin file imported in CPython with componentize-py's generated
  bindings, its host imports bound to the same host functions (a subprocess, PYTHONPATH set).
- Loading: cold compile vs deserializing the cached compiled form.

Run from the repo root: `python -m benchmarks policy` (or `python -m benchmarks.bench_policy --calls N`);
writes artifacts/bench/policy.json.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "artifacts" / "bench" / "policy.json"
CACHE = ROOT / ".cache" / "policy-bench"
POLICIES = ROOT / "scheduler" / "plugins" / "policies"


SIZES = (2, 20)                   # replicas (decide) and endpoints (score)
FLOWS = 4


def _signals(replicas: int):
    from mcp26.scheduler.decisions import FlowSignals, ReplicaSignals, Signals
    # One replica in three over 90 % memory: the remap's reason names each hot one.
    return Signals(now_s=1.0,
                   replicas=tuple(ReplicaSignals(f"10.0.{i // 250}.{i % 250 + 1}:8000", {"standard": i % 7, "batch": 1},
                                                 running=2, compute_p99_ms=40.0 + i, tokens_per_second=900.0,
                                                 kv_utilisation=(i % 10) / 10, kv_hit_rate=0.5,
                                                 memory_fraction=0.95 if i % 3 == 0 else 0.6,
                                                 memory_source="nvml", age_ms=12.0) for i in range(replicas)),
                   flows=tuple(FlowSignals(f"10.1.0.{i}:5000->10.0.0.1:8000", rtt_ms=10.0 * i,
                                           payload_bytes=400_000 * i) for i in range(1, FLOWS + 1)))


def _endpoints(n: int):
    from mcp26.scheduler.decisions import EndpointInfo
    return [EndpointInfo(f"10.0.{i // 250}.{i % 250 + 1}:8000", queue_depth=i % 7, kv_utilisation=(i % 10) / 10)
            for i in range(n)]


def _stats(samples_us: list[float]) -> dict:
    s = sorted(samples_us)
    return {"p50_us": round(statistics.median(s), 1), "p99_us": round(s[min(len(s) - 1, int(len(s) * 0.99))], 1),
            "n": len(s)}


def _time(fn, calls: int) -> dict:
    for _ in range(min(50, calls)):
        fn()
    samples = []
    cpu0 = time.process_time()
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    # CPU time per call too: on a shared machine wall-clock percentiles include waiting for a core.
    return _stats(samples) | {"cpu_us_per_call": round((time.process_time() - cpu0) / calls * 1e6, 1)}


def _component(calls: int, fuel: bool) -> dict:
    from mcp26.scheduler.decisions import RequestInfo
    from mcp26.scheduler.plugins import convert
    from mcp26.scheduler.plugins.host import PolicyHost
    from mcp26.scheduler.plugins.sandbox import Limits
    # A generous wall-clock backstop: this measures cost, and a loaded machine's stalls count
    # against an epoch deadline (a cut-off call would be a failure, not a sample).
    limits = Limits(deadline_ms=5000.0) if fuel else Limits(fuel=None, deadline_ms=5000.0)
    out: dict = {}
    request = RequestInfo("standard", 100, "s")
    seed = PolicyHost(POLICIES / "seed_table.py", limits=limits, cache_dir=CACHE)
    out["seed_load"] = seed.load()
    lat = PolicyHost(POLICIES / "latency_score.py", limits=limits, cache_dir=CACHE)
    out["latency_load"] = lat.load()
    plugin = seed._active.plugin
    for n in SIZES:
        signals, endpoints = _signals(n), _endpoints(n)
        assert seed.decide(signals).ok and lat.score(request, endpoints) is not None
        out[f"decide_{n}"] = _time(lambda: seed.decide(signals), calls)
        out[f"decide_{n}_fuel"] = seed.stats()["cost_us"]["decide"]["fuel_last"]
        encoded = convert.encode_signals(signals)
        out[f"decide_{n}_export"] = _time(lambda: plugin.call("decide", encoded), calls)
        out[f"score_{n}"] = _time(lambda: lat.score(request, endpoints), calls)
        out[f"score_{n}_fuel"] = lat.stats()["cost_us"]["score"]["fuel_last"]
    out["failures"] = seed.stats()["failures"] | lat.stats()["failures"]
    return out


def _load_times() -> dict:
    from wasmtime.component import Component
    from mcp26.scheduler.plugins.host import PolicyHost
    host = PolicyHost(POLICIES / "seed_table.py", cache_dir=CACHE)
    info = host.load()
    wasm = host._component_bytes(host.source)[0]
    t0 = time.perf_counter()
    Component(host.engine, wasm)
    cold = time.perf_counter() - t0
    path = host.compiled.path_for(info["sha256"], host.limits.engine_key())
    t0 = time.perf_counter()
    Component.deserialize_file(host.engine, str(path))
    warm = time.perf_counter() - t0
    return {"component_mb": round(len(wasm) / 1e6, 1), "cold_compile_s": round(cold, 2),
            "deserialize_s": round(warm, 3), "ratio": round(cold / warm, 1), "cached_mb": round(path.stat().st_size / 1e6, 1)}


def _plain(calls: int) -> dict:
    """The same plugin files in CPython: a subprocess with the bindings on PYTHONPATH."""
    from mcp26.scheduler.plugins.build import WIT_DIR, WORLD, componentize_py
    with tempfile.TemporaryDirectory() as bindings:
        subprocess.run([componentize_py(), "-q", "-d", str(WIT_DIR), "-w", WORLD, "bindings", bindings], check=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([bindings, str(POLICIES), str(ROOT)]))
        done = subprocess.run([sys.executable, "-m", "benchmarks.bench_policy", "--plain-child", "--calls", str(calls)],
                              env=env, cwd=ROOT, capture_output=True, text=True, check=True)
        return json.loads(done.stdout)


def _plain_child(calls: int) -> dict:
    import logging
    import wit_world.imports.host as host
    import wit_world.imports.inference as nn
    from componentize_py_types import Err
    from wit_world.imports import types as wt
    from mcp26.scheduler.plugins.inference import OnnxInference

    log = logging.getLogger("mcp26.scheduler.plugins")
    host.log = lambda level, message: log.log(logging.DEBUG, "plugin: %s", message)
    host.now_ms = lambda: int(time.time() * 1000)
    impl = OnnxInference()

    def wrap(fn):
        def call(*args):
            r = fn(*args)
            if isinstance(r, str):
                raise Err(nn.Error[r.upper().replace("-", "_")])
            return r
        return call
    nn.load = wrap(lambda b, e, t: impl.load(b, e.name.lower(), t.name.lower()))
    nn.init_execution_context = wrap(impl.init_execution_context)
    nn.set_input = wrap(lambda c, i, t: impl.set_input(c, i, t.dimensions, t.tensor_type.name.lower(), t.data))
    nn.compute = wrap(impl.compute)
    nn.get_output = wrap(impl.get_output)

    import latency_score
    import seed_table

    def plain(world):
        # The bindings declare the world's `encoding` export abstract; the build's wrapper defines it.
        return type("Plain", (world,), {"encoding": lambda self: ""})()
    seed, lat = plain(seed_table.WitWorld), plain(latency_score.WitWorld)
    req = wt.RequestInfo("standard", 100, "s")
    out = {}
    for n in SIZES:
        s = _signals(n)
        # The bindings' own dataclasses, as the guest's wrapper hands them to the plugin.
        sig = wt.Signals(s.now_s, [wt.ReplicaSignals(r.endpoint, [wt.ClassDepth(c, d) for c, d in r.queue_depth.items()],
                                                     r.running, r.compute_p99_ms, r.tokens_per_second,
                                                     r.kv_utilisation, r.kv_hit_rate, r.memory_fraction,
                                                     r.memory_source, r.age_ms) for r in s.replicas],
                         [wt.FlowSignals(f.flow, f.rtt_ms, f.payload_bytes, f.age_ms) for f in s.flows])
        eps = [wt.EndpointInfo(e.endpoint, e.queue_depth, e.kv_utilisation, e.compute_p99_ms) for e in _endpoints(n)]
        out[f"decide_{n}"] = _time(lambda: seed.decide(sig), calls)
        out[f"score_{n}"] = _time(lambda: lat.score(req, eps), calls)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--plain-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.plain_child:
        print(json.dumps(_plain_child(args.calls)))
        return 0
    result = {"plain_python": _plain(args.calls),
              "component_fuel_on": _component(args.calls, fuel=True),
              "component_fuel_off": _component(args.calls, fuel=False),
              "load": _load_times()}
    plain, on, off = result["plain_python"], result["component_fuel_on"], result["component_fuel_off"]
    result["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    print(f"{'call':<34}{'p50 µs':>10}{'p99 µs':>10}{'CPU µs':>10}{'CPU vs plain':>14}")
    for export in ("decide", "score"):
        for n in SIZES:
            key, base = f"{export}_{n}", plain[f"{export}_{n}"]
            rows = [(f"{export} {n:>2} plain Python", base), (f"{export} {n:>2} component fuel on", on[key]),
                    (f"{export} {n:>2} component fuel off", off[key])]
            if export == "decide":
                rows.append((f"{export} {n:>2} export call only, fuel", on[f"{key}_export"]))
            for name, s in rows:
                print(f"{name:<34}{s['p50_us']:>10.1f}{s['p99_us']:>10.1f}{s['cpu_us_per_call']:>10.1f}"
                      f"{s['cpu_us_per_call'] / base['cpu_us_per_call']:>13.1f}x")
    ld = result["load"]
    print("\nfuel per call: " + ", ".join(f"{e} {n}: {on[f'{e}_{n}_fuel']:,}" for e in ("decide", "score") for n in SIZES))
    print(f"load {ld['component_mb']} MB component: cold compile {ld['cold_compile_s']} s, "
          f"deserialize {ld['deserialize_s']} s ({ld['ratio']}x); serialized {ld['cached_mb']} MB")
    print(f"failed calls: {on['failures'] | off['failures'] or 0}; load average {result['loadavg']}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2, default=str))
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
