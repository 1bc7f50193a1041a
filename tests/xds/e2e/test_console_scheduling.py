"""The console shows the scheduling side in headless Chromium: the Endpoint Picker's picks
per replica and its refusals (`mcpctl epp serve`'s /stats), and the decision loop's last
decisions with the inputs of its latest cycle (`mcpctl scheduler run`'s /status), over
two real decoder replicas behind a control-plane-fed gateway (harness/loop_stack.py).
When the picker stops, its panel says so and where it could not be read. Screenshot under
artifacts/console/."""
import os
import re
import subprocess
import sys

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from harness import browser as browser_support
from harness.browser import Browser
from harness.endpoint_picker import PickerProcess, headers_request
from harness.grpcweb_mesh import Console
from harness.loop_stack import WASM, LoopStack
from harness.paths import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(browser_support.missing() is not None,
                                                  reason=browser_support.missing() or "")]
ARTIFACTS = os.path.join(ROOT, "artifacts", "console")


def _ask(stub, subset=None) -> pb.ProcessingResponse:
    """One header-only request through the picker's ext_proc, as Envoy sends it."""
    headers = {":method": "GET", ":path": "/v1/models", ":authority": "models.mesh.local"}
    (resp,) = list(stub.Process(iter([headers_request(headers, True, subset)]), timeout=5))
    return resp


def _rows(page, selector: str) -> list[list[str]]:
    """The cells of the tables under `selector`, row by row, as the page shows them."""
    return page.eval(expression=f"Array.from(document.querySelectorAll('{selector} tr'))"
                                ".map((r) => Array.from(r.cells).map((c) => c.textContent))")


def test_picks_refusals_and_decisions_in_the_console():
    if not os.path.exists(WASM):
        pytest.skip("run `make wasm` first")
    os.makedirs(ARTIFACTS, exist_ok=True)
    with LoopStack() as stack:
        loop = stack.start_loop(period_ms=200)
        picker = PickerProcess(stack.pool_dir, "--metrics-interval-ms", "50")
        console = None
        try:
            picker.wait(lambda s: len(s["endpoints"]) == 2 and all(e["ready"] for e in s["endpoints"].values()))
            with grpc.insecure_channel(f"127.0.0.1:{picker.port}") as channel:
                stub = pb_grpc.ExternalProcessorStub(channel)
                for _ in range(6):
                    assert _ask(stub).WhichOneof("response") == "request_headers"
                refused = _ask(stub, subset=["10.1.2.3:80"])          # no such endpoint: 503
                assert refused.immediate_response.status.code == 503
            picked = {k: e["picked"] for k, e in picker.stats()["endpoints"].items()}
            assert sum(picked.values()) == 6, picked
            console = Console(control_plane=f"127.0.0.1:{stack.cp.admin_port}", picker=f"127.0.0.1:{picker.admin}",
                              decision_loop=loop.admin, scrape_interval="0.25").start()
            with Browser() as page:
                assert page.goto(console.url) == 200
                summary = page.wait_text("#picker-summary", "decisions")
                assert "pool inference/decoders: 7 decisions" in summary, summary
                assert "refused 1 × HTTP 503" in summary, summary
                rows = {r[0]: r for r in _rows(page, "#picker")}
                for endpoint, n in picked.items():     # each replica with its pick count, as /stats counted
                    assert rows[endpoint][1:3] == ["ready", str(n)], rows
                loop_text = page.wait_text("#loop", "cycles")
                assert "policy " in loop_text and "no decision yet" not in loop_text, loop_text
                for endpoint in stack.endpoints:        # the inputs of the latest cycle: both replicas read
                    page.wait_text("#loop", endpoint)
                inputs = {r[0]: r for r in _rows(page, "#loop") if len(r) == 7 and r[0] != "replica"}
                assert sorted(inputs) == sorted(stack.endpoints), inputs
                assert all(r[1] == "0" and r[2] == "0" and r[3].endswith("%") for r in inputs.values()), inputs   # idle
                # the same inputs in `mcpctl scheduler status`: waiting by class and running, per replica
                text = subprocess.run([sys.executable, "-m", "mcp26.mesh.cli", "scheduler", "status", "--admin",
                                       loop.admin], capture_output=True, text=True, timeout=30).stdout
                for endpoint in stack.endpoints:
                    assert re.search(rf"replica {re.escape(endpoint)}: .* waiting 0, running 0, age", text), text
                decided = [r for r in _rows(page, "#loop") if len(r) == 3 and r[0] != "cycle"]
                assert decided and all(re.fullmatch(r"\d+", r[0]) and re.fullmatch(r"\d\d:\d\d:\d\d", r[1]) and r[2]
                                       for r in decided), decided
                assert page.text("#picker-section .updated-scheduling").startswith("updated ")
                page.screenshot(os.path.join(ARTIFACTS, "scheduling.png"))
                picker.stop()
                picker = None
                assert "Endpoint Picker unreachable: http://127.0.0.1:" in page.wait_text("#picker", "unreachable")
                assert f"decision loop: http://{loop.admin}   " in page.text("#sources")   # no error after it
                assert "cycles" in page.text("#loop")                      # the loop's panel stays current
        finally:
            if console:
                console.stop()
            if picker:
                picker.stop()
            loop.stop()
