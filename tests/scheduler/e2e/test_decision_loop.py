"""The decision loop for real: two decoder replicas behind a gateway the control plane
feeds (the header-contract filter over ECDS), `mcpctl scheduler run` over their
InferencePool. Long generations fill one replica's KV-cache budget (--kv-cache-mb 1)
past 90 %; the built-in policy remaps standard -> batch; the class the upstream
receives behind the gateway changes within a couple of periods, and comes back
after the hold. A policy that raises or is slow keeps the last decision."""
import http.client
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from harness.loop_stack import WASM, LoopStack

pytestmark = pytest.mark.e2e

PERIOD_MS, HOLD_S = 200, 2.0


def _loop(stack: LoopStack, *extra: str):
    """`mcpctl scheduler run` with this test's period and hold (the seed plugin from the shared cache)."""
    return stack.start_loop("--remap-hold-s", str(HOLD_S), *extra, period_ms=PERIOD_MS)


def _status(loop) -> dict:
    """What `mcpctl scheduler status --json` prints (the CLI, not only the HTTP view)."""
    out = subprocess.run([sys.executable, "-m", "mcp26.mesh.cli", "scheduler", "status", "--admin", loop.admin, "--json"],
                         capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def stack():
    if not os.path.exists(WASM):
        pytest.skip("run `make wasm` first")
    st = LoopStack(replica_args=("--kv-cache-mb", "1")).start()
    try:
        yield st
    finally:
        st.close()


def _fill_kv(gw_port, n=8):
    """Long generations through the gateway: each holds KV blocks of a 1 MB budget."""
    def one(i):
        body = json.dumps({"model": "tiny-decoder", "prompt": f"{i} " + "x" * 600, "max_tokens": 160})
        try:
            conn = http.client.HTTPConnection("127.0.0.1", gw_port, timeout=60)
            conn.request("POST", "/v1/completions", body=body,
                         headers={"host": "models.example.com", "content-type": "application/json"})
            conn.getresponse().read()
        except OSError:
            pass
    ts = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in ts:
        t.start()
    return ts


def _wait(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_memory_over_90_percent_remaps_standard_to_batch_then_restores(stack):
    loop = _loop(stack)
    try:
        _wait(lambda: _status(loop)["cycles"] > 3, 10, "the loop never cycled")
        assert stack.qos_seen() == "standard"
        threads = _fill_kv(stack.gw_port)
        # the loop sees a replica over 90 % (from the KV budget: no GPU, no cgroup limit here) ...
        over_at = None
        deadline = time.monotonic() + 20
        while over_at is None:
            st = _status(loop)
            reps = (st.get("latest") or {}).get("inputs", {}).get("replicas", [])
            if any(r["memory_fraction"] > 0.9 for r in reps):
                over_at = time.monotonic()
                assert {r["memory_source"] for r in reps} == {"kv-budget"}
            assert time.monotonic() < deadline, json.dumps(st["latest"]["inputs"])
            time.sleep(0.02)
        # ... and within a couple of periods Envoy gives standard traffic the batch class
        _wait(lambda: stack.qos_seen() == "batch", 2.0, "standard traffic never served as batch")
        took = time.monotonic() - over_at
        assert took < 2 * PERIOD_MS / 1e3 + 0.6, took
        st = _status(loop)
        remaps = st["in_force"]["class_remaps"]
        assert [(r["from"], r["to"]) for r in remaps] == [("standard", "batch")]
        assert 0 < remaps[0]["expires_in_s"] <= HOLD_S
        remap_decision = next(d for d in st["decisions"] for a in d.get("actions", []) if a["kind"] == "remap-class")
        assert "memory > 90%" in next(a["reason"] for a in remap_decision["actions"] if a["kind"] == "remap-class")
        assert remap_decision["call_ms"] >= 0 and remap_decision["inputs"]["replicas"]
        # the control plane serves it too
        code, text = stack.cp.get("/scheduler")
        assert code == 200 and json.loads(text)["class_remaps"][0]["to"] == "batch"
        # the human-readable status names the memory source and the remap's expiry
        out = subprocess.run([sys.executable, "-m", "mcp26.mesh.cli", "scheduler", "status", "--admin", loop.admin],
                             capture_output=True, text=True, timeout=20).stdout
        assert "kv-budget" in out and "standard -> batch" in out, out
        # the default policy is the seed table as a Wasm plugin, its calls and cost in the status
        assert st["policy"].startswith("wasm:seed table"), st["policy"]
        assert st["plugin"]["calls"]["decide"] >= st["cycles"] - 1 and st["plugin"]["failures"] == {}
        assert st["plugin"]["cost_us"]["decide"]["p50"] > 0 and "plugin " in out and "decide p50/p99" in out, out
        for t in threads:
            t.join(60)
        # memory drops (idle KV blocks go after 5 s) and the hold runs out: standard again
        _wait(lambda: stack.qos_seen() == "standard", 5 + HOLD_S + 6, "never restored to standard")
    finally:
        loop.stop()


def test_a_policy_that_raises_or_is_slow_keeps_the_last_decision(stack, tmp_path):
    flag = tmp_path / "mode"
    flag.write_text("ok")
    policy = tmp_path / "policy.py"
    policy.write_text(f"""
import time
from mcp26.scheduler.decisions import Action
def decide(signals):
    mode = open({str(flag)!r}).read().strip()
    if mode == "raise":
        raise RuntimeError("policy bug")
    if mode == "slow":
        time.sleep(1.0)
    return [Action("remap-class", "standard", "batch", hold_s=4.0, reason="test policy")]
""")
    loop = _loop(stack, "--policy", f"python:{policy}", "--budget-ms", "50")
    try:
        _wait(lambda: stack.qos_seen() == "batch", 3, "the policy's remap never applied")
        decided = _status(loop)["in_force"]["decided_in_cycle"]
        flag.write_text("raise")
        st = _wait(lambda: (lambda s: s if s["failures"]["raised"] >= 2 else None)(_status(loop)), 3, "never raised")
        assert st["last_failure"]["reason"] == "raised" and "policy bug" in st["last_failure"]["detail"]
        assert st["in_force"]["class_remaps"][0]["to"] == "batch"     # the last decision stands ...
        assert stack.qos_seen() == "batch"                      # ... and Envoy still applies it
        flag.write_text("slow")
        st = _wait(lambda: (lambda s: s if s["failures"]["over_budget"] >= 1 else None)(_status(loop)), 4, "never slow")
        assert st["last_failure"]["reason"] == "over_budget"
        assert st["in_force"]["decided_in_cycle"] >= decided
        failed = [d for d in st["decisions"] if "failure" in d]
        assert failed and all(d["call_ms"] >= 0 for d in failed)
        assert failed[-1]["call_ms"] >= 45       # the budget was spent waiting
        assert stack.qos_seen() == "batch"
    finally:
        loop.stop()
        flag.write_text("ok")
        stack.clear_remaps()          # leave no remap behind for another test
