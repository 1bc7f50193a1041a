"""The validating admission webhook against a real API server (skipped where
$MCP_KUBE_APISERVER is unset): `kubectl apply` of a bad VirtualService is refused with
`mcpctl validate`'s message, a good one admitted; the webhook's certificate comes from the
mesh CA, and the control plane fills the configuration's caBundle itself."""
import asyncio
import base64

import pytest

from mcp26.demo.stack.ports import free_port
from mcp26.xds.admission import (PATH, AdmissionServer, ensure_ca_bundle, server_certificate,
                                 webhook_configuration)
from mcp26.xds.ca import MeshCA
from mcp26.xds.kube_source import KubeApi, api_client

pytestmark = pytest.mark.e2e

BAD = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: adm}
spec:
  hosts: [reviews]
  http:
  - route:
    - destination: {host: reviews}
      weight: -3
"""


def test_kubectl_apply_of_a_bad_virtualservice_is_refused_with_our_message(kube, tmp_path):
    kube.namespace("adm")
    ca = MeshCA.load_or_create(str(tmp_path / "ca"))
    cert, key = server_certificate(ca, ["mcp-mesh-xds.mcp-mesh.svc", "127.0.0.1"], str(tmp_path))
    port = free_port()
    config = webhook_configuration({"url": f"https://127.0.0.1:{port}{PATH}"})
    kube.ok("POST", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations", config)
    path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/" + config["metadata"]["name"]

    async def run():
        server = AdmissionServer(cert, key, "127.0.0.1", port)
        await server.start()
        api = KubeApi(await api_client(kube.kubeconfig))
        try:
            bundle = base64.b64encode(ca.root_pem()).decode()
            assert await ensure_ca_bundle(api, path, bundle) is True
            assert await ensure_ca_bundle(api, path, bundle) is False      # already right: nothing written
            got = kube.get(path)
            assert got["webhooks"][0]["clientConfig"]["caBundle"] == bundle

            bad = await asyncio.to_thread(kube.kubectl, "apply", "-f", "-", input=BAD, check=False)
            assert bad.returncode != 0
            assert ('admission webhook "validation.mcp-mesh.io" denied the request: VirtualService/adm/reviews: '
                    "spec.http[0].route[0].weight: weight -3 < 0") in bad.stderr, bad.stderr
            good = await asyncio.to_thread(kube.kubectl, "apply", "-f", "-", input=BAD.replace("      weight: -3\n", ""))
            assert "virtualservice.networking.istio.io/reviews created" in good.stdout
            assert server.reviews >= 2
        finally:
            await server.stop()
            await api.client.close()
            kube.call("DELETE", path)
    asyncio.run(run())
