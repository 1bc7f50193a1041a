"""The command lines: `mcpctl envoy bootstrap` accepted by Envoy itself, `mcpctl demo` end to end."""
import os
import subprocess
import sys

import pytest
import yaml

from support.envoy import envoy_binary

MCPCTL = os.path.join(os.path.dirname(sys.executable), "mcpctl")


@pytest.mark.parametrize("delta", [False, True])
def test_bootstrap_is_valid_for_envoy(tmp_path, delta):
    args = [MCPCTL, "envoy", "bootstrap", "--node-id", "router~127.0.0.1~gw.default~default.svc.cluster.local",
            "--cluster", "gw", "--xds-address", "127.0.0.1:18000", "--admin-port", "0",
            "--label", "istio=ingressgateway"] + (["--delta"] if delta else [])
    out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    boot = yaml.safe_load(out.stdout)
    assert boot["dynamic_resources"]["ads_config"]["api_type"] == ("DELTA_GRPC" if delta else "GRPC")
    assert boot["node"]["metadata"]["LABELS"] == {"istio": "ingressgateway"}
    path = tmp_path / "bootstrap.yaml"
    path.write_text(out.stdout)
    check = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(path), "-l", "error"],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def test_bootstrap_rejects_a_bad_address():
    out = subprocess.run([MCPCTL, "envoy", "bootstrap", "--node-id", "n", "--xds-address", "no-port"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "HOST:PORT" in out.stderr


def test_proxy_status_without_a_control_plane_says_so():
    out = subprocess.run([MCPCTL, "proxy-status", "--admin-address", "127.0.0.1:9"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "cannot reach the control plane" in out.stderr


def test_demo_routes_as_configured_and_stops_everything():
    out = subprocess.run([MCPCTL, "demo", "--delta"], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "demo passed" in out.stdout
    assert "1000 requests -> v1 " in out.stdout and "FAIL" not in out.stdout
    # Every process the demo started is gone (they were in their own sessions).
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "mcp-demo-" not in ps
