"""The validating admission webhook against a real API server (skipped where
$MCP_KUBE_APISERVER is unset): `kubectl apply` of a bad VirtualService is refused with
`mcpctl validate`'s message, a good one admitted; the webhook's certificate comes from the
mesh CA, and the control plane fills the configuration's caBundle itself."""
import asyncio
import base64
import json
import socket
import ssl
import time
import urllib.request

import pytest
import yaml

from mcp26.demo.stack.control_plane import ControlPlane
from mcp26.demo.stack.ports import free_port
from mcp26.xds.admission import (PATH, AdmissionServer, ensure_ca_bundle, server_certificate,
                                 webhook_configuration)
from mcp26.xds.ca import MeshCA
from mcp26.mesh.kube_source import KubeApi, api_client

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


def test_mcpctl_xds_serve_on_the_api_server_runs_status_webhook_and_secure_port(kube, tmp_path, monkeypatch):
    """The command line an operator's Deployment runs (deploy/kubernetes/control-plane.yaml), here;
    with --write-context, as from a workstation, the context file names its admin port."""
    kube.namespace("mcp-mesh")
    webhook, secure = free_port(), free_port()
    monkeypatch.setenv("MCPCTL_CONTEXT", str(tmp_path / "context.yaml"))
    cp = ControlPlane(None, kubeconfig=kube.kubeconfig, test_hooks=False, extra_args=[
        "--ca-dir", str(tmp_path / "ca"), "--namespace", "mcp-mesh", "--webhook-port", str(webhook),
        "--secure-port", str(secure), "--secure-address", "127.0.0.1", "--write-context"])
    try:
        cp.start(timeout=60)
        deadline = time.monotonic() + 30        # written once the Kubernetes side has started too
        while not (tmp_path / "context.yaml").exists():
            assert time.monotonic() < deadline, cp.log_tail()
            time.sleep(0.1)
        context = yaml.safe_load((tmp_path / "context.yaml").read_text())
        assert context["controlPlane"] == f"http://127.0.0.1:{cp.admin_port}", context
        assert context["kubeconfig"] == kube.kubeconfig, context
        ca = MeshCA.load_or_create(str(tmp_path / "ca"))
        ctx = ssl.create_default_context(cadata=ca.root_pem().decode())
        ctx.check_hostname = False            # the certificate names mcp-mesh-xds.mcp-mesh.svc and 127.0.0.1
        deadline = time.monotonic() + 30
        while True:
            try:
                body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                   "request": {"uid": "1", "operation": "CREATE",
                                               "object": yaml.safe_load(BAD)}}).encode()
                req = urllib.request.Request(f"https://127.0.0.1:{webhook}{PATH}", data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
                    answer = json.loads(r.read())
                break
            except OSError:
                assert time.monotonic() < deadline, cp.log_tail()
                time.sleep(0.2)
        assert answer["response"]["allowed"] is False
        with socket.create_connection(("127.0.0.1", secure), timeout=5) as s:
            with ctx.wrap_socket(s) as tls:
                assert tls.version()                  # the authenticated ADS port speaks TLS
        while True:
            status, lease = kube.call("GET", "/apis/coordination.k8s.io/v1/namespaces/mcp-mesh/leases/mcp-mesh-status-leader")
            if status == 200 and lease["spec"].get("holderIdentity"):
                break
            assert time.monotonic() < deadline + 15, (status, lease)
            time.sleep(0.2)
    finally:
        cp.close()
