"""A proxyless grpcio client routed by our LDS/RDS/CDS/EDS over ADS.

The client (a subprocess, so its GRPC_XDS_BOOTSTRAP is its own) dials
xds:///reviews.grpc.local:7070; the real control plane (`mcpctl xds serve`)
serves the API listener, route configuration, EDS clusters and endpoints that
translate() builds for a node of kind grpc. Two grpcio servers answer with
their own name, so each assertion is on who actually answered.
"""
import json
import os
import subprocess
import sys
import tempfile
from concurrent import futures

import grpc
import pytest

from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.control_plane import ControlPlane, write_config

pytestmark = pytest.mark.e2e
METHOD = "/mcp.test.Echo/Who"
TARGET = "reviews.grpc.local:7070"

CONFIG = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: reviews, namespace: default}}
spec:
  hosts: [reviews.grpc.local]
  ports: [{{number: 7070, name: grpc, protocol: GRPC}}]
  resolution: STATIC
  endpoints:
  - {{address: 127.0.0.1, ports: {{grpc: {v1}}}, labels: {{version: v1}}}}
  - {{address: 127.0.0.1, ports: {{grpc: {v2}}}, labels: {{version: v2}}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: reviews, namespace: default}}
spec:
  host: reviews.grpc.local
  subsets: [{{name: v1, labels: {{version: v1}}}}, {{name: v2, labels: {{version: v2}}}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: sticky, namespace: default}}
spec:
  hosts: [sticky.grpc.local]
  ports: [{{number: 7070, name: grpc, protocol: GRPC}}]
  resolution: STATIC
  endpoints:
  - {{address: 127.0.0.1, ports: {{grpc: {v1}}}}}
  - {{address: 127.0.0.1, ports: {{grpc: {v2}}}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: sticky, namespace: default}}
spec:
  host: sticky.grpc.local
  trafficPolicy: {{loadBalancer: {{consistentHash: {{httpHeaderName: x-user}}}}}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: reviews, namespace: default}}
spec:
  hosts: [reviews.grpc.local]
  http:
  - match: [{{headers: {{x-fail: {{exact: "yes"}}}}}}]
    fault: {{abort: {{grpcStatus: RESOURCE_EXHAUSTED, percentage: {{value: 100}}}}}}
    route: [{{destination: {{host: reviews.grpc.local, subset: v1}}}}]
  - match: [{{headers: {{end-user: {{exact: jason}}}}}}]
    route: [{{destination: {{host: reviews.grpc.local, subset: v2}}}}]
  - route:
    - {{destination: {{host: reviews.grpc.local, subset: v1}}, weight: 50}}
    - {{destination: {{host: reviews.grpc.local, subset: v2}}, weight: 50}}
"""

CLIENT = r"""
import json, sys, grpc
target, calls = sys.argv[1], json.loads(sys.argv[2])
out = []
with grpc.insecure_channel("xds:///" + target) as ch:
    who = ch.unary_unary("%s", request_serializer=None, response_deserializer=None)
    for i, headers in enumerate(calls):
        try:
            # The first call waits for LDS/RDS/CDS/EDS; the others find them there.
            out.append(who(b"", metadata=list(headers.items()), timeout=15 if i == 0 else 5,
                           wait_for_ready=i == 0).decode())
        except grpc.RpcError as e:
            out.append("error:" + e.code().name)
            if i == 0:
                sys.exit("first call failed: " + str(e.code()) + " " + str(e.details()))
print(json.dumps(out))
""" % (METHOD,)


def echo_server(name: str):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    handler = grpc.method_handlers_generic_handler("mcp.test.Echo", {
        "Who": grpc.unary_unary_rpc_method_handler(lambda req, ctx: name.encode())})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


@pytest.fixture(scope="module")
def mesh():
    servers = {v: echo_server(v) for v in ("v1", "v2")}
    config_dir = tempfile.mkdtemp(prefix="xds-grpc-")
    write_config(config_dir, "reviews.yaml", CONFIG.format(v1=servers["v1"][1], v2=servers["v2"][1]))
    try:
        with ControlPlane(config_dir) as cp:
            yield cp
    finally:
        for server, _ in servers.values():
            server.stop(0)


def run_client(cp: ControlPlane, calls: list[dict], target: str = TARGET) -> list[str]:
    bootstrap = {"xds_servers": [{"server_uri": cp.address, "channel_creds": [{"type": "insecure"}],
                                  "server_features": ["xds_v3"]}],
                 "node": {"id": "proxyless-1", "cluster": "clients",
                          "metadata": {"GENERATOR": "grpc", "NAMESPACE": "default"}}}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(bootstrap, f)
    env = {**os.environ, "GRPC_XDS_BOOTSTRAP": f.name}
    try:
        done = subprocess.run([sys.executable, "-c", CLIENT, target, json.dumps(calls)], env=env,
                              capture_output=True, text=True, timeout=60)
    finally:
        os.remove(f.name)
    assert done.returncode == 0, done.stderr[-3000:] + "\n" + cp.log_tail()
    return json.loads(done.stdout)


def test_proxyless_client_follows_header_routes_weights_and_faults(mesh):
    calls = [{"end-user": "jason"}] * 10 + [{}] * 200 + [{"x-fail": "yes"}] * 3
    answers = run_client(mesh, calls)
    assert answers[:10] == ["v2"] * 10
    split = answers[10:210]
    # Binomial(200, 0.5): sd 7.1; 5 sd either side.
    assert set(split) == {"v1", "v2"} and 65 <= split.count("v1") <= 135, split
    assert answers[210:] == ["error:RESOURCE_EXHAUSTED"] * 3


def test_proxyless_ring_hash_keeps_each_user_on_one_backend(mesh):
    users = [f"user-{i}" for i in range(24)]
    answers = run_client(mesh, [{"x-user": u} for u in users for _ in range(3)], target="sticky.grpc.local:7070")
    by_user = {u: set(answers[3 * i:3 * i + 3]) for i, u in enumerate(users)}
    assert all(len(seen) == 1 for seen in by_user.values()), by_user        # RING_HASH on x-user
    assert set().union(*by_user.values()) == {"v1", "v2"}                   # and users spread (p fail 2^-23)
