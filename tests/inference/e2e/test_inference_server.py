"""A live `mcpctl serve --model builtin:mlp` against the real tritonclient (gRPC and HTTP)."""
from __future__ import annotations

import json
import queue
import threading
import urllib.error
import urllib.request

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from mcp26.inference.builtin_models import builtin_path
from mcp26.inference.load_report import parse_text_report
from mcp26.mesh import headers as H
from mcp26.demo.stack.inference_server import InferenceServer

pytestmark = pytest.mark.e2e
MAX_BODY = 1_000_000


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    return tmp_path_factory.mktemp("trace") / "spans.jsonl"


@pytest.fixture(scope="module")
def server(trace_file):
    with InferenceServer("builtin:mlp", "--max-body-bytes", str(MAX_BODY), "--max-queue-delay-us", "3000",
                         "--trace-file", str(trace_file)) as s:
        yield s


@pytest.fixture(scope="module")
def local():
    return ort.InferenceSession(builtin_path("mlp"), providers=["CPUExecutionProvider"])


def expected(local, x):
    return local.run(["OUTPUT0"], {"INPUT0": x})[0]


def rng_input(seed, rows=1):
    return np.random.default_rng(seed).standard_normal((rows, 64)).astype(np.float32)


def test_tritonclient_grpc_result_equals_local_onnxruntime(server, local):
    client = tgrpc.InferenceServerClient(server.grpc)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("mlp")
    meta = client.get_model_metadata("mlp", as_json=True)
    assert [(i["name"], i["datatype"], i["shape"]) for i in meta["inputs"]] == [("INPUT0", "FP32", ["-1", "64"])]
    x = rng_input(1, rows=5)
    inp = tgrpc.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("mlp", [inp], outputs=[tgrpc.InferRequestedOutput("OUTPUT0")])
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected(local, x), rtol=1e-5, atol=1e-6)


def test_tritonclient_http_binary_and_json_equal_local_onnxruntime(server, local):
    client = thttp.InferenceServerClient(server.http)
    assert client.is_server_live() and client.is_model_ready("mlp")
    for binary in (True, False):
        x = rng_input(2 + binary, rows=3)
        inp = thttp.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        out = thttp.InferRequestedOutput("OUTPUT0", binary_data=binary)
        result = client.infer("mlp", [inp], outputs=[out])
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected(local, x), rtol=1e-5, atol=1e-6)
        assert (result.get_output("OUTPUT0").get("parameters", {}).get("binary_data_size") is not None) == binary


def test_metadata_reports_execution_provider_and_load_time(server):
    with urllib.request.urlopen(f"http://{server.http}/v2/models/mlp") as r:
        doc = json.loads(r.read())
    available = ort.get_available_providers()
    assert doc["execution_provider"] in available
    if not {"CUDAExecutionProvider", "TensorrtExecutionProvider"} & set(available):
        assert (doc["execution_provider"], doc["device"]) == ("CPUExecutionProvider", "cpu")
    assert doc["load_seconds"] > 0 and doc["warmup_seconds"] > 0
    channel = grpc.insecure_channel(server.grpc)
    from mcp26.inference.protos import grpc_service_pb2 as pb, grpc_service_pb2_grpc as pbg
    _, call = pbg.GRPCInferenceServiceStub(channel).ModelMetadata.with_call(pb.ModelMetadataRequest(name="mlp"))
    assert dict(call.trailing_metadata())["x-mcp-execution-provider"] == doc["execution_provider"]
    channel.close()


def test_mixed_concurrent_requests_each_get_their_own_answer(server, local):
    """48 requests with distinct inputs (1-3 rows each) in flight together: they are
    batched (the server says so) and each answer is its own input's."""
    client = tgrpc.InferenceServerClient(server.grpc)
    inputs = {i: rng_input(100 + i, rows=1 + i % 3) for i in range(48)}
    answers: queue.Queue = queue.Queue()
    for i, x in inputs.items():
        inp = tgrpc.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        client.async_infer("mlp", [inp], callback=lambda result, error, i=i: answers.put((i, result, error)), request_id=str(i))
    batch_sizes = []
    for _ in inputs:
        i, result, error = answers.get(timeout=60)
        assert error is None, error
        assert result.get_response().id == str(i)
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected(local, inputs[i]), rtol=1e-5, atol=1e-6)
        batch_sizes.append(result.get_response().parameters["batch_size"].uint64_param)
    assert max(batch_sizes) > 3, f"requests were never batched together: {sorted(set(batch_sizes))}"
    client.close()


def test_stream_infer_answers_every_request_by_id(server, local):
    client = tgrpc.InferenceServerClient(server.grpc)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    inputs = {i: rng_input(300 + i) for i in range(10)}
    for i, x in inputs.items():
        inp = tgrpc.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        client.async_stream_infer("mlp", [inp], request_id=f"s{i}")
    bad = tgrpc.InferInput("INPUT0", [1, 63], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 63), np.float32))
    client.async_stream_infer("mlp", [bad], request_id="bad")
    seen, errors = {}, []
    for _ in range(11):
        result, error = answers.get(timeout=30)
        if error is not None:
            errors.append(str(error))
        else:
            seen[result.get_response().id] = result.as_numpy("OUTPUT0")
    client.stop_stream()
    assert sorted(seen) == sorted(f"s{i}" for i in inputs)
    for i, x in inputs.items():
        np.testing.assert_allclose(seen[f"s{i}"], expected(local, x), rtol=1e-5, atol=1e-6)
    assert len(errors) == 1 and "shape" in errors[0]


def _post(server, path, body: bytes, headers=None):
    req = urllib.request.Request(f"http://{server.http}{path}", data=body, method="POST",
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, dict(e.headers), json.loads(raw) if raw else {}


def _body(name="INPUT0", shape=(1, 64), datatype="FP32", data=None):
    n = int(np.prod(shape))
    return json.dumps({"inputs": [{"name": name, "shape": list(shape), "datatype": datatype,
                                   "data": data if data is not None else [0.5] * n}]}).encode()


@pytest.mark.parametrize("body, reason", [
    (_body(name="input0"), "has no input 'input0'"),
    (_body(datatype="FP64"), "datatype FP64 given, model expects FP32"),
    (_body(shape=(1, 32)), "shape [1, 32] does not match"),
    (_body(data=[0.5] * 10), "10 elements for shape [1, 64]"),
    (b"{not json", "not JSON"),
    (json.dumps({"inputs": []}).encode(), "non-empty 'inputs'"),
])
def test_rest_bad_input_is_400_with_reason(server, body, reason):
    status, _, doc = _post(server, "/v2/models/mlp/infer", body)
    assert status == 400 and reason in doc["error"], (status, doc)


def test_grpc_bad_input_is_invalid_argument_with_reason(server):
    client = tgrpc.InferenceServerClient(server.grpc)
    cases = [("INPUT0", [1, 32], "FP32", "does not match"), ("INPUT0", [1, 64], "INT32", "expects FP32"),
             ("nope", [1, 64], "FP32", "has no input 'nope'")]
    for name, shape, dt, reason in cases:
        inp = tgrpc.InferInput(name, shape, dt)
        inp.set_data_from_numpy(np.zeros(shape, np.float32 if dt == "FP32" else np.int32))
        with pytest.raises(InferenceServerException) as e:
            client.infer("mlp", [inp])
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and reason in e.value.message()
    # raw bytes that do not match the declared shape
    from mcp26.inference.protos import grpc_service_pb2 as pb, grpc_service_pb2_grpc as pbg
    channel = grpc.insecure_channel(server.grpc)
    req = pb.ModelInferRequest(model_name="mlp", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="INPUT0", datatype="FP32", shape=[1, 64])], raw_input_contents=[b"\0" * 100])
    with pytest.raises(grpc.RpcError) as e:
        pbg.GRPCInferenceServiceStub(channel).ModelInfer(req)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "100 bytes" in e.value.details()
    channel.close()


def test_unknown_model_is_404_and_not_found(server):
    status, _, doc = _post(server, "/v2/models/nope/infer", _body())
    assert status == 404 and "unknown model 'nope'" in doc["error"]
    client = tgrpc.InferenceServerClient(server.grpc)
    inp = tgrpc.InferInput("INPUT0", [1, 64], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 64), np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("nope", [inp])
    assert e.value.status() == "StatusCode.NOT_FOUND"


def test_oversized_body_is_413(server):
    status, _, doc = _post(server, "/v2/models/mlp/infer", _body(shape=(5000, 64)))
    assert status == 413 and "exceeds" in doc["error"]


def test_response_carries_timing_and_orca_load_report(server):
    status, headers, doc = _post(server, "/v2/models/mlp/infer", _body())
    low = {k.lower(): v for k, v in headers.items()}
    assert status == 200
    assert int(low[H.QUEUE_TIME_US]) == doc["parameters"]["queue_time_us"]
    assert int(low[H.COMPUTE_TIME_US]) > 0
    report = parse_text_report(low[H.ORCA_LOAD_REPORT])
    assert set(report) >= {"cpu_utilization", "application_utilization", "rps_fractional", "named_metrics.queue_depth"}
    assert all(0 <= report[k] <= 1 for k in ("cpu_utilization", "application_utilization"))
    # gRPC: trailing metadata
    from mcp26.inference.protos import grpc_service_pb2 as pb, grpc_service_pb2_grpc as pbg
    channel = grpc.insecure_channel(server.grpc)
    req = pb.ModelInferRequest(model_name="mlp", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="INPUT0", datatype="FP32", shape=[1, 64])], raw_input_contents=[np.ones((1, 64), np.float32).tobytes()])
    _, call = pbg.GRPCInferenceServiceStub(channel).ModelInfer.with_call(req)
    trailers = dict(call.trailing_metadata())
    assert int(trailers[H.COMPUTE_TIME_US]) > 0 and trailers[H.ORCA_LOAD_REPORT].startswith("TEXT ")
    channel.close()


def test_metrics_exposes_latency_per_priority_and_batch_sizes(server):
    client = thttp.InferenceServerClient(server.http)
    inp = thttp.InferInput("INPUT0", [1, 64], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 64), np.float32))
    client.infer("mlp", [inp], headers={H.QOS_CLASS: "latency-critical"})
    text = server.metrics()
    assert 'mcp_inference_request_duration_seconds_bucket{' in text
    assert 'priority_level="1"' in text
    assert "mcp_inference_batch_size_bucket" in text and "mcp_inference_queue_depth" in text


def test_server_survives_garbage_and_keeps_serving(server, local):
    for body in (b"\xff" * 100, b"[]", json.dumps({"inputs": [{"name": "INPUT0"}]}).encode(),
                 json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 64], "datatype": "FP32",
                                         "data": ["x"] * 64}]}).encode()):
        status, _, _ = _post(server, "/v2/models/mlp/infer", body)
        assert status == 400
    x = rng_input(7)
    status, _, doc = _post(server, "/v2/models/mlp/infer", _body(data=x.reshape(-1).tolist()))
    assert status == 200
    np.testing.assert_allclose(np.array(doc["outputs"][0]["data"], np.float32).reshape(1, 16),
                               expected(local, x), rtol=1e-5, atol=1e-6)


def test_spans_for_queue_wait_batch_assembly_and_compute(server, trace_file):
    import time
    client = tgrpc.InferenceServerClient(server.grpc)
    inp = tgrpc.InferInput("INPUT0", [2, 64], "FP32")
    inp.set_data_from_numpy(rng_input(9, rows=2))
    result = client.infer("mlp", [inp], request_id="traced-1")
    params = result.get_response().parameters
    deadline = time.monotonic() + 10
    spans = []
    while time.monotonic() < deadline:
        if trace_file.exists():
            spans = [json.loads(line) for line in trace_file.read_text().splitlines() if line]
            roots = [s for s in spans if s["name"] == "infer" and s["attributes"].get("request_id") == "traced-1"]
            if roots:
                break
        time.sleep(0.1)
    assert roots, "no infer span for the request"
    root = roots[0]
    children = {s["name"]: s for s in spans if s["parent_id"] == root["span_id"]}
    assert set(children) == {"queue_wait", "batch_assembly", "compute"}
    queued = children["queue_wait"]
    assert (queued["end_ns"] - queued["start_ns"]) // 1000 == params["queue_time_us"].uint64_param
    assert children["compute"]["start_ns"] >= queued["end_ns"]
    assert root["attributes"]["batch_size"] >= 2 and root["attributes"]["protocol"] == "grpc"


def test_grpc_health_and_reflection(server):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
    channel = grpc.insecure_channel(server.grpc)
    check = health_pb2_grpc.HealthStub(channel).Check
    for service in ("", "inference.GRPCInferenceService"):
        assert check(health_pb2.HealthCheckRequest(service=service)).status == health_pb2.HealthCheckResponse.SERVING
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    reply = next(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
    assert "inference.GRPCInferenceService" in [s.name for s in reply.list_services_response.service]
    reply = next(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(
        file_containing_symbol="inference.ModelInferRequest")])))
    assert reply.WhichOneof("message_response") == "file_descriptor_response"
    channel.close()
