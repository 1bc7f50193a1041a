"""mcp-bench --grpc against a throwaway KServe v2 gRPC servicer (grpcio, in
a thread), with either client (our HTTP/2 one, h2_grpc.py, and grpcio's):
counts, raw inputs, priority metadata and parameter, timing metadata, error
classes from mcp26.mesh.error_classes, a request larger than grpcio's flow-control
windows and frames, a server that goes away mid-call."""
from __future__ import annotations

import json
import threading
import time
import urllib.request
from concurrent import futures

import grpc
import numpy as np
import pytest

from mcp26.inference.bench.runner import Config, run_sync
from mcp26.inference.bench.serve_process import ServeProcess
from mcp26.inference.bench.target import TargetError
from mcp26.inference.protos import grpc_service_pb2 as pb
from mcp26.inference.protos import grpc_service_pb2_grpc as pbg
from mcp26.mesh.headers import COMPUTE_TIME_US, QOS_CLASS, QUEUE_TIME_US
from mcp26.mesh.qos import QosClass
from mcp26.demo.stack.ports import free_port

pytestmark = pytest.mark.e2e


class ToyServicer(pbg.GRPCInferenceServiceServicer):
    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.seen: list[tuple[str | None, int | None, bytes]] = []
        self.lock = threading.Lock()

    def ModelMetadata(self, request, context):
        if request.name != "toy":
            context.abort(grpc.StatusCode.NOT_FOUND, f"no model {request.name}")
        return pb.ModelMetadataResponse(name="toy", inputs=[
            pb.ModelMetadataResponse.TensorMetadata(name="x", datatype="FP32", shape=[-1, 4])])

    def ModelInfer(self, request, context):
        if request.model_name != "toy":
            context.abort(grpc.StatusCode.NOT_FOUND, "no such model")
        md = dict(context.invocation_metadata())
        prio = request.parameters["priority"].int64_param if "priority" in request.parameters else None
        with self.lock:
            self.seen.append((md.get(QOS_CLASS), prio, request.raw_input_contents[0]))
        if self.delay:
            time.sleep(self.delay)
        context.send_initial_metadata(((QUEUE_TIME_US, "120"), (COMPUTE_TIME_US, "30")))
        return pb.ModelInferResponse(model_name="toy")


@pytest.fixture
def toy_grpc():
    yield from _toy()


def _toy(options=()):
    servicer = ToyServicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=list(options))
    pbg.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    servicer.server = server
    try:
        yield servicer, port
    finally:
        server.stop(0)


CLIENTS = pytest.mark.parametrize("client", ["h2", "grpcio"])


@CLIENTS
def test_grpc_closed_loop_with_priority_mix(toy_grpc, client):
    servicer, port = toy_grpc
    res = run_sync(Config(url=f"127.0.0.1:{port}/v2/models/toy", grpc=True, concurrency=4,
                          requests=60, priority_mix="critical=1,low=2", connections=2, grpc_client=client))
    rows = {r["priority"]: r for r in res["rows"]}
    assert rows["all"]["ok"] == 60 and rows["all"]["errors"] == 0
    assert rows["critical"]["requests"] == 20 and rows["low"]["requests"] == 40
    assert rows["all"]["server_queue_us"]["p50"] == 120 and rows["all"]["server_compute_us"]["p50"] == 30
    assert len(servicer.seen) == 60
    wire = {(q, p) for q, p, _ in servicer.seen}
    assert wire == {(QosClass.LATENCY_CRITICAL.header_value, QosClass.LATENCY_CRITICAL.priority_level),
                    (QosClass.BATCH.header_value, QosClass.BATCH.priority_level)}
    raw = servicer.seen[0][2]
    assert np.frombuffer(raw, dtype="<f4").shape == (4,)      # one [1, 4] FP32 row, little-endian


@CLIENTS
def test_grpc_errors_are_mesh_error_classes(toy_grpc, client):
    servicer, port = toy_grpc
    with pytest.raises(TargetError, match="NOT_FOUND"):
        run_sync(Config(url=f"127.0.0.1:{port}/v2/models/nope", grpc=True, requests=3, grpc_client=client))
    # with the inputs given each call is refused by ModelInfer itself (a trailers-only answer)
    res = run_sync(Config(url=f"127.0.0.1:{port}/v2/models/nope", grpc=True, requests=5, concurrency=2,
                          inputs=["x:FP32:1,4"], grpc_client=client))
    assert res["rows"][0]["error_classes"] == {"client/NOT_FOUND": 5}
    servicer.delay = 0.3
    res = run_sync(Config(url=f"127.0.0.1:{port}/v2/models/toy", grpc=True, concurrency=2,
                          requests=2, timeout=0.05, grpc_client=client))
    assert res["rows"][0]["error_classes"] == {"timeout/deadline": 2}


@CLIENTS
def test_a_request_larger_than_the_windows_arrives_whole(client):
    """2 MiB requests, 4 at once, to `mcpctl serve`'s gRPC lane, which keeps HTTP/2's 16 KiB
    frames and opens 1 MiB a stream: the client must split DATA and wait for WINDOW_UPDATEs.
    The server's own statistics count every row."""
    rows, n = 2048, 12
    with ServeProcess("builtin:relu", free_port(), free_port(), "--max-batch", str(rows)) as srv:
        res = run_sync(Config(url=srv.grpc_url, grpc=True, concurrency=4, requests=n, connections=1,
                              shape=f"INPUT0:{rows},256", grpc_client=client))
        assert res["rows"][0]["ok"] == n, res["rows"][0]["error_classes"]
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.http_port}/v2/models/relu/stats", timeout=10) as r:
            stats = json.loads(r.read())["model_stats"][0]
    assert stats["inference_count"] == n * rows and stats["inference_stats"]["success"]["count"] == n


@CLIENTS
def test_a_request_past_grpcio_windows_waits_for_credit(client):
    """grpcio holds a peer to its flow-control windows (8 MiB a stream here) and refuses a
    frame past them: 12 MB requests, 3 at once on one connection, arrive only if the client
    waits for its WINDOW_UPDATEs."""
    gen = _toy([("grpc.max_receive_message_length", 64 << 20)])
    servicer, port = next(gen)
    try:
        res = run_sync(Config(url=f"127.0.0.1:{port}/v2/models/toy", grpc=True, concurrency=3, requests=6,
                              shape="x:750000,4", grpc_client=client, timeout=60))
    finally:
        gen.close()
    assert res["rows"][0]["ok"] == 6, res["rows"][0]["error_classes"]
    assert [np.frombuffer(raw, dtype="<f4").shape for _, _, raw in servicer.seen] == [(3_000_000,)] * 6


@CLIENTS
def test_a_server_gone_mid_call_ends_the_calls(toy_grpc, client):
    servicer, port = toy_grpc
    servicer.delay = 1.0
    threading.Timer(0.3, servicer.server.stop, args=(0,)).start()
    t0 = time.monotonic()
    res = run_sync(Config(url=f"127.0.0.1:{port}/v2/models/toy", grpc=True, concurrency=2, requests=2,
                          timeout=20, inputs=["x:FP32:1,4"], grpc_client=client))
    assert time.monotonic() - t0 < 5
    classes = res["rows"][0]["error_classes"]
    assert res["rows"][0]["ok"] == 0 and sum(classes.values()) == 2, classes
    assert set(classes) <= {"unavailable/connection-closed", "unavailable/UNAVAILABLE", "client/CANCELLED",
                            "server/CANCELLED", "unavailable/CANCELLED"}, classes


def test_grpc_unreachable_target_is_a_clear_error():
    with pytest.raises(TargetError, match="cannot reach gRPC"):
        run_sync(Config(url=f"127.0.0.1:{free_port()}/v2/models/toy", grpc=True, requests=1, timeout=1))
