"""The header contract's session key through Envoy's environment, end to end.

`mcpctl envoy run --session-key-file` (0600) puts the key into Envoy's
environment; the WasmPlugin says `sessionKeyFrom: {env: MESH_SESSION_KEY}`, so
the control plane pushes `host_env_keys: [MESH_SESSION_KEY]` over ECDS and no key.
A real Envoy signs with that key, and neither Envoy's /config_dump nor the control
plane's /debug/config_dump holds it, in hex or base64.
"""
import base64
import hashlib
import http.client
import json
import os
import subprocess
import tempfile
import time

import pytest

from mcp26.mesh import headers as H
from mcp26.mesh.session import SessionError, verify_session
from mcp26.wasm import HEADER_CONTRACT_WASM as WASM
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.demo.stack.control_plane import GATEWAY_NODE, ControlPlane, write_config
from mcp26.serving.executables import executable
from harness.manifests import documents, manifest, wasm_module

pytestmark = pytest.mark.e2e

KEY = hashlib.sha256(b"e2e session key from the environment").digest()
ENV = "MESH_SESSION_KEY"
MCPCTL = executable("mcpctl")


def mesh_yaml(gw_port: int, upstream: int) -> str:
    return documents(
        manifest("gateway.yaml", gw_port=gw_port),
        manifest("service_entry.yaml", name="echo", number=80, port_name="http", protocol="HTTP", upstream=upstream),
        manifest("gateway_route.yaml", name="echo", host="echo.mesh.local"),
        manifest("header_contract_plugin.yaml", plugin_config={"sessionKeyFrom": {"env": ENV}}, **wasm_module(WASM)))


def get(port: int, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/hello", headers={"host": "echo.example.com", **(headers or {})})
        r = conn.getresponse()
        data = r.read()
        return r.status, (json.loads(data) if r.status == 200 else data.decode(errors="replace"))
    finally:
        conn.close()


@pytest.fixture(scope="module")
def stack():
    if not os.path.exists(WASM):
        pytest.skip("run `make wasm` first")
    d = tempfile.mkdtemp(prefix="mesh-keyenv-")
    key_file = os.path.join(d, "session.key")
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(KEY)
    gw_port, admin = free_port(), free_port()
    up = EchoUpstream("echo").start()
    cfg_dir = os.path.join(d, "config")
    os.mkdir(cfg_dir)
    write_config(cfg_dir, "mesh.yaml", mesh_yaml(gw_port, up.port))
    cp = ControlPlane(cfg_dir).start()
    log = open(os.path.join(d, "envoy.log"), "wb")
    env = {k: v for k, v in os.environ.items() if k != ENV}
    envoy = subprocess.Popen([MCPCTL, "envoy", "run", "--node-id", GATEWAY_NODE, "--xds-address", cp.address,
                              "--admin-port", str(admin), "--label", "istio=ingressgateway", "--namespace", "default",
                              "--session-key-file", key_file, "--session-key-env", ENV],
                             stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        cp.wait_synced(GATEWAY_NODE, types=("CDS", "LDS", "ECDS"))
        deadline = time.monotonic() + 20
        while True:
            try:
                if get(gw_port)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or envoy.poll() is not None:
                log.flush()
                raise TimeoutError(f"gateway not serving:\n{open(log.name).read()[-3000:]}\n{cp.log_tail()}")
            time.sleep(0.1)
        yield {"gw": gw_port, "admin": admin, "cp": cp}
    finally:
        envoy.terminate()
        try:
            envoy.wait(10)
        except subprocess.TimeoutExpired:
            envoy.kill()
        cp.close()
        up.stop()
        log.close()


def _secrets(text: str) -> list[str]:
    k64 = base64.b64encode(KEY).decode()
    return [s for s in (KEY.hex(), KEY.hex().upper(), k64, k64.rstrip("="),
                        base64.urlsafe_b64encode(KEY).decode().rstrip("=")) if s in text]


def test_the_signature_verifies_with_the_key_from_the_file(stack):
    status, seen = get(stack["gw"], {H.QOS_CLASS: "latency-critical", H.END_USER: "admin"})
    assert status == 200, seen
    h = seen["headers"]
    assert H.END_USER not in h and h[H.QOS_CLASS] == "standard"
    assert verify_session(h, KEY, method="GET").signed == {H.QOS_CLASS: "standard"}
    with pytest.raises(SessionError):
        verify_session(h, hashlib.sha256(b"another key").digest(), method="GET")


def test_no_config_dump_holds_the_key(stack):
    conn = http.client.HTTPConnection("127.0.0.1", stack["admin"], timeout=10)
    conn.request("GET", "/config_dump?include_eds")
    envoy_dump = conn.getresponse().read().decode()
    conn.close()
    # the dump does show the Wasm filter's configuration: the variable's name, not its value
    assert '"host_env_keys"' in envoy_dump and '\\"key_env\\":\\"' + ENV in envoy_dump, envoy_dump[:2000]
    assert _secrets(envoy_dump) == []
    cp = stack["cp"]
    status, text = cp.get(f"/debug/config_dump?node={GATEWAY_NODE}")
    assert status == 200 and ENV in text, text[:300]      # the plugin is in it, by variable name
    assert _secrets(text) == []
