"""Proxyless gRPC: a grpcio client with GRPC_XDS_BOOTSTRAP and target xds:///HOST:PORT,
routed by the same control plane and the same Istio config (API listener via LDS,
then RDS, CDS, EDS) across two real grpcio backends, header-matched and weighted.
"""
import json
import re
import os
import subprocess
import sys
from concurrent import futures

import grpc
import pytest

from harness import xds_grpc_client
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.control_plane import ControlPlane, write_config
from mcp26.xds.bootstrap import grpc_bootstrap

pytestmark = pytest.mark.e2e

HOST, PORT = "echo-grpc.mesh.local", 50051
CLIENT = xds_grpc_client.__file__


def backend(name: str):
    server = grpc.server(futures.ThreadPoolExecutor(4))
    handler = grpc.method_handlers_generic_handler("mesh.test.Echo", {
        "Who": grpc.unary_unary_rpc_method_handler(lambda req, ctx: name.encode())})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def config(ports: dict[str, int], weights: tuple[int, int]) -> str:
    endpoints = "\n".join(f"  - {{address: 127.0.0.1, ports: {{grpc: {p}}}, labels: {{version: {v}}}}}"
                          for v, p in sorted(ports.items()))
    return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: echo-grpc, namespace: default}}
spec:
  hosts: [{HOST}]
  location: MESH_INTERNAL
  ports: [{{number: {PORT}, name: grpc, protocol: GRPC}}]
  resolution: STATIC
  endpoints:
{endpoints}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: echo-grpc, namespace: default}}
spec:
  host: {HOST}
  subsets:
  - {{name: v1, labels: {{version: v1}}}}
  - {{name: v2, labels: {{version: v2}}}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: echo-grpc, namespace: default}}
spec:
  hosts: [{HOST}]
  http:
  - match:
    - headers:
        end-user: {{exact: jason}}
    route:
    - destination: {{host: {HOST}, subset: v2}}
  - route:
    - destination: {{host: {HOST}, subset: v1}}
      weight: {weights[0]}
    - destination: {{host: {HOST}, subset: v2}}
      weight: {weights[1]}
"""


def run_client(bootstrap_path: str, n: int, *metadata: str) -> dict:
    env = dict(os.environ, GRPC_XDS_BOOTSTRAP=bootstrap_path)
    out = subprocess.run([sys.executable, CLIENT, f"xds:///{HOST}:{PORT}", str(n), *metadata],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])["counts"]


@pytest.fixture
def grpc_mesh(tmp_path):
    servers = {v: backend(v) for v in ("v1", "v2")}
    ports = {v: p for v, (_, p) in servers.items()}
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    write_config(str(config_dir), "echo.yaml", config(ports, (80, 20)))
    cp = ControlPlane(str(config_dir))
    bootstrap = tmp_path / "grpc-bootstrap.json"
    try:
        cp.start()
        bootstrap.write_text(json.dumps(grpc_bootstrap(node_id="grpc-client~1", xds_address=cp.address)))
        yield {"cp": cp, "bootstrap": str(bootstrap), "dir": str(config_dir), "ports": ports}
    finally:
        cp.close()
        for s, _ in servers.values():
            s.stop(0)


def test_proxyless_client_header_matched_and_weighted(grpc_mesh):
    boot = grpc_mesh["bootstrap"]
    assert run_client(boot, 30, "end-user=jason") == {"v2": 30}
    counts = run_client(boot, 400)
    assert set(counts) == {"v1", "v2"}, counts
    # Binomial(400, 0.8): sd 8; 280..360 is 5 sd either way.
    assert 280 <= counts["v1"] <= 360, counts


def test_proxyless_client_follows_a_config_change(grpc_mesh):
    cp = grpc_mesh["cp"]
    before = cp.configz()["generation"]
    write_config(grpc_mesh["dir"], "echo.yaml", config(grpc_mesh["ports"], (0, 100)))
    cp.wait_generation_change(before)
    assert run_client(grpc_mesh["bootstrap"], 50) == {"v2": 50}
    # It asked by name for the API listener, as gRFC A27 clients do, over SotW.
    metrics = cp.get("/metrics")[1]
    assert re.search(r'xds_pushes_total\{[^}]*protocol="sotw"[^}]*type="LDS"[^}]*\} [1-9]', metrics), metrics
