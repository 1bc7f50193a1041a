"""mcp-bench --grpc against a throwaway KServe v2 gRPC servicer (grpcio, in
a thread): counts, raw inputs, priority metadata and parameter, timing
metadata, error classes from mesh.error_classes."""
from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import numpy as np
import pytest

from inference_backend.bench.runner import Config, run_sync
from inference_backend.bench.target import TargetError
from inference_backend.protos import grpc_service_pb2 as pb
from inference_backend.protos import grpc_service_pb2_grpc as pbg
from mesh.headers import COMPUTE_TIME_US, QOS_CLASS, QUEUE_TIME_US
from mesh.qos import QosClass
from harness.ports import free_port

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
    servicer = ToyServicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pbg.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        yield servicer, port
    finally:
        server.stop(0)


def test_grpc_closed_loop_with_priority_mix(toy_grpc):
    servicer, port = toy_grpc
    res = run_sync(Config(url=f"127.0.0.1:{port}/v2/models/toy", grpc=True, concurrency=4,
                          requests=60, priority_mix="high=1,low=2", connections=2))
    rows = {r["priority"]: r for r in res["rows"]}
    assert rows["all"]["ok"] == 60 and rows["all"]["errors"] == 0
    assert rows["high"]["requests"] == 20 and rows["low"]["requests"] == 40
    assert rows["all"]["server_queue_us"]["p50"] == 120 and rows["all"]["server_compute_us"]["p50"] == 30
    assert len(servicer.seen) == 60
    wire = {(q, p) for q, p, _ in servicer.seen}
    assert wire == {(QosClass.LATENCY_CRITICAL.header_value, QosClass.LATENCY_CRITICAL.priority_level),
                    (QosClass.BATCH.header_value, QosClass.BATCH.priority_level)}
    raw = servicer.seen[0][2]
    assert np.frombuffer(raw, dtype="<f4").shape == (4,)      # one [1, 4] FP32 row, little-endian


def test_grpc_errors_are_mesh_error_classes(toy_grpc):
    servicer, port = toy_grpc
    with pytest.raises(TargetError, match="NOT_FOUND"):
        run_sync(Config(url=f"127.0.0.1:{port}/v2/models/nope", grpc=True, requests=3))
    servicer.delay = 0.3
    res = run_sync(Config(url=f"127.0.0.1:{port}/v2/models/toy", grpc=True, concurrency=2,
                          requests=2, timeout=0.05))
    assert res["rows"][0]["error_classes"] == {"timeout/deadline": 2}


def test_grpc_unreachable_target_is_a_clear_error():
    with pytest.raises(TargetError, match="cannot reach gRPC"):
        run_sync(Config(url=f"127.0.0.1:{free_port()}/v2/models/toy", grpc=True, requests=1, timeout=1))
