"""The command lines: `mcpctl envoy bootstrap` accepted by Envoy itself, `mcpctl demo` end to end."""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request

import pytest
import yaml

from mcp26.demo.stack.envoy import envoy_binary
from mcp26.wasm import HEADER_CONTRACT_WASM as WASM
from mcp26.serving.executables import executable

pytestmark = pytest.mark.e2e

# The demo tests start `mcpctl demo` as a process: what they test is that process's children
# (all gone afterwards) and its answer to SIGTERM. The others run in-process (conftest's mcpctl).
MCPCTL = executable("mcpctl")


@pytest.mark.parametrize("delta", [False, True])
def test_bootstrap_is_valid_for_envoy(mcpctl, tmp_path, delta):
    args = ["envoy", "bootstrap", "--node-id", "router~127.0.0.1~gw.default~default.svc.cluster.local",
            "--cluster", "gw", "--xds-address", "127.0.0.1:18000", "--admin-port", "0",
            "--label", "istio=ingressgateway"] + (["--delta"] if delta else [])
    out = mcpctl(*args)
    assert out.returncode == 0, out.stderr
    boot = yaml.safe_load(out.stdout)
    assert boot["dynamic_resources"]["ads_config"]["api_type"] == ("DELTA_GRPC" if delta else "GRPC")
    assert boot["node"]["metadata"]["LABELS"] == {"istio": "ingressgateway"}
    path = tmp_path / "bootstrap.yaml"
    path.write_text(out.stdout)
    check = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(path), "-l", "error"],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def test_bootstrap_rejects_a_bad_address(mcpctl):
    out = mcpctl("envoy", "bootstrap", "--node-id", "n", "--xds-address", "no-port")
    assert out.returncode == 2 and "HOST:PORT" in out.stderr


def test_proxy_status_without_a_control_plane_says_so(mcpctl):
    out = mcpctl("proxy-status", "--admin-address", "127.0.0.1:9")
    assert out.returncode == 1 and "cannot reach the control plane" in out.stderr


def test_demo_routes_as_configured_and_stops_everything():
    # The demo's work dir goes under a TMPDIR of this test's own, so the check below sees this
    # demo's processes only (another demo may run on the same machine).
    tmp = tempfile.mkdtemp(prefix="demo-t-")
    out = subprocess.run([MCPCTL, "demo", "--delta", "--keep"], capture_output=True, text=True,
                         timeout=180, env={**os.environ, "TMPDIR": tmp})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "demo passed" in out.stdout
    assert "1000 requests -> v1 " in out.stdout and "FAIL" not in out.stdout
    if os.path.exists(WASM):   # the header-contract step ran (it skips, with the reason, without the module)
        assert "header contract: JWT session headers" in out.stdout
        assert "verify_session: valid (end-user=jason, x-mcp-tenant=acme" in out.stdout
        assert "expired token -> HTTP 401; forged token (same kid, other key) -> HTTP 401;" \
               " requests that reached an upstream: 0" in out.stdout
    # Every process the demo started is gone (they were in their own sessions).
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert [d for d in os.listdir(tmp) if d.startswith("mcp-demo-")], "the demo's work dir is elsewhere"
    assert f"{tmp}/mcp-demo-" not in ps
    shutil.rmtree(tmp, ignore_errors=True)


def test_demo_serve_keeps_everything_running_until_sigterm():
    proc = subprocess.Popen([MCPCTL, "demo", "--serve"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 180
        while not any(line.startswith("  work dir ") for line in lines):
            line = proc.stdout.readline()
            assert line and time.monotonic() < deadline, "".join(lines[-60:])
            lines.append(line)
        out = "".join(lines)
        assert "demo passed" in out and "serving (Ctrl-C or SIGTERM" in out, out[-3000:]
        start = next(i for i, x in enumerate(lines) if x.startswith("serving"))
        urls = dict(line.strip().rsplit(None, 1) for line in lines[start + 1:-1])   # name -> URL, up to "work dir"
        # After the checks the parts still answer: the gateway routes, the console and the control plane serve.
        req = urllib.request.Request(urls["gateway (reviews)"], headers={"host": "reviews.demo.local"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert json.loads(r.read())["upstream"] == "v1"
        with urllib.request.urlopen(urls["console"] + "api/config", timeout=10) as r:
            assert r.status == 200
        with urllib.request.urlopen(urls["xDS admin"], timeout=10) as r:
            assert any(n["node"].startswith("router~") for n in json.loads(r.read()))
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, rest
        assert "stopping" in rest
    finally:
        if proc.poll() is None:
            # SIGTERM first: the demo stops what it started (a SIGKILL would orphan its
            # control plane and Envoys, each in a session of its own).
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "mcp-demo-" not in ps
