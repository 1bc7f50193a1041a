"""Sidecar outboundTrafficPolicy through a real Envoy: under REGISTRY_ONLY a host in no
service gets 502 (block_all) while a registered one passes; switching to ALLOW_ANY is
accepted by Envoy (PassthroughCluster, ORIGINAL_DST) and the 502 goes away."""
import http.client
import os
import tempfile
import time

import pytest

from mcp26.demo.stack.envoy import Envoy
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.demo.stack.control_plane import ControlPlane, write_config
from mcp26.xds.bootstrap import envoy_bootstrap

pytestmark = pytest.mark.e2e

NODE = "sidecar~127.0.0.1~a-1.shop~shop.svc.cluster.local"
MESH = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: b, namespace: shop}}
spec:
  hosts: [b.shop.svc.cluster.local]
  ports: [{{number: {port}, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints: [{{address: 127.0.0.1, ports: {{http: {up}}}}}]
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: a, namespace: shop}}
spec:
  workloadSelector: {{labels: {{app: a}}}}
  outboundTrafficPolicy: {{mode: {mode}}}
"""


def call(port, host):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/x", headers={"host": host})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def wait_for(fn, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            if fn():
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_registry_only_then_allow_any():
    d = tempfile.mkdtemp(prefix="outbound-policy-")
    port = free_port()
    up = EchoUpstream("b").start()
    write_config(d, "mesh.yaml", MESH.format(port=port, up=up.port, mode="REGISTRY_ONLY"))
    cp = ControlPlane(d).start()
    admin = free_port()
    envoy = Envoy(envoy_bootstrap(node_id=NODE, xds_address=cp.address, admin_port=admin, labels={"app": "a"}),
                  admin_port=admin)
    try:
        envoy.start()
        wait_for(lambda: call(port, "b.shop.svc.cluster.local")[0] == 200)
        status, _ = call(port, "unknown.example.com")
        assert status == 502
        before = cp.configz()["generation"]
        write_config(d, "mesh.yaml", MESH.format(port=port, up=up.port, mode="ALLOW_ANY"))
        cp.wait_generation_change(before)
        cp.wait_synced(NODE, types=("CDS", "RDS"))
        # Envoy took the PassthroughCluster (not NACKed) and the block_all route is gone
        wait_for(lambda: call(port, "unknown.example.com")[0] != 502)
        # no iptables redirect here, so the connection has no original destination for
        # ORIGINAL_DST to use: Envoy answers 503 (no host), never loops back to itself
        assert call(port, "unknown.example.com") == (503, b"no healthy upstream")
        assert "PassthroughCluster" in envoy.admin("/clusters")[1]
        assert call(port, "b.shop.svc.cluster.local")[0] == 200
    finally:
        envoy.stop()
        cp.close()
        up.stop()
