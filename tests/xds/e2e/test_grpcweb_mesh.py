"""gRPC-Web to the real inference backend through a gateway Envoy configured by the control plane.

No browser here: demo/stack/grpcweb.py speaks gRPC-Web over HTTP/1.1, and
every answer is compared with a direct gRPC call to the same backend.
"""
import os
import time

import grpc
import numpy as np
import pytest

from mcp26.inference.protos import grpc_service_pb2 as pb
from mcp26.inference.protos import grpc_service_pb2_grpc as pb_grpc
from mcp26.mesh import headers as H
from mcp26.mesh.qos import LLM_PRIORITY_CLASSES, QosClass
from mcp26.demo.stack.grpcweb import GrpcWebClient, encode_frame
from harness.grpcweb_mesh import MODEL, SERVICE, grpcweb_mesh
from mcp26.wasm import HEADER_CONTRACT_WASM as WASM

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def mesh():
    with grpcweb_mesh(console_flags={"latency_window": "1", "scrape_interval": "0.25"},
                      header_contract=os.path.exists(WASM)) as m:
        yield m


@pytest.fixture(scope="module")
def direct(mesh):
    with grpc.insecure_channel(f"127.0.0.1:{mesh.backend.grpc_port}") as ch:
        yield pb_grpc.GRPCInferenceServiceStub(ch)


def infer_request(seed: int, rows: int = 1, model: str = MODEL, rid: str = "") -> pb.ModelInferRequest:
    x = np.random.default_rng(seed).standard_normal((rows, 64), dtype=np.float32)
    req = pb.ModelInferRequest(model_name=model, id=rid or f"req-{seed}")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[rows, 64])
    req.raw_input_contents.append(x.tobytes())
    return req


def outputs(resp: pb.ModelInferResponse) -> np.ndarray:
    return np.frombuffer(resp.raw_output_contents[0], dtype="<f4").reshape(tuple(resp.outputs[0].shape))


def web(mesh, **kw) -> GrpcWebClient:
    return GrpcWebClient("127.0.0.1", mesh.gateway_port, **kw)


def test_model_infer_through_envoy_returns_what_direct_grpc_returns(mesh, direct):
    req = infer_request(1, rows=3)
    res = web(mesh).unary(f"{SERVICE}/ModelInfer", req.SerializeToString())
    assert res.status == 0, (res.status, res.message)
    got = pb.ModelInferResponse.FromString(res.messages[0])
    want = direct.ModelInfer(req, timeout=10, metadata=mesh.direct_metadata())
    assert got.model_name == want.model_name == MODEL
    assert list(got.outputs[0].shape) == list(want.outputs[0].shape) == [3, 16]
    np.testing.assert_array_equal(outputs(got), outputs(want))
    assert not np.all(outputs(got) == 0)
    # The backend's trailing metadata came back in the gRPC-Web trailer frame.
    assert int(res.trailers[H.QUEUE_TIME_US]) >= 0 and int(res.trailers[H.COMPUTE_TIME_US]) > 0


def test_text_encoding_gives_the_same_numbers(mesh, direct):
    req = infer_request(2)
    res = web(mesh, text=True).unary(f"{SERVICE}/ModelInfer", req.SerializeToString())
    assert res.status == 0, res.message
    np.testing.assert_array_equal(outputs(pb.ModelInferResponse.FromString(res.messages[0])),
                                  outputs(direct.ModelInfer(req, timeout=10, metadata=mesh.direct_metadata())))


def test_model_stream_infer_as_server_streaming(mesh, direct):
    # gRPC-Web cannot stream requests: the body carries every request frame and
    # ends. On KServe's bidi ModelStreamInfer that is a server-streaming call:
    # one answer per request, streamed back as each is ready, matched by id.
    reqs = [infer_request(10 + i, rid=f"s{i}") for i in range(3)]
    res = web(mesh).call(f"{SERVICE}/ModelStreamInfer", [r.SerializeToString() for r in reqs])
    assert res.status == 0, res.message
    answers = [pb.ModelStreamInferResponse.FromString(m) for m in res.messages]
    assert sorted(a.infer_response.id for a in answers) == ["s0", "s1", "s2"]
    assert all(not a.error_message for a in answers)
    by_id = {a.infer_response.id: a.infer_response for a in answers}
    for r in reqs:
        np.testing.assert_array_equal(outputs(by_id[r.id]), outputs(direct.ModelInfer(r, timeout=10, metadata=mesh.direct_metadata())))


needs_contract = pytest.mark.skipif(not os.path.exists(WASM), reason=f"{WASM} not built (make wasm)")


def queued_level(res) -> int:
    """The priority level the backend queued the request at (its response parameter)."""
    assert res.status == 0, res.message
    return pb.ModelInferResponse.FromString(res.messages[0]).parameters["priority_level"].uint64_param


@needs_contract
@pytest.mark.parametrize("priority", sorted(LLM_PRIORITY_CLASSES))
def test_grpc_web_request_gets_its_qos_class_from_the_header_contract(mesh, priority):
    # The Wasm filter runs before grpc_web: it maps X-LLM-Priority to the class
    # header, which the backend's priority queues read.
    res = web(mesh).unary(f"{SERVICE}/ModelInfer", infer_request(5).SerializeToString(),
                          metadata={H.LLM_PRIORITY: priority})
    assert queued_level(res) == LLM_PRIORITY_CLASSES[priority].priority_level


@needs_contract
def test_grpc_web_client_cannot_set_the_qos_class_itself(mesh):
    spoofed = {H.QOS_CLASS: QosClass.LATENCY_CRITICAL.header_value, H.LLM_PRIORITY: "low"}
    res = web(mesh).unary(f"{SERVICE}/ModelInfer", infer_request(6).SerializeToString(), metadata=spoofed)
    assert queued_level(res) == QosClass.BATCH.priority_level
    # ... whereas a class the mesh signed is what the backend queues at.
    with grpc.insecure_channel(f"127.0.0.1:{mesh.backend.grpc_port}") as ch:
        direct = pb_grpc.GRPCInferenceServiceStub(ch).ModelInfer(
            infer_request(6), metadata=mesh.direct_metadata(QosClass.LATENCY_CRITICAL.header_value), timeout=10)
    assert direct.parameters["priority_level"].uint64_param == QosClass.LATENCY_CRITICAL.priority_level


@needs_contract
def test_session_headers_a_grpc_web_client_forges_never_reach_the_backend(mesh, direct):
    # The backend runs with --session-key-file: an unsigned session header is refused ...
    req = infer_request(9)
    spoof = {H.END_USER: "mallory", H.TENANT: "acme"}
    with pytest.raises(grpc.RpcError) as unsigned:
        direct.ModelInfer(req, timeout=10, metadata=tuple(spoof.items()))
    assert unsigned.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # ... and through the mesh the filter strips them (no token: no identity) and
    # replaces the forged signature with its own, which the backend accepts.
    forged = {**spoof, H.SESSION_SIG: "v1;h=end-user,x-mcp-tenant;s=" + "0" * 64}
    res = web(mesh).unary(f"{SERVICE}/ModelInfer", req.SerializeToString(), metadata=forged)
    assert queued_level(res) == QosClass.STANDARD.priority_level


@needs_contract
def test_trailers_only_error_gets_its_error_class(mesh):
    req = infer_request(7, model="no-such-model")
    res = web(mesh).unary(f"{SERVICE}/ModelInfer", req.SerializeToString())
    assert res.trailers_only and res.status == grpc.StatusCode.NOT_FOUND.value[0]
    assert res.headers[H.ERROR_CLASS] == "client"


@needs_contract
def test_answer_with_messages_gets_its_error_class(mesh):
    res = web(mesh).unary(f"{SERVICE}/ModelInfer", infer_request(8).SerializeToString())
    assert res.status == 0
    assert (res.trailers.get(H.ERROR_CLASS) or res.headers.get(H.ERROR_CLASS)) == "ok"


def test_backend_error_is_a_grpc_status_with_the_backends_message(mesh, direct):
    req = infer_request(3, model="no-such-model")
    res = web(mesh).unary(f"{SERVICE}/ModelInfer", req.SerializeToString())
    with pytest.raises(grpc.RpcError) as direct_err:
        direct.ModelInfer(req, timeout=10, metadata=mesh.direct_metadata())
    assert res.status == direct_err.value.code().value[0] != 0
    assert res.message == direct_err.value.details()
    assert "no-such-model" in res.message


@pytest.mark.parametrize("body", [
    b"\x00\x00\x00\x10\x00" + b"\x0a\x03mlp",     # frame says 4096 bytes, 5 follow, then end of body
    b"\x00\x00",                                   # not even a frame header
    b"",                                           # no message at all
], ids=["truncated", "short-header", "empty"])
def test_malformed_frame_gets_a_grpc_error_not_a_hang(mesh, body):
    started = time.monotonic()
    res = web(mesh, timeout=8).call(f"{SERVICE}/ModelInfer", raw_body=body)
    assert time.monotonic() - started < 8
    assert res.http_status == 200 and res.messages == []
    # Answered at the gateway (grpc_web_frames.lua): the backend would wait forever.
    assert res.status == grpc.StatusCode.INVALID_ARGUMENT.value[0], res
    assert res.message.startswith("malformed gRPC-Web request: "), res.message


def test_gateway_made_error_reply_carries_cors_headers(mesh):
    # cors sits first in the chain, so a reply made by a later filter (here
    # the framing check) still lets the browser read its grpc-message.
    res = web(mesh, timeout=8).call(f"{SERVICE}/ModelInfer", raw_body=b"\x00\x00",
                                    metadata={"origin": mesh.origin})
    assert res.status == grpc.StatusCode.INVALID_ARGUMENT.value[0], res
    assert res.headers.get("access-control-allow-origin") == mesh.origin, res.headers


def test_whole_frame_that_is_not_the_message_gets_the_backends_error(mesh):
    res = web(mesh, timeout=8).call(f"{SERVICE}/ModelInfer", raw_body=encode_frame(b"\xff\xff\xff\xff\x0f"))
    assert res.status not in (None, 0) and res.message, res  # grpcio cannot parse it


def test_cors_preflight_from_the_console_origin(mesh):
    status, headers = web(mesh).preflight(f"{SERVICE}/ModelInfer", mesh.origin,
                                          ",".join(H.GRPC_WEB_ALLOW_HEADERS + (H.LLM_PRIORITY,)))
    assert status == 200
    assert headers["access-control-allow-origin"] == mesh.origin
    exposed = {h.strip() for h in headers["access-control-expose-headers"].split(",")}
    assert set(H.GRPC_WEB_EXPOSE_HEADERS) <= exposed


def test_cors_preflight_from_another_origin_is_not_allowed(mesh):
    status, headers = web(mesh).preflight(f"{SERVICE}/ModelInfer", "http://127.0.0.1:1",
                                          "content-type,x-grpc-web")
    assert "access-control-allow-origin" not in headers


def test_console_api_shows_the_gateway_its_route_and_healthy_endpoint(mesh):
    deadline = time.monotonic() + 10
    while True:
        state = mesh.console.api("/api/mesh")
        gw = next((p for p in state["proxies"] if p["id"] == mesh.envoy_node), None)
        if gw and {t["type"]: t["status"] for t in gw["types"]}.get("EDS") == "SYNCED" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert gw, state
    status = {t["type"]: t["status"] for t in gw["types"]}
    assert {k: status.get(k) for k in ("LDS", "RDS", "CDS", "EDS")} == dict.fromkeys(("LDS", "RDS", "CDS", "EDS"), "SYNCED")
    route = next(r for r in state["routes"] if r["match"] == f"prefix {SERVICE}/")
    cluster_name = route["clusters"][0]
    cluster = next(c for c in state["clusters"] if c["name"] == cluster_name)
    assert cluster["http2"] is True
    assert cluster["endpoints"] == [{"address": f"127.0.0.1:{mesh.backend.grpc_port}", "health": "HEALTHY",
                                     "weight": 1}]


def test_console_latency_has_points_for_the_class_requests_ran_in(mesh):
    client = web(mesh)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        assert client.unary(f"{SERVICE}/ModelInfer", infer_request(4).SerializeToString()).status == 0
        series = mesh.console.api("/api/latency")["series"]
        points = [p for p in series.get("standard", []) if p["p50"] is not None]
        if points:
            break
        time.sleep(0.2)
    assert points, series
    # Server-side time per request is at least what the backend reported as compute.
    assert 0 < points[-1]["p50"] <= points[-1]["p99"]
