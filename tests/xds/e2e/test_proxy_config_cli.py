"""`mcpctl proxy-config` against a real control plane and a real Envoy attached to it.

The tables are read from what the control plane says it sent the node, and,
with --envoy-admin, compared with what that Envoy holds: after the Envoy
ACKs, every resource must read SAME.
"""

import pytest

from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.demo.stack.control_plane import ControlPlane, GATEWAY_NODE, mesh_envoy
from mcp26.demo.stack.ports import free_port

pytestmark = pytest.mark.e2e

CONFIG = """
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: ingress, namespace: default}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: {gw}, name: http, protocol: HTTP}}
    hosts: ["*"]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: reviews, namespace: default}}
spec:
  hosts: [reviews.default.svc.cluster.local]
  ports: [{{number: 9080, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints:
  - {{address: 127.0.0.1, ports: {{http: {port}}}, labels: {{version: v1}}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: reviews, namespace: default}}
spec:
  host: reviews
  subsets: [{{name: v1, labels: {{version: v1}}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: reviews, namespace: default}}
spec:
  hosts: [reviews.example.com]
  gateways: [ingress]
  http:
  - route: [{{destination: {{host: reviews, subset: v1}}}}]
"""

@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    d = tmp_path_factory.mktemp("pc")
    with EchoUpstream("v1") as up:
        (d / "mesh.yaml").write_text(CONFIG.format(gw=free_port(), port=up.port))
        with ControlPlane(str(d)) as cp:
            with mesh_envoy(cp, labels={"istio": "ingressgateway"}) as envoy:
                cp.wait_synced(GATEWAY_NODE, types=("CDS", "EDS", "LDS", "RDS"))
                yield cp, envoy, up


def test_clusters_table_from_the_control_plane(mcpctl, mesh):
    cp, _, _ = mesh
    out = mcpctl("proxy-config", "clusters", GATEWAY_NODE, "--admin-address", f"127.0.0.1:{cp.admin_port}")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["SERVICE", "FQDN", "PORT", "SUBSET", "DIRECTION", "TYPE", "DESTINATION", "RULE"]
    rows = {tuple(line.split()[:5]) for line in lines[1:]}
    assert ("reviews.default.svc.cluster.local", "9080", "v1", "outbound", "EDS") in rows


def test_every_kind_matches_what_envoy_holds(mcpctl, mesh):
    cp, envoy, up = mesh
    for kind in ("listeners", "routes", "clusters", "endpoints"):
        out = mcpctl("proxy-config", kind, GATEWAY_NODE, "--admin-address", f"127.0.0.1:{cp.admin_port}",
                     "--envoy-admin", f"127.0.0.1:{envoy.admin_port}")
        assert out.returncode == 0, out.stderr
        assert "Envoy holds the same" in out.stdout, (kind, out.stdout)
    endpoints = mcpctl("proxy-config", "endpoints", GATEWAY_NODE, "--admin-address", f"127.0.0.1:{cp.admin_port}")
    assert f"127.0.0.1:{up.port}" in endpoints.stdout


def test_routes_name_the_virtual_service_and_json_parses(mcpctl, mesh):
    cp, _, _ = mesh
    out = mcpctl("proxy-config", "routes", GATEWAY_NODE, "--admin-address", f"127.0.0.1:{cp.admin_port}")
    assert "reviews.default" in out.stdout and "reviews.example.com" in out.stdout
    js = mcpctl("proxy-config", "routes", GATEWAY_NODE, "--admin-address", f"127.0.0.1:{cp.admin_port}", "-o", "json")
    import json
    assert json.loads(js.stdout)[0]["name"].startswith("http.")


def test_unknown_node_is_one_line_and_nonzero(mcpctl, mesh):
    cp, _, _ = mesh
    out = mcpctl("proxy-config", "clusters", "nobody", "--admin-address", f"127.0.0.1:{cp.admin_port}")
    assert out.returncode != 0
    assert len(out.stderr.strip().splitlines()) == 1 and "nobody" in out.stderr


def test_istioctl_spellings_filters_all_and_bootstrap(mcpctl, mesh):
    cp, envoy, up = mesh
    cpa = f"127.0.0.1:{cp.admin_port}"
    # `pc`, a singular kind, --control-plane; filters on the Istio cluster name's parts
    out = mcpctl("pc", "cluster", GATEWAY_NODE, "--control-plane", cpa, "--fqdn", "reviews", "--port", "9080",
                 "--subset", "v1", "--direction", "outbound")
    assert out.returncode == 0, out.stderr
    rows = [line.split()[:4] for line in out.stdout.splitlines()[1:]]
    assert rows == [["reviews.default.svc.cluster.local", "9080", "v1", "outbound"]]
    none = mcpctl("pc", "clusters", GATEWAY_NODE, "--control-plane", cpa, "--subset", "v9")
    assert none.stdout.splitlines()[1:] == []
    eps = mcpctl("pc", "endpoint", GATEWAY_NODE, "--control-plane", cpa, "--subset", "v1")
    assert f"127.0.0.1:{up.port}" in eps.stdout
    every = mcpctl("pc", "all", GATEWAY_NODE, "--control-plane", cpa)
    assert every.returncode == 0
    for heading in ("LISTENERS:", "ROUTES:", "CLUSTERS:", "ENDPOINTS:", "SECRET:", "ECDS:"):
        assert heading in every.stdout
    assert mcpctl("ps", "--control-plane", cpa).returncode == 0
    # bootstrap: Envoy's own, so --envoy-admin is needed, and said so
    missing = mcpctl("pc", "bootstrap", GATEWAY_NODE, "--control-plane", cpa)
    assert missing.returncode == 2 and "--envoy-admin" in missing.stderr
    import json
    boot = json.loads(mcpctl("pc", "bootstrap", GATEWAY_NODE, "--envoy-admin", f"127.0.0.1:{envoy.admin_port}").stdout)
    assert boot["node"]["id"] == GATEWAY_NODE
