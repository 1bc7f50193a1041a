"""Unary ModelInfer calls read together are batched together (GrpcLane.starting,
Context.calls_starting): a lone call still runs at once, on the loop, as a batch of one,
but when other calls read on the same loop turn are about to start, it is queued with
them and the turn's flush runs them as one batch. Observed in the server's own
statistics (Triton's execution_count and batch_stats), against `mcpctl serve`."""
from __future__ import annotations

import asyncio
import json
import urllib.request

import numpy as np
import pytest

from mcp26.demo.stack.ports import free_port
from mcp26.inference.bench.grpc_slots import INFER
from mcp26.inference.bench.h2_grpc import H2GrpcConnection, header_block
from mcp26.inference.bench.serve_process import ServeProcess
from mcp26.inference.protos import grpc_service_pb2 as pb

pytestmark = pytest.mark.e2e


def _request() -> bytes:
    req = pb.ModelInferRequest(model_name="relu")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 256])
    req.raw_input_contents.append(np.ones((1, 256), "<f4").tobytes())
    return req.SerializeToString()


async def _calls(port: int, n: int, together: bool) -> list:
    """n calls on one connection: written in one go, or each after the last answered."""
    conn = H2GrpcConnection()
    await conn.connect("127.0.0.1", port)
    block, msg, loop = header_block(f"127.0.0.1:{port}", INFER), _request(), asyncio.get_running_loop()
    statuses: list = []
    try:
        for _ in range(1 if together else n):
            done = loop.create_future()

            def answered(status, headers, trailers, done=done, want=n if together else len(statuses) + 1):
                statuses.append(status)
                if len(statuses) == want:
                    done.set_result(None)
            for _ in range(n if together else 1):
                conn.call(block, msg, answered)
            await asyncio.wait_for(done, 10)
    finally:
        conn.close()
    return statuses


def _stats(srv: ServeProcess) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.http_port}/v2/models/relu/stats", timeout=10) as r:
        return json.loads(r.read())["model_stats"][0]


def test_calls_read_together_run_as_one_batch_and_a_lone_call_alone():
    with ServeProcess("builtin:relu", free_port(), free_port(), "--workers", "1") as srv:
        assert asyncio.run(_calls(srv.grpc_port, 8, together=False)) == [0] * 8
        lone = _stats(srv)
        assert lone["inference_count"] == 8 and lone["execution_count"] == 8     # one at a time: batches of one
        assert asyncio.run(_calls(srv.grpc_port, 16, together=True)) == [0] * 16
        after = _stats(srv)
    assert after["inference_count"] == 24
    batches = after["execution_count"] - 8
    assert batches <= 2, f"16 calls read together ran as {batches} batches"
    sizes = {int(b["batch_size"]) for b in after["batch_stats"]}
    assert max(sizes) >= 8, sizes
