"""Authenticated xDS against a real API server and a real Envoy (skipped where
$MCP_KUBE_APISERVER is unset): ADS over TLS from the mesh CA; a proxy proves its identity
with an audience-bound ServiceAccount token that the control plane checks by TokenReview.
A proxy with another workload's token is refused and issued nothing; one without a token too;
the plaintext loopback port serves as before."""
import asyncio
import time

import pytest

from mcp26.demo.stack.envoy import Envoy
from mcp26.demo.stack.ports import free_port
from mcp26.xds.bootstrap import envoy_bootstrap
from mcp26.xds.ca import MeshCA
from mcp26.xds.kube_control import KubeControl
from mcp26.mesh.kube_source import KubeApi, KubeSource, api_client
from mcp26.xds.sds import IdentityService
from mcp26.xds.server import XdsServer

pytestmark = pytest.mark.e2e

NS = "authz"
SERVER_NAME = f"mcp-mesh-xds.{NS}.svc"


def sidecar(name: str, sa: str, address: str, **kw) -> Envoy:
    admin = free_port()
    return Envoy(envoy_bootstrap(node_id=f"sidecar~127.0.0.1~{name}.{NS}~{NS}.svc.cluster.local", xds_address=address,
                                 namespace=NS, service_account=sa, admin_port=admin, **kw), admin_port=admin)


def connected(envoy: Envoy) -> int:
    return envoy.stats("control_plane.connected_state").get("control_plane.connected_state", 0)


def test_a_token_for_another_workload_is_refused_and_the_right_one_gets_its_identity(kube, tmp_path):
    kube.namespace(NS)
    for sa in ("web", "cart"):
        kube.call("POST", f"/api/v1/namespaces/{NS}/serviceaccounts",
                  {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}})
    web_token = kube.token(NS, "web", "mcp-mesh")
    cart_token = kube.token(NS, "cart", "mcp-mesh")
    wrong_audience = kube.token(NS, "web", "https://kubernetes.default.svc.cluster.local")
    ca = MeshCA.load_or_create(str(tmp_path / "ca"))
    root = tmp_path / "root.pem"
    root.write_bytes(ca.root_pem())

    async def run():
        api = KubeApi(await api_client(kube.kubeconfig))
        server = XdsServer("", port=free_port(), admin_port=free_port(), source=KubeSource(api, debounce=0.05),
                           identity=IdentityService(ca, 3600))
        await server.start()
        control = KubeControl(server, api, NS, status=False, secure_port=free_port(), secure_address="127.0.0.1")
        await control.start()
        secure = f"127.0.0.1:{control.secure_port}"
        tls = {"ca_file": str(root), "server_name": SERVER_NAME}
        envoys = {"web": sidecar("web-a", "web", secure, token=web_token, **tls),
                  "impostor": sidecar("cart-a", "web", secure, token=cart_token, **tls),   # cart's token, says web
                  "no-token": sidecar("web-b", "web", secure, **tls),
                  "audience": sidecar("web-c", "web", secure, token=wrong_audience, **tls),
                  "loopback": sidecar("plain", "web", f"127.0.0.1:{server.port}")}
        try:
            for e in envoys.values():
                await asyncio.to_thread(e.start, False)
            deadline = time.monotonic() + 20
            while not (connected(envoys["web"]) and connected(envoys["loopback"])):
                assert time.monotonic() < deadline, envoys["web"].log_tail()
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.5)          # the refused ones have retried by now
            nodes = {n.id.split("~")[2].split(".")[0]: n for n in server.hub.nodes()}
            assert set(nodes) == {"web-a", "plain"}, sorted(nodes)
            ident = server.identity._identity(nodes["web-a"])
            assert ident.cert is not None and ident.cert.spiffe_id == f"spiffe://cluster.local/ns/{NS}/sa/web"
            for name in ("impostor", "no-token", "audience"):
                assert connected(envoys[name]) == 0, name
            assert control.authenticator.refused >= 3
            # the plaintext loopback port: unchanged, and no identity without the bootstrap token
            assert server.identity._identity(nodes["plain"]).cert is None
        finally:
            for e in envoys.values():
                e.stop()
            await control.stop()
            await server.stop()
            await server.source.stop()
            await api.client.close()
    asyncio.run(run())
