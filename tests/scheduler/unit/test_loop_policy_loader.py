"""The loop's policy loader: the Wasm plugin host behind the loop's policy interface (a
fake host here: the real components are tests/scheduler/e2e/test_policy_plugins.py's), a failed plugin
call counted by the host's reason with the last decision kept, builtin-python for comparison."""
import asyncio

import pytest

from mcp26.scheduler.decisions import Action, ReplicaSignals, Signals
from mcp26.scheduler.loop.actions import ActionApplier
from mcp26.scheduler.loop.loop import DecisionLoop
from mcp26.scheduler.loop.policy import PolicyFailed, WasmPolicy, load_policy
from mcp26.scheduler.plugins.host import Decision


class FakeHost:
    def __init__(self):
        self.fail = None
        self.calls = 0

    def decide(self, signals):
        self.calls += 1
        if self.fail:
            return Decision((), False, f"{self.fail}: cut off", 10.0, "abc")
        return Decision((Action("remap-class", "standard", "batch", hold_s=60.0),
                         Action("class-weight", "latency-critical", weight=3.0)), True, None, 10.0, "abc")

    def stats(self):
        return {"calls": {"decide": self.calls}, "failures": {}, "cost_us": {"decide": {"p50": 10.0}}}

    def close(self):
        self.closed = True


def test_wasm_policy_overrides_the_hold_and_raises_the_hosts_reason():
    host = FakeHost()
    p = WasmPolicy(host, hold_s=2.0)
    acts = p.decide(Signals(1.0))
    assert [(a.kind, a.hold_s) for a in acts] == [("remap-class", 2.0), ("class-weight", 0.0)]
    host.fail = "fuel"
    with pytest.raises(PolicyFailed) as e:
        p.decide(Signals(1.0))
    assert e.value.reason == "fuel" and e.value.detail == "cut off"


def test_the_loop_counts_plugin_failures_by_reason_and_shows_the_plugins_stats(monkeypatch):
    host = FakeHost()
    applier = ActionApplier("127.0.0.1:1")

    async def fake_remap(a, now):                     # no control plane here: take the remap as posted
        applier.remaps[a.subject] = {"to": a.value, "expires_at": now + a.hold_s}
        return {"applied": True, "expires_at": now + a.hold_s}
    monkeypatch.setattr(applier, "_remap", fake_remap)
    loop = DecisionLoop(WasmPolicy(host), "wasm:fake", lambda: [], applier, period_s=0.05)

    async def go():
        await loop.cycle()
        host.fail = "trap"
        await loop.cycle()
        await loop.cycle()
        st = loop.status()
        await loop.close()
        return st
    st = asyncio.run(go())
    assert st["failures"]["plugin:trap"] == 2 and st["last_failure"]["detail"] == "cut off"
    assert st["in_force"]["decided_in_cycle"] == 1                     # the last decision stands
    assert [r["to"] for r in st["in_force"]["class_remaps"]] == ["batch"]
    assert st["plugin"]["calls"]["decide"] == 3 and host.closed


def test_builtin_python_and_python_files_load_without_a_wasm_build(tmp_path):
    p, name = load_policy("builtin-python", hold_s=5.0)
    hot = Signals(1.0, replicas=(ReplicaSignals("a:1", memory_fraction=0.95, memory_source="kv-budget"),))
    assert name.startswith("builtin-python") and [a.hold_s for a in p.decide(hot) if a.kind == "remap-class"] == [5.0]
    f = tmp_path / "pol.py"
    f.write_text("def decide(signals):\n    return []\n")
    p, name = load_policy(f"python:{f}")
    assert name == f"python:{f}" and p.decide(hot) == []
    for bad in (str(tmp_path / "missing.py"), str(f).replace(".py", ".txt")):
        with pytest.raises(ValueError):
            load_policy(bad)
