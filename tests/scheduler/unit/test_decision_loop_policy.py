"""The built-in decision table and the replica signals, socket-free."""
import os

from mcp26.scheduler.decisions import FlowSignals, ReplicaSignals, Signals
from mcp26.scheduler.loop.builtin_policy import BuiltinPolicy
from mcp26.scheduler.loop.signals import cgroup_fraction, replica_signals


def _kinds(actions):
    return [(a.kind, a.subject, a.value) for a in actions]


def test_memory_over_90_percent_remaps_standard_to_batch_for_the_hold():
    p = BuiltinPolicy()
    calm = Signals(1.0, replicas=(ReplicaSignals("10.0.0.1:8000", memory_fraction=0.9, memory_source="kv-budget"),))
    assert ("remap-class", "standard", "batch") not in _kinds(p.decide(calm))
    hot = Signals(1.0, replicas=(ReplicaSignals("10.0.0.1:8000", memory_fraction=0.91, memory_source="cgroup"),))
    remap = [a for a in p.decide(hot) if a.kind == "remap-class"]
    assert len(remap) == 1 and remap[0].hold_s == 60.0 and "cgroup" in remap[0].reason


def test_low_rtt_large_payload_flow_is_upgraded_with_two_reserved_threads():
    flows = (FlowSignals("a->b", rtt_ms=3, payload_bytes=1_500_000), FlowSignals("c->d", rtt_ms=60, payload_bytes=2 << 20),
             FlowSignals("e->f", rtt_ms=3, payload_bytes=1_000_000))      # exactly 1 MB: not more
    up = [a for a in BuiltinPolicy().decide(Signals(1.0, flows=flows)) if a.kind == "upgrade-flow"]
    assert [(a.subject, a.value, a.reserved_threads) for a in up] == [("a->b", "latency-critical", 2)]


def test_high_priority_class_weighs_three():
    w = [a for a in BuiltinPolicy().decide(Signals(1.0)) if a.kind == "class-weight"]
    assert [(a.subject, a.weight) for a in w] == [("interactive", 3.0)]      # High's class


def test_memory_source_falls_back_to_the_kv_budget_and_says_so():
    load = {"running": 2, "kv_cache_bytes": 950, "kv_cache_capacity_bytes": 1000, "kv_cache_utilization": 0.5,
            "models": [{"waiting_by_priority_level": {"3": 2, "4": 1}}, {"waiting_by_priority_level": {"3": 1}}]}
    r = replica_signals("127.0.0.2:8000", load, 12.0, pid=None)
    assert (r.memory_source, r.memory_fraction) == ("kv-budget", 0.95)
    assert r.queue_depth == {"standard": 3, "batch": 1} and r.running == 2 and r.age_ms == 12.0


def test_cgroup_fraction_reads_the_process_cgroup(tmp_path):
    pid = os.getpid()
    with open(f"/proc/{pid}/cgroup") as f:
        path = next(line.split(":", 2)[2].strip() for line in f if line.startswith("0::"))
    d = tmp_path / path.lstrip("/")
    d.mkdir(parents=True, exist_ok=True)
    (d / "memory.max").write_text("1000\n")
    (d / "memory.current").write_text("930\n")
    assert cgroup_fraction(pid, root=str(tmp_path)) == 0.93
    (d / "memory.max").write_text("max\n")
    assert cgroup_fraction(pid, root=str(tmp_path)) is None
