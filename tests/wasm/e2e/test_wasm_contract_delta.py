"""The same header contract over Delta xDS: ECDS delivers the Wasm filter incrementally too."""
import os
import tempfile

import pytest

from mcp26.mesh import headers as H
from mcp26.mesh.session import verify_session
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.demo.stack.control_plane import GATEWAY_NODE, ControlPlane, mesh_envoy, write_config
from mcp26.demo.stack.tokens import Issuer
from test_wasm_contract import AUDIENCE, GW_LABELS, ISSUER, ISSUER2, KEY, WASM, Stack, bearer, get, mesh_yaml, wait_until_serving

pytestmark = pytest.mark.e2e


@pytest.mark.skipif(not os.path.exists(WASM), reason="run `make wasm` first")
def test_claims_signed_and_routed_over_delta_ads():
    s = Stack()
    s.local, s.remote = Issuer("local-1", ISSUER, AUDIENCE), Issuer("remote-1", ISSUER2, AUDIENCE).serve()
    s.dir = tempfile.mkdtemp(prefix="mesh-wasm-delta-")
    s.gw_port = free_port()
    s.v1, s.v2 = EchoUpstream("v1").start(), EchoUpstream("v2").start()
    try:
        for name, text in mesh_yaml(s.gw_port, s.v1.port, s.v2.port, free_port(), s.remote, s.local,
                                    backend_grpc=free_port()).items():
            write_config(s.dir, name, text)
        with ControlPlane(s.dir) as cp:
            s.cp = cp
            with mesh_envoy(cp, labels=GW_LABELS, namespace="default", delta=True) as envoy:
                s.envoy = envoy
                cp.wait_synced(GATEWAY_NODE, types=("CDS", "LDS", "ECDS"))
                wait_until_serving(s)
                status, _, seen = get(s, "/r", {**bearer(s.local.token(sub="jane", tenant="acme")), "end-user": "admin"})
                assert status == 200 and seen["upstream"] == "v2"
                assert verify_session(seen["headers"], KEY, method="GET").end_user == "jane"
                assert get(s, "/r", {"end-user": "jane"})[2]["upstream"] == "v1"
                assert H.END_USER not in get(s, "/r", {"end-user": "jane"})[2]["headers"]
    finally:
        s.v1.stop(); s.v2.stop(); s.remote.stop()
