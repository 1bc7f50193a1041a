"""The seed's priority table enforced, through a real Envoy with the header contract: clients ask
with X-LLM-Priority, the Wasm filter signs the class (mesh/qos.py's table), the model server
honours only signed classes and its batcher carries out the rules (harness/qos_stack.py):

- weighted share: High (interactive, weight 3) takes three batch slots to Medium's one under
  saturation, within 10 % (the server's own slot counts);
- reserved threads: Critical requests beside a saturating Low load run on the reserved lane,
  which nothing else uses, and hold its threads only while they live;
- freezing: while High work is queued no Low batch starts nor rides along (the server's spans:
  every request's arrival and batch start); with freezing switched off the same load shows
  Low batches doing exactly that, so the check can tell."""
from __future__ import annotations

import asyncio
import os

import pytest

from harness.qos_stack import QosStack, closed_loop, request_windows
from mcp26.mesh import qos as Q
from mcp26.wasm import HEADER_CONTRACT_WASM

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SPEC = {"maxBatchSize": 8, "maxQueueDelayMicroseconds": 500, "reservedLaneLevels": 1}
LEVEL = {n: str(Q.LLM_PRIORITY_CLASSES[n].priority_level) for n in Q.LLM_PRIORITY_NAMES}


@pytest.fixture(scope="module")
def stack():
    if not os.path.exists(HEADER_CONTRACT_WASM):
        pytest.skip("run `make wasm` first")
    with QosStack(SPEC) as s:
        yield s


def _slots(s) -> dict:
    return s.status()["qos_share"]["slots_by_level"]


def test_high_takes_three_batch_slots_to_mediums_one_through_envoy(stack):
    before = _slots(stack)
    res = asyncio.run(closed_loop(stack.gw_port, {"high": 24, "medium": 24}, 3.0))
    after = _slots(stack)
    got = {lv: after.get(lv, 0) - before.get(lv, 0) for lv in after}
    assert set(res["high"]["statuses"]) == {200} and set(res["medium"]["statuses"]) == {200}
    high, medium = got.get(LEVEL["high"], 0), got.get(LEVEL["medium"], 0)
    assert high == len(res["high"]["latencies_ms"]) and medium == len(res["medium"]["latencies_ms"])  # signed classes
    assert medium > 100 and abs(high / medium - 3.0) <= 0.3, got


def test_critical_requests_run_on_the_reserved_lane_held_only_while_they_live(stack):
    lane0 = stack.status()["reserved_lane"]["batches"]

    async def run():
        low = asyncio.create_task(closed_loop(stack.gw_port, {"low": 24}, 3.0))
        await asyncio.sleep(0.5)
        crit = await closed_loop(stack.gw_port, {"critical": 1}, 2.0)
        return crit, await low
    crit, low = asyncio.run(run())
    n = len(crit["critical"]["latencies_ms"])
    lane = stack.status()["reserved_lane"]
    assert n > 20 and set(crit["critical"]["statuses"]) == {200} and set(low["low"]["statuses"]) == {200}
    assert 0.8 * n <= lane["batches"] - lane0 <= n          # the lane ran them, and nothing but them
    assert lane["threads_held"] == 0                         # released as the last one was answered


def _violations(windows: list[dict]) -> int:
    """Low requests whose batch started while a High request waited (or in its batch)."""
    highs = [w for w in windows if str(w["level"]) == LEVEL["high"]]
    lows = sorted(w["start"] for w in windows if str(w["level"]) == LEVEL["low"])
    import bisect
    bad = 0
    for h in highs:
        lo = bisect.bisect_right(lows, h["arrival"] + 100_000)
        hi = bisect.bisect_right(lows, h["start"] + 2_000)
        bad += hi - lo
    return bad


def test_no_low_batch_starts_while_high_work_waits_and_without_freezing_some_do(stack):
    def run() -> tuple[list, dict]:
        seen = len(stack.spans())
        res = asyncio.run(closed_loop(stack.gw_port, {"low": 24, "high": 4}, 2.5))
        return request_windows(stack.spans()[seen:]), res
    freezes = stack.status()["qos_share"]["freezes"]
    frozen, res = run()
    assert set(res["low"]["statuses"]) == {200} and set(res["high"]["statuses"]) == {200}
    assert sum(1 for w in frozen if str(w["level"]) == LEVEL["high"]) > 50
    assert _violations(frozen) == 0
    assert stack.status()["qos_share"]["freezes"] > freezes
    try:
        stack.set_policy({**SPEC, "freezeLowPriority": False})
        thawed, _ = run()
    finally:
        stack.set_policy(SPEC)
    assert _violations(thawed) > 0                           # the check sees Low riding along when allowed
