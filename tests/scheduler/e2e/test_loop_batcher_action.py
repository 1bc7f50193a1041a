"""The loop's batcher-policy action carried to a real replica: ActionApplier posts it to the
replica's admin API (`mcpctl serve --admin-port`), and the replica's own status reports the
new batching preset and a policy change (a body it refuses would leave both unchanged)."""
import asyncio
import json
import urllib.request

import pytest

from mcp26.demo.stack.inference_server import InferenceServer
from mcp26.scheduler.decisions import Action
from mcp26.scheduler.loop.actions import ActionApplier

pytestmark = pytest.mark.e2e


def _status(admin: str) -> dict:
    with urllib.request.urlopen(f"http://{admin}/admin/status", timeout=5) as r:
        return json.load(r)


def test_a_batcher_policy_action_reconfigures_the_replica():
    server = InferenceServer("builtin:mlp").start()
    try:
        admin = f"127.0.0.1:{server.admin_port}"
        before = _status(admin)
        endpoint = "127.0.0.1:1"

        async def apply(value: str) -> dict:
            applier = ActionApplier("127.0.0.1:1", replica_admin={endpoint: admin})
            try:
                return (await applier.apply([Action("batcher-policy", endpoint, value)], 0.0, flow_hold_s=1.0))[0]
            finally:
                await applier.close()
        result = asyncio.run(apply("throughput"))
        assert result.get("applied") and "error" not in result, result
        after = _status(admin)
        assert after["models"][0]["batching"] != before["models"][0]["batching"], after["models"][0]["batching"]
        changes = sum(len(v) for v in after["policy_changes"].values())
        assert changes == sum(len(v) for v in before["policy_changes"].values()) + 1
        # a preset the replica does not know is refused, and nothing changes
        refused = asyncio.run(apply("no-such-preset"))
        assert "error" in refused and "400" in refused["error"], refused
        assert _status(admin)["models"][0]["batching"] == after["models"][0]["batching"]
    finally:
        server.stop()


def test_a_class_weight_action_changes_the_replicas_batch_slot_weights_once():
    server = InferenceServer("builtin:mlp").start()
    try:
        admin = f"127.0.0.1:{server.admin_port}"
        endpoint = "127.0.0.1:1"
        assert _status(admin)["models"][0]["batching"]["level_weights"] == {"2": 3, "3": 1}

        async def apply(actions) -> list[dict]:
            applier = ActionApplier("127.0.0.1:1", replica_admin={endpoint: admin})
            try:
                return [(await applier.apply([a], 0.0, flow_hold_s=1.0))[0] for a in actions]
            finally:
                await applier.close()
        same = Action("class-weight", "interactive", weight=5.0)
        first, again, bad = asyncio.run(apply([same, same, Action("class-weight", "latency-critical", weight=2.0)]))
        assert first.get("applied") and first["replicas"] == 1, first
        assert again.get("unchanged"), again                     # the same answer next period posts nothing
        assert "strict" in bad["error"] and not bad["applied"], bad
        weights = _status(admin)["models"][0]["batching"]["level_weights"]
        assert weights == {"2": 5, "3": 1}                        # and the refused one changed nothing
    finally:
        server.stop()
