"""The bootstrap for the authenticated port and for replicas, as Envoy itself reads it
(`envoy --mode validate`): two control-plane endpoints, TLS to the mesh CA's root with the
server name checked, and the ServiceAccount token as the stream's `authorization` header."""
import subprocess

import pytest
import yaml

from mcp26.demo.stack.envoy import envoy_binary
from mcp26.xds.bootstrap import XDS_CLUSTER, envoy_bootstrap
from mcp26.xds.ca import MeshCA

pytestmark = pytest.mark.e2e


def test_envoy_accepts_the_secure_replicated_bootstrap(tmp_path):
    ca = MeshCA.load_or_create(str(tmp_path / "ca"))
    (tmp_path / "root.pem").write_bytes(ca.root_pem())
    boot = envoy_bootstrap(node_id="sidecar~10.0.0.1~a.ns~ns.svc.cluster.local", xds_address="127.0.0.1:15012,127.0.0.2:15012",
                           namespace="ns", service_account="a", ca_file=str(tmp_path / "root.pem"),
                           server_name="mcp-mesh-xds.mcp-mesh.svc", token="eyJhbGciOi.x.y")
    (cluster,) = boot["static_resources"]["clusters"]
    assert cluster["name"] == XDS_CLUSTER
    assert [e["endpoint"]["address"]["socket_address"]["address"]
            for e in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]] == ["127.0.0.1", "127.0.0.2"]
    tls = cluster["transport_socket"]["typed_config"]
    assert tls["sni"] == "mcp-mesh-xds.mcp-mesh.svc"
    assert boot["dynamic_resources"]["ads_config"]["grpc_services"][0]["initial_metadata"] == [
        {"key": "authorization", "value": "Bearer eyJhbGciOi.x.y"}]
    path = tmp_path / "boot.yaml"
    path.write_text(yaml.safe_dump(boot))
    r = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "OK" in r.stdout + r.stderr, (r.stdout + r.stderr)[-2000:]
