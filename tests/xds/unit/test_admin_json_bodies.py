"""Hostile JSON bodies on the admin APIs the decision loop drives — the control plane's
/scheduler/class-remap and /scheduler/endpoint-weight, a model server's /admin/policy, /admin/reload
and /admin/workers: not JSON, truncated, not UTF-8, nested past the parser's recursion. Each is a
400 naming the body, nothing is applied, and the server keeps answering."""
import json
import tempfile
import urllib.error
import urllib.request

import pytest

from mcp26.demo.stack.inference_server import InferenceServer
from mcp26.demo.stack.control_plane import ControlPlane

pytestmark = pytest.mark.adversarial

BAD_BODIES = {
    "not JSON": b"{{{",
    "truncated": b'{"from": "standard", "to": "batch", "expires_at": 17',
    "not UTF-8": b'{"from": "\xff\xfe"}',
    "nested past recursion": b"[" * 100_000 + b"]" * 100_000,
}


def _post(url: str, body: bytes) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture(scope="module")
def control_plane():
    cp = ControlPlane(tempfile.mkdtemp(prefix="admin-bodies-")).start()
    try:
        yield f"http://127.0.0.1:{cp.admin_port}"
    finally:
        cp.close()


@pytest.mark.parametrize("path", ["/scheduler/class-remap", "/scheduler/endpoint-weight"])
@pytest.mark.parametrize("name", BAD_BODIES)
def test_control_plane_scheduler_api_refuses_the_body(control_plane, path, name):
    status, text = _post(control_plane + path, BAD_BODIES[name])
    assert status == 400 and "body" in json.loads(text)["error"], (status, text)
    with urllib.request.urlopen(control_plane + "/scheduler", timeout=5) as r:
        state = json.load(r)
    assert state["class_remaps"] == [] and state["endpoint_weights"] == []


@pytest.fixture(scope="module")
def replica_admin():
    server = InferenceServer("builtin:mlp").start()
    try:
        yield f"http://127.0.0.1:{server.admin_port}"
    finally:
        server.stop()


@pytest.mark.parametrize("path", ["/admin/policy", "/admin/reload", "/admin/workers"])
@pytest.mark.parametrize("name", BAD_BODIES)
def test_model_server_admin_api_refuses_the_body(replica_admin, path, name):
    with urllib.request.urlopen(replica_admin + "/admin/status", timeout=5) as r:
        before = json.load(r)["models"][0]["batching"]
    status, text = _post(replica_admin + path, BAD_BODIES[name])
    assert status == 400 and "body" in json.loads(text)["error"], (status, text)
    with urllib.request.urlopen(replica_admin + "/admin/status", timeout=5) as r:
        assert json.load(r)["models"][0]["batching"] == before
