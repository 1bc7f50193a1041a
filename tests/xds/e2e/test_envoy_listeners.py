"""Underscore twins of the protected headers never reach an upstream (issue 11, item 8).

`end_user` is a different header from `end-user` to Envoy and to the Wasm
header contract, so neither strips it; an upstream that folds `-` and `_`
(CGI, WSGI's HTTP_END_USER, many frameworks) reads it as `end-user`. The
control plane's HCMs drop every header with an underscore
(headers_with_underscores_action: DROP_HEADER). Checked through real Envoys
fed by `mcpctl xds serve`: a gateway running the header-contract Wasm filter
and a sidecar, HTTP/1.1 (http.client) and HTTP/2 (curl, h2c).
"""
import base64
import hashlib
import http.client
import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest

from mcp26.mesh import headers as H
from mcp26.wasm import HEADER_CONTRACT_WASM as WASM
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.demo.stack.control_plane import GATEWAY_NODE, ControlPlane, mesh_envoy, write_config
from harness.manifests import documents, manifest, wasm_module

pytestmark = [pytest.mark.e2e, pytest.mark.adversarial]

SIDECAR_NODE = "sidecar~127.0.0.1~productpage.shop~shop.svc.cluster.local"
KEY = hashlib.sha256(b"adversarial listeners key").digest()
PROTECTED = [H.END_USER, H.TENANT, H.QOS_CLASS, H.SESSION_SIG, H.DOWNSTREAM_ALPN, H.DOWNSTREAM_SERVICE_CLUSTER,
             "x-mcp-email"]
TWINS = {h.replace("-", "_"): "spoofed" for h in PROTECTED}
# Mixed forms too: one underscore is enough to fold into the protected name.
TWINS["end_user"] = "admin"
TWINS["x-mcp_tenant"] = "spoofed"
TWINS["x_mcp-qos-class"] = "latency-critical"


def config(gw_port: int, sidecar_port: int, echo: int) -> str:
    plugin = {"sessionKey": base64.b64encode(KEY).decode(), "claims": [{"claim": "email", "header": "x-mcp-email"}]}
    return documents(
        manifest("gateway.yaml", gw_port=gw_port),
        manifest("service_entry.yaml", name="echo", number=sidecar_port, port_name="http", protocol="HTTP",
                 upstream=echo),
        manifest("gateway_route.yaml", name="gw", host="echo.mesh.local"),
        """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo, namespace: default}
spec:
  hosts: [echo.mesh.local]
  http: [{route: [{destination: {host: echo.mesh.local}}]}]
""",
        manifest("header_contract_plugin.yaml", plugin_config=plugin, **wasm_module(WASM)))


@pytest.fixture(scope="module")
def mesh():
    if not os.path.exists(WASM):
        pytest.skip("run `make wasm` first")
    d = tempfile.mkdtemp(prefix="adv-listeners-")
    echo = EchoUpstream("echo").start()
    ports = {"gateway": free_port(), "sidecar": free_port()}
    write_config(d, "mesh.yaml", config(ports["gateway"], ports["sidecar"], echo.port))
    cp = ControlPlane(d).start()
    envoys = {"gateway": mesh_envoy(cp, labels={"istio": "ingressgateway"}, namespace="default"),
              "sidecar": mesh_envoy(cp, node_id=SIDECAR_NODE, namespace="default")}
    try:
        for name, e in envoys.items():
            e.start()
        cp.wait_synced(GATEWAY_NODE, types=("CDS", "LDS", "ECDS"))
        cp.wait_synced(SIDECAR_NODE, types=("CDS", "LDS"))
        for name in envoys:
            _wait_serving(ports[name])
        yield {"ports": ports, "envoys": envoys, "echo": echo}
    finally:
        for e in envoys.values():
            e.stop()
        cp.close()
        echo.stop()
        shutil.rmtree(d, ignore_errors=True)


def _get(port: int, headers: dict) -> tuple[int, dict]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", "/twins", headers={"host": "echo.mesh.local", **headers})
        r = c.getresponse()
        body = r.read()
        return r.status, (json.loads(body) if r.status == 200 else {"raw": body[:200]})
    finally:
        c.close()


def _wait_serving(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if _get(port, {})[0] == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"127.0.0.1:{port} not serving")
        time.sleep(0.1)


def _underscored(seen_headers: dict) -> dict:
    return {k: v for k, v in seen_headers.items() if "_" in k}


@pytest.mark.parametrize("listener", ["gateway", "sidecar"])
def test_no_underscore_twin_reaches_the_upstream_over_http1(mesh, listener):
    status, seen = _get(mesh["ports"][listener], TWINS)
    assert status == 200, seen
    assert _underscored(seen["headers"]) == {}, seen["headers"]
    # Nothing the client sent became a protected header either.
    assert "spoofed" not in seen["headers"].values() and seen["headers"].get(H.END_USER) != "admin"
    dropped = mesh["envoys"][listener].stats("dropped_headers_with_underscores")
    assert sum(dropped.values()) >= len(TWINS), dropped


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
@pytest.mark.parametrize("listener", ["gateway", "sidecar"])
def test_no_underscore_twin_reaches_the_upstream_over_h2c(mesh, listener):
    args = ["curl", "-sS", "--max-time", "10", "--http2-prior-knowledge", "-H", "host: echo.mesh.local"]
    for k, v in TWINS.items():
        args += ["-H", f"{k}: {v}"]
    out = subprocess.run(args + [f"http://127.0.0.1:{mesh['ports'][listener]}/twins-h2"],
                         capture_output=True, timeout=20)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["path"] == "/twins-h2"
    assert _underscored(seen["headers"]) == {}, seen["headers"]
    assert seen["headers"].get(H.END_USER) != "admin"
