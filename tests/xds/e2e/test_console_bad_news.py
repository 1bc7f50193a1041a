"""The console in headless Chromium shows bad news where operators look: a change set
rejected whole (red banner with file:line, though every proxy is SYNCED), then a control
plane that stopped answering (banner with since-when, the last data kept, every panel's
time); the routes filter narrows the tables; each route names its VirtualService
and the rule's file:line; a model server's load per model.
Screenshots are kept under artifacts/console/."""
import os
import time

import pytest

from harness import browser as browser_support
from harness.browser import Browser
from harness.grpcweb_mesh import Console
from harness.paths import ROOT
from mcp26.demo.stack.control_plane import ControlPlane, mesh_envoy, write_config
from mcp26.demo.stack.inference_server import InferenceServer
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.demo.stack.xds_scenario import GATEWAY_LABELS, base_config, virtual_service

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(browser_support.missing() is not None,
                                                  reason=browser_support.missing() or "")]
ARTIFACTS = os.path.join(ROOT, "artifacts", "console")
NODE = "router~127.0.0.1~gw-c.default~default.svc.cluster.local"


def test_rejected_change_set_then_unreachable_control_plane(tmp_path):
    os.makedirs(ARTIFACTS, exist_ok=True)
    d = str(tmp_path)
    ups = {v: EchoUpstream(v).start() for v in ("v1", "v2", "v3")}
    for name, text in base_config(free_port(), {v: u.port for v, u in ups.items()}).items():
        write_config(d, name, text)
    cp = ControlPlane(d)
    try:
        cp.start()
        with mesh_envoy(cp, node_id=NODE, labels=GATEWAY_LABELS), InferenceServer("builtin:mlp", admin=False) as backend:
            cp.wait_synced(NODE, types=("CDS", "EDS", "LDS", "RDS"))
            console = Console(control_plane=f"127.0.0.1:{cp.admin_port}", backend=f"http://{backend.http}",
                              scrape_interval="0.25").start()
            try:
                with Browser() as page:
                    assert page.goto(console.url) == 200
                    page.wait_text("#proxies", NODE)
                    assert page.wait_text("#inference", "mlp")
                    assert page.text("#banner").strip() == ""
                    # the routes filter: a string no route has empties the table, and says so
                    page.fill("#filter", "reviews")
                    page.wait_text("#routes-count", "of")
                    assert "reviews" in page.text("#routes")
                    # each route names its VirtualService and the rule's file:line: that line opens the rule
                    froms = page.eval(expression="Array.from(document.querySelectorAll('#routes tr'))"
                                                 ".slice(1).map((r) => r.cells[4].textContent)")
                    assert froms and all(f.startswith("VirtualService default/reviews (") for f in froms), froms
                    with open(os.path.join(d, "virtualservice.yaml")) as f:
                        lines = f.read().splitlines()
                    for text in froms:
                        path, line = text[text.index("(") + 1:-1].rsplit(":", 1)
                        assert path == "virtualservice.yaml", text          # relative to the watched directory
                        assert lines[int(line) - 1].lstrip().startswith("- "), (text, lines[int(line) - 1])
                    assert len(set(froms)) == 2, froms        # two http rules, two places
                    page.fill("#filter", "no-such-route-anywhere")
                    assert page.wait_text("#routes-count", "0 of").startswith("0 of")
                    page.fill("#filter", "")
                    # a change set rejected whole
                    since = time.time()
                    write_config(d, "virtualservice.yaml", virtual_service(default=[("v9", None)]))
                    cp.wait_rejected(since)
                    banner = page.wait_text("#banner", "Config rejected")
                    assert "virtualservice.yaml:" in banner and "IST0101" in banner and "every proxy keeps g" in banner
                    assert page.attr("#banner", "data-state") == "rejected"
                    page.screenshot(os.path.join(ARTIFACTS, "rejected.png"))
                    # the control plane goes away: the last view stays, under the banner
                    cp.kill()
                    banner = page.wait_text("#banner", "Control plane unreachable since")
                    assert "showing what it said at" in banner
                    assert NODE in page.text("#proxies")
                    assert "control plane unreachable" in page.text("#routes-section .updated")
                    # every panel that shows data says when it was last updated
                    for panel in ("#proxies-section .updated", "#inference-section .updated",
                                  "#latency-section .updated-latency", "#endpoints-section .updated"):
                        assert page.text(panel).startswith("updated "), panel
                    page.screenshot(os.path.join(ARTIFACTS, "unreachable.png"))
            finally:
                console.stop()
    finally:
        cp.close()
        for u in ups.values():
            u.stop()
