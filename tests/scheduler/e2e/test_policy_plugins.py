"""Policy plugins as real components: built by componentize-py, run by wasmtime in the sandbox.

"e2e" because every test builds and runs real Wasm components. Builds and compiled components
are kept in .cache/policy-tests (keyed by content, so a second session reuses them: a cold
session builds three plugins, ~15 s each, and compiles them); the cache-ratio test compiles one
component cold every time, since that is what it measures.
"""
from __future__ import annotations

import ast
import hashlib
import pathlib
import shutil
import threading
import time

import numpy as np
import pytest

from mcp26.mesh import qos as Q

from mcp26.scheduler.decisions import Action, EndpointInfo, FlowSignals, ReplicaSignals, RequestInfo, Signals
from mcp26.scheduler.plugins import latency_model
from mcp26.scheduler.plugins.host import PolicyHost
from mcp26.scheduler.plugins.sandbox import Limits
from harness.paths import ROOT, TEST_DATA

pytestmark = pytest.mark.e2e

POLICIES = ROOT / "scheduler" / "plugins" / "policies"
MISBEHAVING = TEST_DATA / "policy_plugins" / "misbehaving.py"
CACHE = ROOT / ".cache" / "policy-tests"


@pytest.fixture(scope="session")
def seed_host():
    host = PolicyHost(None, cache_dir=CACHE)        # None: the built-in default, the seed table
    host.load()
    return host


@pytest.fixture(scope="session")
def latency_host():
    host = PolicyHost(POLICIES / "latency_score.py", cache_dir=CACHE)
    host.load()
    return host


def _misbehaving(**limits) -> PolicyHost:
    # Same engine settings as the default (fuel and epoch on), so one compiled form serves all.
    host = PolicyHost(MISBEHAVING, limits=Limits(**limits), cache_dir=CACHE)
    host.load()
    return host


def _replica(endpoint, memory=0.3, source="nvml", **kw):
    return ReplicaSignals(endpoint, {"standard": 2, "batch": 1}, memory_fraction=memory, memory_source=source, **kw)


def test_seed_table_gives_the_seeds_actions(seed_host):
    signals = Signals(now_s=100.0, replicas=(_replica("10.0.0.1:8000", 0.95), _replica("10.0.0.2:8000", 0.5)),
                      flows=(FlowSignals("10.1.0.1:5000->10.0.0.1:8000", rtt_ms=0.4, payload_bytes=1_500_000),
                             FlowSignals("10.1.0.2:5000->10.0.0.1:8000", rtt_ms=80.0, payload_bytes=2_000_000),
                             FlowSignals("10.1.0.3:5000->10.0.0.1:8000", rtt_ms=0.4, payload_bytes=500_000)))
    d = seed_host.decide(signals)
    assert d.ok, d.error
    by_kind = {a.kind: a for a in d.actions}
    assert [a.kind for a in d.actions] == ["remap-class", "upgrade-flow", "class-weight"]
    remap = by_kind["remap-class"]
    # the component hard-codes class names: they must be mesh.qos's table of the seed's names
    assert (remap.subject, remap.value, remap.hold_s) == (Q.DOWNGRADE_FROM.header_value, Q.DOWNGRADE_TO.header_value, 60.0)
    assert "10.0.0.1:8000" in remap.reason and "10.0.0.2:8000" not in remap.reason and "nvml" in remap.reason
    up = by_kind["upgrade-flow"]
    assert (up.subject, up.value, up.reserved_threads) == ("10.1.0.1:5000->10.0.0.1:8000", Q.UPGRADE_TO.header_value,
                                                           Q.RESERVED_THREADS)
    w = by_kind["class-weight"]
    assert (w.subject, w.weight) == (Q.HIGH_WEIGHT_CLASS.header_value, float(Q.HIGH_WEIGHT_CLASS.weight))

    calm = seed_host.decide(Signals(now_s=101.0, replicas=(_replica("10.0.0.1:8000", 0.90, "kv-budget"),)))
    assert calm.ok and [a.kind for a in calm.actions] == ["class-weight"]        # 90 % is not > 90 %
    assert seed_host.stats()["failures"] == {}


def _embedded_model() -> bytes:
    import base64
    tree = ast.parse((POLICIES / "latency_score.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "MODEL_ONNX_B64":
            return base64.b64decode(ast.literal_eval(node.value))
    raise AssertionError("latency_score.py embeds no MODEL_ONNX_B64")


def test_score_through_wasi_nn_equals_onnxruntime(latency_host):
    import onnxruntime as ort
    endpoints = [EndpointInfo("10.0.0.1:8000", queue_depth=0, kv_utilisation=0.1),
                 EndpointInfo("10.0.0.2:8000", queue_depth=7, kv_utilisation=0.93),
                 EndpointInfo("10.0.0.3:8000", queue_depth=3, kv_utilisation=0.377)]
    scores = latency_host.score(RequestInfo("standard", 1200, "s1"), endpoints)
    assert scores is not None, latency_host.last_error

    session = ort.InferenceSession(_embedded_model(), providers=["CPUExecutionProvider"])
    x = np.array([[e.queue_depth, e.kv_utilisation] for e in endpoints], dtype=np.float32)
    direct = session.run(None, {latency_model.INPUT: x})[0][:, 0]
    assert scores == [-float(v) for v in direct]                                  # bit for bit (f32)
    # ... and the embedded model is the documented linear one.
    expected = x @ np.array(latency_model.WEIGHTS, dtype=np.float32) + latency_model.BIAS_MS
    assert np.allclose(direct, expected, rtol=1e-6)
    assert scores.index(max(scores)) == 0

    d = latency_host.decide(Signals(1.0, replicas=(_replica("10.0.0.1:8000"), _replica("10.0.0.2:8000", kv_utilisation=0.9))))
    assert d.ok, d.error
    weights = {a.subject: a.weight for a in d.actions if a.kind == "endpoint-weight"}
    assert weights["10.0.0.1:8000"] > weights["10.0.0.2:8000"] > 0


def _healthy(name="ok") -> Signals:
    return Signals(1.0, replicas=(_replica(name),))


def test_looping_plugin_is_cut_off_and_the_previous_decision_stands():
    host = _misbehaving()                                       # default limits: fuel 100 M, 500 ms
    before = host.decide(_healthy())
    assert before.ok and before.actions[0].reason == "healthy: ok"
    t0 = time.perf_counter()
    d = host.decide(_healthy("loop"))
    took = time.perf_counter() - t0
    assert not d.ok and d.error.startswith("fuel:"), d.error
    assert d.actions == before.actions
    assert took < 1.0, f"fuel cut-off took {took:.2f} s"
    after = host.decide(_healthy("again"))                      # a fresh instance serves the next call
    assert after.ok and after.actions[0].reason == "healthy: again"
    assert host.stats()["failures"] == {"fuel": 1} and host.stats()["instantiations"] == 2

    # With fuel to spare, the wall-clock deadline is what cuts it off, within a tick or two of it.
    timed = _misbehaving(fuel=10**13, deadline_ms=50.0)
    timed.decide(_healthy())
    t0 = time.perf_counter()
    d = timed.decide(_healthy("loop"))
    took_ms = (time.perf_counter() - t0) * 1000
    assert not d.ok and d.error.startswith("deadline:"), d.error
    assert 45 <= took_ms < 250, f"deadline of 50 ms cut off after {took_ms:.0f} ms"
    assert d.actions == timed.last_decision and d.actions[0].reason == "healthy: ok"


def test_trapping_plugin_keeps_the_last_decision_and_is_counted():
    host = _misbehaving()
    good = host.decide(_healthy())
    for _ in range(2):
        d = host.decide(_healthy("raise"))
        assert not d.ok and d.error.startswith("exception: ZeroDivisionError: "), d.error
        assert d.actions == good.actions
    assert host.stats()["failures"] == {"exception": 2}
    assert host.decide(_healthy("back")).ok


def test_memory_hungry_plugin_hits_the_limit():
    host = _misbehaving(fuel=10**13, deadline_ms=20_000.0, memory_bytes=64 << 20)
    good = host.decide(_healthy())
    d = host.decide(_healthy("hoard"))
    assert not d.ok and d.error.startswith("memory: hit its 64 MiB memory limit"), d.error
    assert d.actions == good.actions
    assert host.stats()["failures"] == {"memory": 1}
    assert host.decide(_healthy()).ok                            # a fresh instance, memory back


def test_hot_swap_under_calls_fails_none(tmp_path, seed_host):
    policy = tmp_path / "policy.py"
    shutil.copy(POLICIES / "seed_table.py", policy)
    host = PolicyHost(policy, cache_dir=CACHE)
    host.load()
    seed_sha = host.stats()["plugin"]["sha256"]
    host.start_watching(interval_s=0.05)
    results, stop = [], threading.Event()

    def caller():
        while not stop.is_set() and len(results) < 20_000:
            results.append(host.decide(_healthy()))

    t = threading.Thread(target=caller)
    t.start()
    try:
        time.sleep(0.3)
        policy.write_text(MISBEHAVING.read_text())               # the watcher rebuilds (cached) and swaps
        deadline = time.monotonic() + 60
        while host.swaps == 0 and host.swap_failures == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        stop.set()
        t.join(timeout=10)
        host.close()
    assert host.swaps == 1 and host.swap_failures == 0, host.last_swap_error
    failed = [r for r in results if not r.ok]
    assert failed == [] and len(results) > 20
    plugins = [r.plugin for r in results]
    new_sha = host.stats()["plugin"]["sha256"]
    assert new_sha != seed_sha
    # Every call before the swap answered from the old plugin, every one after from the new.
    switch = plugins.index(new_sha)
    assert set(plugins[:switch]) == {seed_sha} and set(plugins[switch:]) == {new_sha}
    assert results[-1].actions == (Action("class-weight", "latency-critical", "", 2.0, 0.0, 0, "healthy: ok"),)


@pytest.mark.slow      # a cold compile's time against a deserialize
def test_serialized_component_loads_much_faster_than_a_cold_compile(seed_host):
    from wasmtime.component import Component
    info = seed_host.stats()["plugin"]
    cache_file = seed_host.compiled.path_for(info["sha256"], seed_host.limits.engine_key())
    wasm = next(p for p in (CACHE / "built").glob("*.wasm") if hashlib.sha256(p.read_bytes()).hexdigest() == info["sha256"])
    t0 = time.perf_counter()
    Component(seed_host.engine, wasm.read_bytes())
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    Component.deserialize_file(seed_host.engine, str(cache_file))
    warm = time.perf_counter() - t0
    print(f"cold compile {cold:.2f} s, deserialize {warm:.3f} s, ratio {cold / warm:.0f}x")
    assert cold / warm >= 10, f"cold {cold:.2f} s vs deserialize {warm:.3f} s"


def test_a_plugin_sees_the_resource_view_write_bursts_and_the_ring_fields():
    """The seed's resource view, the tracer's bursts and the flows' serving figures cross into
    the component (wit/policy.wit) with their values, not only the Python policies."""
    import ast as _ast
    from mcp26.scheduler.decisions import EngineSignals, LinkSignals, ResourceSignals, WriteBurstSignals
    host = _misbehaving()
    res = ResourceSignals(numa_nodes=(0, 1), numa_cpus=((0, 1), (2, 3)), numa_distance=((10.0, 21.0), (21.0, 10.0)),
                          numa_source="sysfs /sys/devices/system/node", pcie_links=(LinkSignals("0000:3b:00.0", 31.5),),
                          engine=(EngineSignals("10.0.0.1:8000", running=2.5),))
    d = host.decide(Signals(now_s=1.0, replicas=(_replica("echo", 0.1),),
                            flows=(FlowSignals("a->b", ingress_rtt_ms=2.5, tokens_per_second=640.0, kv_hit_rate=0.5),),
                            write_bursts=(WriteBurstSignals(77, "10.0.0.1:8000", 1 << 20),), resources=res,
                            trigger="ring"))
    assert d.ok, d.error
    seen = _ast.literal_eval(d.actions[0].reason)
    assert seen == {"numa": [[10.0, 21.0], [21.0, 10.0]], "cpus": [[0, 1], [2, 3]],
                    "numa_source": "sysfs /sys/devices/system/node", "links": [["0000:3b:00.0", 31.5]],
                    "engine": [["10.0.0.1:8000", 2.5]], "bursts": [[77, "10.0.0.1:8000", 1 << 20]],
                    "flows": [["a->b", 2.5, 640.0, 0.5]], "trigger": "ring"}
    host.close()
