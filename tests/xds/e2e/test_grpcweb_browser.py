"""The console page in headless Chromium: ModelInfer over gRPC-Web (connect-web) through Envoy.

The page is served by `mcpctl console` on its own origin; its calls go
cross-origin to the gateway Envoy (so the CORS preflight from the
VirtualService's corsPolicy must pass), are translated to gRPC there and
answered by the real backend. Numbers are compared with a direct gRPC call.
A screenshot is kept under artifacts/grpcweb/.
"""
import json
import os

import grpc
import numpy as np
import pytest

from mcp26.inference.protos import grpc_service_pb2 as pb
from mcp26.inference.protos import grpc_service_pb2_grpc as pb_grpc
from harness import browser as browser_support
from harness.browser import Browser
from mcp26.mesh.qos import LLM_PRIORITY_CLASSES
from harness.grpcweb_mesh import MODEL, grpcweb_mesh
from harness.paths import ROOT
from mcp26.wasm import HEADER_CONTRACT_WASM as WASM

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(browser_support.missing() is not None,
                                                  reason=browser_support.missing() or "")]
ARTIFACTS = os.path.join(ROOT, "artifacts", "grpcweb")
VALUES = [i / 8 - 4 for i in range(64)]   # exact in float32, so the page's text round-trips


@pytest.fixture(scope="module")
def mesh():
    with grpcweb_mesh(console_flags={"latency_window": "1", "scrape_interval": "0.25"},
                      header_contract=os.path.exists(WASM)) as m:
        yield m


@pytest.fixture(scope="module")
def page(mesh):
    with Browser() as b:
        assert b.goto(mesh.console.url) == 200
        yield b


def direct_infer(mesh, model: str = MODEL):
    req = pb.ModelInferRequest(model_name=model)
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 64])
    req.raw_input_contents.append(np.array(VALUES, dtype="<f4").tobytes())
    with grpc.insecure_channel(f"127.0.0.1:{mesh.backend.grpc_port}") as ch:
        return pb_grpc.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=10, metadata=mesh.direct_metadata())


def infer_in_page(page, model: str) -> str:
    page.fill("#model", model)
    page.fill("#input-name", "INPUT0")
    page.fill("#shape", "1,64")
    page.fill("#values", ", ".join(repr(v) for v in VALUES))
    page.eval("document.getElementById('infer-result').removeAttribute('data-state')")
    page.click("#infer-button")
    return page.wait_attr("#infer-result", "data-state")


def test_page_shows_the_mesh_from_the_control_plane(page, mesh):
    proxies = page.wait_text("#proxies", mesh.envoy_node)
    assert "ACK" in proxies and "NACK" not in proxies
    assert "/inference.GRPCInferenceService/" in page.wait_text("#routes", "inference.mesh.local")
    endpoints = page.wait_text("#endpoints", f"127.0.0.1:{mesh.backend.grpc_port}")
    assert "HEALTHY" in endpoints


def test_model_infer_in_the_browser_returns_what_direct_grpc_returns(page, mesh):
    page.click("#metadata-button")     # ModelMetadata over gRPC-Web fills input name and shape
    page.wait_text("#infer-result", "INPUT0 FP32")
    assert page.eval("document.getElementById('shape').value") == "1,64"
    assert infer_in_page(page, MODEL) == "ok", page.text("#infer-error")
    outputs = json.loads(page.attr("#infer-result", "data-outputs"))
    want = direct_infer(mesh)
    want_values = np.frombuffer(want.raw_output_contents[0], dtype="<f4").tolist()
    assert outputs[0]["name"] == want.outputs[0].name == "OUTPUT0"
    assert outputs[0]["shape"] == list(want.outputs[0].shape) == [1, 16]
    assert outputs[0]["values"] == want_values          # exactly: float32 -> double on both sides
    # The call went cross-origin to Envoy, after a CORS preflight the browser made itself.
    posts = [r for r in page.requests() if r["method"] == "POST" and "ModelInfer" in r["url"]]
    assert posts and posts[-1]["status"] == 200
    assert posts[-1]["headers"]["access-control-allow-origin"] == mesh.origin


@pytest.mark.skipif(not os.path.exists(WASM), reason=f"{WASM} not built (make wasm)")
def test_priority_chosen_in_the_page_is_the_class_the_backend_queued(page, mesh):
    # the choices are named as the mesh's classes, with the X-LLM-Priority value each sends
    options = page.eval(expression="Array.from(document.querySelectorAll('#priority option')).map((o) => o.textContent)")
    assert options[1:] == [f"{c.header_value} ({p})" for p, c in LLM_PRIORITY_CLASSES.items()], options
    page.select("#priority", "high")
    try:
        assert infer_in_page(page, MODEL) == "ok", page.text("#infer-error")
        cls = LLM_PRIORITY_CLASSES["high"]
        assert f"queued as {cls.header_value} (priority level {cls.priority_level})" in page.text("#infer-result")
    finally:
        page.select("#priority", "")


def test_backend_error_shows_as_a_readable_message(page, mesh):
    with pytest.raises(grpc.RpcError) as direct_err:
        direct_infer(mesh, model="ghost-model")
    assert infer_in_page(page, "ghost-model") == "error"
    shown = page.text("#infer-error")
    code = direct_err.value.code().name          # e.g. NOT_FOUND
    assert shown == f"ModelInfer failed — {code}: {direct_err.value.details()}", shown
    page.screenshot(os.path.join(ARTIFACTS, "console-error.png"))


def test_latency_plot_is_drawn_and_screenshot_kept(page, mesh):
    for _ in range(5):
        assert infer_in_page(page, MODEL) == "ok"
    page.call("wait_attr", selector="#latency-plot", name="data-points", timeout=15000)
    page.eval("""new Promise((ok) => { const c = document.getElementById('latency-plot');
        const t = setInterval(() => { if (Number(c.dataset.points) > 0) { clearInterval(t); ok(); } }, 100); })""")
    assert "mcp_inference_request_duration_seconds" in page.text("#latency-note")
    os.makedirs(ARTIFACTS, exist_ok=True)
    path = page.screenshot(os.path.join(ARTIFACTS, "console.png"))
    assert os.path.getsize(path) > 10_000
    assert not [line for line in page.log() if line.startswith("pageerror")]


def test_nack_shows_on_the_page(page, mesh):
    # A cluster Envoy must refuse: the gateway NACKs the CDS push, the page says why.
    mesh.cp.inject([{"type_url": "type.googleapis.com/envoy.config.cluster.v3.Cluster", "name": "bad",
                     "resource": {"name": "bad", "type": "STATIC", "connect_timeout": "1s",
                                  "load_assignment": {"cluster_name": "bad", "endpoints": [{"lb_endpoints": [
                                      {"endpoint": {"address": {"socket_address": {
                                          "address": "not-an-ip", "port_value": 1}}}}]}]}}}])
    try:
        shown = page.wait_text("#proxies", "NACK", timeout=15000)
        assert "not-an-ip" in shown
        page.screenshot(os.path.join(ARTIFACTS, "console-nack.png"))
    finally:
        mesh.cp.inject([])
