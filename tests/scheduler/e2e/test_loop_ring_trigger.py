"""The decision loop woken by the shared ring, not its period (the seed's kernel chapter):

- the write-burst tracer (tracepoint syscalls/sys_enter_write) watches a real model server; a
  burst of answers it writes (uvloop writes responses with write(2)) lands in the ring, rings
  its bell, and the loop - on a 5 s period - re-batches that replica (the built-in table's
  batcher-policy action) well before its next period;
- the model server's own per-flow figures (`mcpctl serve --flow-ring`): an OpenAI request's
  token throughput and KV-cache hit rate reach the loop through its doorbell (an eventfd),
  keyed by the connection the request came on."""
from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import json
import os
import time
import urllib.request

import pytest

from harness.bpf_env import require_bpf
from mcp26.demo.stack.inference_server import InferenceServer
from mcp26.scheduler.loop.actions import ActionApplier
from mcp26.scheduler.loop.builtin_policy import BuiltinPolicy
from mcp26.scheduler.loop.flows import FlowSource
from mcp26.scheduler.loop.loop import DecisionLoop

pytestmark = pytest.mark.e2e

PERIOD_S = 5.0            # the loop's period: what it does sooner, the ring woke it for
INFER = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}).encode()


def _status(admin: str) -> dict:
    with urllib.request.urlopen(f"http://{admin}/admin/status", timeout=5) as r:
        return json.load(r)


def _infer(port: int) -> int:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("POST", "/v2/models/mlp/infer", body=INFER, headers={"content-type": "application/json"})
        return c.getresponse().status
    finally:
        c.close()


def test_a_write_burst_of_the_model_server_wakes_the_loop_which_rebatches_it():
    require_bpf()
    from mcp26.bpf.program import BpfUnavailable
    from mcp26.bpf.write_burst import WriteBurstTracer
    ring_path = f"/sys/fs/bpf/mcp-test-trigger-{os.getpid()}"
    server = InferenceServer("builtin:mlp").start()
    tracer = None
    try:
        try:
            tracer = WriteBurstTracer(ring_path)                     # its own ring, pinned (no datapath here)
        except BpfUnavailable as e:
            pytest.skip(str(e))
        endpoint, admin = f"127.0.0.1:{server.http_port}", f"127.0.0.1:{server.admin_port}"
        tracer.watch(server.proc.pid, gap_us=20_000, min_bytes=8 << 10)
        before = len(_status(admin)["policy_changes"]["mlp"])
        source = FlowSource.at(ring_path)
        loop = DecisionLoop(BuiltinPolicy(burst_preset="throughput"), "builtin-python", lambda: [],
                            ActionApplier("127.0.0.1:1", replica_admin={endpoint: admin}), period_s=PERIOD_S,
                            flows_fn=source)
        loop.reader.pids[endpoint] = server.proc.pid

        async def run():
            task = asyncio.create_task(loop.run())
            await asyncio.sleep(0.3)                                 # after the first (t=0) period
            sent = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(32) as pool:   # answers written back to back: a burst
                statuses = await asyncio.get_running_loop().run_in_executor(
                    None, lambda: list(pool.map(_infer, [server.http_port] * 64)))
            assert set(statuses) == {200}
            while loop.woken == 0 and time.monotonic() - sent < PERIOD_S * 0.5:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)                                 # the action's POST
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return time.monotonic() - sent
        took = asyncio.run(run())
        assert loop.woken >= 1 and took < PERIOD_S * 0.5, (loop.woken, took)
        ring_cycles = [d for d in loop.history if d.get("trigger") == "ring"]
        assert ring_cycles and ring_cycles[0]["inputs"]["write_bursts"][0]["endpoint"] == endpoint
        act = next(a for d in ring_cycles for a in d.get("actions", []) if a["kind"] == "batcher-policy")
        assert act["applied"] and act["value"] == "throughput", act
        changes = _status(admin)["policy_changes"]["mlp"]
        assert len(changes) > before and changes[-1]["policy"] == "throughput"
        asyncio.run(loop.close())
    finally:
        if tracer is not None:
            tracer.close()
        server.stop()
    assert not os.path.exists(ring_path)


def test_the_model_servers_per_flow_figures_reach_the_loop_through_its_doorbell(tmp_path):
    ring_path = str(tmp_path / "serving.ring")
    source = FlowSource.at(ring_path)                                # the loop's side first: its doorbell
    loop = DecisionLoop(BuiltinPolicy(), "builtin-python", lambda: [], ActionApplier("127.0.0.1:1"),
                        period_s=PERIOD_S, flows_fn=source)
    server = InferenceServer("builtin:tiny-decoder", "--flow-ring", ring_path,
                             "--openai-model", "tiny=tiny-decoder").start()
    try:
        def requests() -> str:
            c = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
            body = json.dumps({"model": "tiny", "prompt": "the mesh " * 20, "max_tokens": 16}).encode()
            for _ in range(2):                                       # the second finds its prefix cached
                c.request("POST", "/v1/completions", body=body, headers={"content-type": "application/json"})
                r = c.getresponse()
                assert r.status == 200, r.read()
                r.read()
            client = f"127.0.0.1:{c.sock.getsockname()[1]}"
            c.close()
            return client

        async def run():
            task = asyncio.create_task(loop.run())
            await asyncio.sleep(0.3)
            # off the event loop: the loop must be free to hand the server its doorbell
            client = await asyncio.get_running_loop().run_in_executor(None, requests)
            flows = []
            deadline = time.monotonic() + PERIOD_S * 0.5
            while time.monotonic() < deadline:
                flows = [f for f in loop.latest["inputs"]["flows"] if f["flow"].startswith(client + "->")] \
                    if getattr(loop, "latest", None) else []
                if flows and flows[0]["kv_hit_rate"] > 0:
                    break
                await asyncio.sleep(0.01)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return flows
        flows = asyncio.run(run())
        assert loop.woken >= 1
        (f,) = flows
        assert f["flow"].endswith(f"->127.0.0.1:{server.http_port}") and f["tokens_per_second"] > 0
        assert 0 < f["kv_hit_rate"] <= 1
        asyncio.run(loop.close())
    finally:
        server.stop()
