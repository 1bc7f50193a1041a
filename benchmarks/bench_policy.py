"""Policy plugin call cost: the same policy as a Wasm component (componentize-py, wasmtime) and
as plain Python, side by side in one run.

- decide(): the seed table (scheduler/plugins/policies/seed_table.py), one host import per call
  (its log line); score(): the latency example (one WASI-NN inference per call, ONNX Runtime).
- The component through PolicyHost (conversion from scheduler.decisions included) with fuel
  metering on (fuel + epoch deadline) and off (epoch deadline only); the raw export call too.
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


def _signals():
    from scheduler.decisions import FlowSignals, ReplicaSignals, Signals
    return Signals(now_s=1.0,
                   replicas=tuple(ReplicaSignals(f"10.0.0.{i}:8000", {"standard": i, "batch": 1}, running=2,
                                                 kv_utilisation=0.1 * i, memory_fraction=0.5 + 0.1 * i,
                                                 memory_source="nvml") for i in range(1, 5)),
                   flows=tuple(FlowSignals(f"10.1.0.{i}:5000->10.0.0.1:8000", rtt_ms=10.0 * i,
                                           payload_bytes=400_000 * i) for i in range(1, 9)))


def _endpoints():
    from scheduler.decisions import EndpointInfo
    return [EndpointInfo(f"10.0.0.{i}:8000", queue_depth=i, kv_utilisation=0.1 * i) for i in range(1, 5)]


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
    from scheduler.decisions import RequestInfo
    from scheduler.plugins import convert
    from scheduler.plugins.host import PolicyHost
    from scheduler.plugins.sandbox import Limits
    # A generous wall-clock backstop: this measures cost, and a loaded machine's stalls count
    # against an epoch deadline (a cut-off call would be a failure, not a sample).
    limits = Limits(deadline_ms=5000.0) if fuel else Limits(fuel=None, deadline_ms=5000.0)
    out = {}
    signals, endpoints, request = _signals(), _endpoints(), RequestInfo("standard", 100, "s")
    seed = PolicyHost(POLICIES / "seed_table.py", limits=limits, cache_dir=CACHE)
    out["seed_load"] = seed.load()
    assert seed.decide(signals).ok
    out["decide"] = _time(lambda: seed.decide(signals), calls)
    raw = convert.signals_to_wit(signals)
    plugin = seed._active.plugin
    out["decide_raw_call"] = _time(lambda: plugin.call("decide", raw), calls)
    out["decide_fuel"] = seed.stats()["cost_us"]["decide"]["fuel_last"]
    lat = PolicyHost(POLICIES / "latency_score.py", limits=limits, cache_dir=CACHE)
    out["latency_load"] = lat.load()
    assert lat.score(request, endpoints) is not None
    out["score"] = _time(lambda: lat.score(request, endpoints), calls)
    out["failures"] = seed.stats()["failures"] | lat.stats()["failures"]
    return out


def _load_times() -> dict:
    from wasmtime.component import Component
    from scheduler.plugins.host import PolicyHost
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
    from scheduler.plugins.build import WIT_DIR, WORLD, componentize_py
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
    from scheduler.plugins.inference import OnnxInference

    log = logging.getLogger("scheduler.plugins")
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
    s = _signals()
    # The bindings' own dataclasses, as the guest sees them after lifting.
    sig = wt.Signals(s.now_s, [wt.ReplicaSignals(r.endpoint, [wt.ClassDepth(c, d) for c, d in r.queue_depth.items()],
                                                 r.running, r.compute_p99_ms, r.tokens_per_second, r.kv_utilisation,
                                                 r.kv_hit_rate, r.memory_fraction, r.memory_source, r.age_ms)
                               for r in s.replicas],
                     [wt.FlowSignals(f.flow, f.rtt_ms, f.payload_bytes, f.age_ms) for f in s.flows])
    eps = [wt.EndpointInfo(e.endpoint, e.queue_depth, e.kv_utilisation, e.compute_p99_ms) for e in _endpoints()]
    req = wt.RequestInfo("standard", 100, "s")
    seed, lat = seed_table.WitWorld(), latency_score.WitWorld()
    return {"decide": _time(lambda: seed.decide(sig), calls), "score": _time(lambda: lat.score(req, eps), calls)}


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
    print(f"{'call':<28}{'p50 µs':>10}{'p99 µs':>10}{'CPU µs':>10}{'CPU vs plain':>14}")
    rows = [("decide plain Python", plain["decide"], plain["decide"]),
            ("decide component fuel on", on["decide"], plain["decide"]),
            ("decide component fuel off", off["decide"], plain["decide"]),
            ("decide raw export, fuel on", on["decide_raw_call"], plain["decide"]),
            ("score plain Python", plain["score"], plain["score"]),
            ("score component fuel on", on["score"], plain["score"]),
            ("score component fuel off", off["score"], plain["score"])]
    for name, s, base in rows:
        print(f"{name:<28}{s['p50_us']:>10.1f}{s['p99_us']:>10.1f}{s['cpu_us_per_call']:>10.1f}"
              f"{s['cpu_us_per_call'] / base['cpu_us_per_call']:>13.1f}x")
    ld = result["load"]
    print(f"\nfuel per seed-table decide: {on['decide_fuel']:,}")
    print(f"load {ld['component_mb']} MB component: cold compile {ld['cold_compile_s']} s, "
          f"deserialize {ld['deserialize_s']} s ({ld['ratio']}x); serialized {ld['cached_mb']} MB")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2, default=str))
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
