"""The REST fast lane's per-request path leaves no reference cycles behind: what a request
allocates is freed by reference counting when it is answered, not by the cyclic GC, whose
pauses grow with what is left for it (a request's Pending kept in its future's callback
did: relu REST c=64 p99 7.5 -> 11.4 ms, inference-backend/README.md). The real ModelServer,
InferCore and FastLane on a uvloop, connections on a transport that only counts writes."""
from __future__ import annotations

import asyncio
import gc
import json

import numpy as np
import uvloop

from mcp26.mesh.batching_policy import preset
from mcp26.inference import builtin_models
from mcp26.inference.model_server import ModelServer
from mcp26.inference.rest import InferCore
from mcp26.inference.rest_httptools import FastLane
from mcp26.inference.telemetry import Telemetry

CONNECTIONS, ROUNDS = 16, 20


class CountingTransport(asyncio.Transport):
    def __init__(self):
        super().__init__()
        self.answers = []

    def write(self, data):
        self.answers.append(data)

    def is_closing(self):
        return False

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass


def request(model: str) -> bytes:
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 256], "datatype": "FP32",
                                   "data": np.linspace(-1, 1, 256).tolist()}]}).encode()
    return (b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (model.encode(), len(body), body))


async def serve_rounds(conns, data: bytes, rounds: int) -> None:
    for _ in range(rounds):
        want = [len(t.answers) + 1 for _, t in conns]
        for c, _ in conns:
            c.data_received(data)
        for _ in range(2000):
            if all(len(t.answers) >= w for (_, t), w in zip(conns, want)):
                break
            await asyncio.sleep(0.001)
        assert all(len(t.answers) >= w for (_, t), w in zip(conns, want))


async def left_for_the_gc() -> tuple[int, list[bytes]]:
    models = ModelServer(Telemetry.get())
    models.add("relu", builtin_models.builtin_path("relu"), preset("balanced"), intra_op_threads=1)
    models.ready = True
    lane = FastLane(InferCore(models, 64 << 20), None)
    conns = []
    for _ in range(CONNECTIONS):
        t = CountingTransport()
        c = lane()
        c.connection_made(t)
        conns.append((c, t))
    data = request("relu")
    try:
        await serve_rounds(conns, data, 3)          # warm: caches, metric children, the first batch
        gc.collect()
        gc.disable()
        try:
            await serve_rounds(conns, data, ROUNDS)
            found = gc.collect()
        finally:
            gc.enable()
    finally:
        models.models["relu"].batcher.stop()
    return found, [t.answers[-1] for _, t in conns]


def test_answered_requests_leave_nothing_for_the_cyclic_gc():
    found, last = uvloop.run(left_for_the_gc())
    assert all(a.startswith(b"HTTP/1.1 200 OK") for a in last), last[0][:200]
    # 320 requests: a cycle per request would leave thousands of objects
    assert found < CONNECTIONS * ROUNDS // 4, found
