"""The header-contract session key never shows on the control plane's admin port,
and `mcpctl xds serve` will not expose that port (or ADS) beyond loopback unasked
(issue 11, item 10).

With the key anyone signs `end-user: admin` at priority 1. It must be in the
Wasm filter's configuration the control plane pushes, so every debug view of a
snapshot carries it unless redacted. A real control plane serves a real Envoy
(gateway, header contract over ECDS); every admin view is fetched and searched
for the key in each form it could take.
"""
import base64
import hashlib
import json
import os
import shutil
import subprocess
import tempfile

import pytest

from mcp26.wasm import HEADER_CONTRACT_WASM as WASM
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.control_plane import GATEWAY_NODE, ControlPlane, mesh_envoy, write_config
from mcp26.xds.redact import redact_text
from mcp26.serving.executables import executable
from harness.manifests import documents, manifest, wasm_module

pytestmark = [pytest.mark.e2e, pytest.mark.adversarial]

KEY = hashlib.sha256(b"adversarial admin key").digest()
FORMS = [KEY.hex(), KEY.hex().upper(), base64.b64encode(KEY).decode()]
MCPCTL = executable("mcpctl")


def config(gw_port: int) -> str:
    plugin = {"sessionKey": base64.b64encode(KEY).decode()}
    return documents(manifest("gateway.yaml", gw_port=gw_port),
                     manifest("header_contract_plugin.yaml", plugin_config=plugin, **wasm_module(WASM)))


@pytest.fixture(scope="module")
def plane():
    if not os.path.exists(WASM):
        pytest.skip("run `make wasm` first")
    d = tempfile.mkdtemp(prefix="adv-admin-")
    write_config(d, "mesh.yaml", config(free_port()))
    cp = ControlPlane(d).start()
    envoy = mesh_envoy(cp, labels={"istio": "ingressgateway"}, namespace="default")
    try:
        envoy.start()
        cp.wait_synced(GATEWAY_NODE, types=("CDS", "LDS", "ECDS"))
        yield cp, envoy
    finally:
        envoy.stop()
        cp.close()
        shutil.rmtree(d, ignore_errors=True)


def _assert_no_key(text: str, where: str) -> None:
    for form in FORMS:
        assert form not in text, f"session key ({form[:8]}...) in {where}"


def test_config_dump_has_the_contract_but_not_its_key(plane):
    cp, _ = plane
    status, text = cp.get(f"/debug/config_dump?node={GATEWAY_NODE}")
    assert status == 200
    _assert_no_key(text, "/debug/config_dump")
    ecds = json.loads(text)["resources"]["ECDS"]
    [(name, entry)] = ecds.items()
    configuration = entry["resource"]["typedConfig"]["config"]["configuration"]["value"]
    session = json.loads(configuration)["session"]
    # Still a useful view: everything but the key.
    assert session["key"] == "[redacted]" and session["header"] == "x-mcp-session-sig" and session["signed"]


@pytest.mark.parametrize("path", ["/debug/configz", "/debug/syncz", "/debug/tracez", "/healthz", "/metrics"])
def test_no_other_admin_view_shows_the_key(plane, path):
    cp, _ = plane
    status, text = cp.get(path)
    assert status == 200
    _assert_no_key(text, path)


def test_envoy_itself_still_has_the_key_in_its_config_dump(plane):
    """Documents what is left (issue 11 item 10; SDS is the identity issue's): Envoy's own
    admin shows the key, so Envoy's admin port must stay loopback-only."""
    _, envoy = plane
    status, text = envoy.admin("/config_dump?resource=ecds_filters")
    assert status == 200 and KEY.hex() in text


def test_a_key_quoted_in_an_envoy_nack_is_redacted_too():
    # Envoy quotes a rejected config as escaped JSON inside its error text.
    nack = ('Proto constraint validation failed: config { configuration { value: "{\\"session\\":'
            '{\\"header\\":\\"x-mcp-session-sig\\",\\"key\\":\\"' + KEY.hex() + '\\"}}" } }')
    out = redact_text(json.dumps({"error": nack}))
    _assert_no_key(out, "a NACK message")
    assert "[redacted]" in out


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "192.0.2.1", "example.com"])
def test_serve_refuses_a_non_loopback_address(address, tmp_path):
    out = subprocess.run([MCPCTL, "xds", "serve", "--config-dir", str(tmp_path), "--address", address,
                          "--port", "0", "--admin-port", "0"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert f"refusing --address {address}" in out.stderr and "--allow-remote" in out.stderr


def test_allow_remote_lets_the_address_through(tmp_path):
    # Past the address check, the next one (a missing directory) answers: nothing is bound.
    out = subprocess.run([MCPCTL, "xds", "serve", "--config-dir", str(tmp_path / "missing"),
                          "--address", "0.0.0.0", "--allow-remote"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "does not exist" in out.stderr and "refusing" not in out.stderr
