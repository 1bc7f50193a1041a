"""deploy/kubernetes against a real API server (skipped where $MCP_KUBE_APISERVER is unset):
`kubectl apply --server-side -k` takes every object, and the control plane, run with the
token of the manifests' own ServiceAccount, lists and watches everything, writes status,
keeps the webhook's caBundle, holds its Lease and reviews tokens without a single refusal;
and that identity can do nothing else asked of it here. The Endpoint Picker, with its own
account's token, reads the pool's Pods, and nothing else."""
import asyncio
import base64
import subprocess
import time

import pytest
import yaml

from harness.paths import ROOT
from mcp26.demo.stack.ports import free_port
from mcp26.xds.admission import WEBHOOK_CONFIGURATION
from mcp26.xds.ca import MeshCA
from mcp26.xds.kube_control import KubeControl
from mcp26.mesh.kube_source import KubeApi, KubeSource, api_client
from mcp26.scheduler.pool_source import KubePoolSource
from mcp26.xds.sds import IdentityService
from mcp26.xds.server import XdsServer

pytestmark = pytest.mark.e2e

NS = "mcp-mesh"
HOOK = f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{WEBHOOK_CONFIGURATION}"
ROUTE = f"""apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: models, namespace: {NS}}}
spec:
  gatewayClassName: istio
  listeners: [{{name: http, port: 8080, protocol: HTTP}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: models, namespace: {NS}}}
spec:
  parentRefs: [{{name: models}}]
  rules: [{{backendRefs: [{{group: inference.networking.k8s.io, kind: InferencePool, name: mcp-models}}]}}]
"""


def rendered() -> tuple[list[dict], dict]:
    """The kustomize output: every object but the webhook configuration, and that one."""
    text = subprocess.run(["kubectl", "kustomize", str(ROOT / "deploy" / "kubernetes")], capture_output=True,
                          text=True, check=True, timeout=60).stdout
    objects = [d for d in yaml.safe_load_all(text) if d]
    hook = next(o for o in objects if o["kind"] == "ValidatingWebhookConfiguration")
    return [o for o in objects if o is not hook], hook


def test_the_manifests_apply_and_their_service_account_is_enough_and_no_more(kube, tmp_path):
    objects, hook_config = rendered()
    assert len(objects) == 18
    applied = kube.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(objects))
    assert applied.stdout.count("serverside-applied") == 18, applied.stdout
    # The webhook's Service has no endpoints here (no kubelet): the API server would look its
    # name up in DNS and leave this host. The same configuration, pointed at loopback.
    webhook_port = free_port()
    for w in hook_config["webhooks"]:
        assert w["clientConfig"]["service"] == {"name": "mcp-mesh-xds", "namespace": NS, "path": "/validate", "port": 443}
        w["clientConfig"] = {"url": f"https://127.0.0.1:{webhook_port}/validate"}
    kube.call("POST", f"/api/v1/namespaces/{NS}/serviceaccounts",
              {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
    sa_token = kube.token(NS, "mcp-mesh-xds", "https://kubernetes.default.svc.cluster.local")
    sa_config = kube.write_kubeconfig(sa_token, "mcp-mesh-xds")
    proxy_token = kube.token(NS, "mcp-model", "mcp-mesh")
    ca = MeshCA.load_or_create(str(tmp_path / "ca"))

    async def run():
        api = KubeApi(await api_client(sa_config))
        server = XdsServer("", port=free_port(), admin_port=free_port(), source=KubeSource(api, debounce=0.05),
                           identity=IdentityService(ca, 3600))
        await server.start()
        control = KubeControl(server, api, NS, webhook_port=webhook_port, webhook_address="127.0.0.1",
                              webhook_configuration=WEBHOOK_CONFIGURATION, secure_port=free_port(),
                              secure_address="127.0.0.1")
        await control.start()
        try:
            await asyncio.to_thread(kube.kubectl, "apply", "--server-side", "-f", "-", input=yaml.safe_dump(hook_config))
            deadline = time.monotonic() + 40
            while not kube.get(HOOK)["webhooks"][0]["clientConfig"].get("caBundle"):
                assert time.monotonic() < deadline, "the caBundle was not set"
                await asyncio.sleep(0.2)
            # through the webhook (validated by this control plane), then read back by it
            await asyncio.to_thread(kube.kubectl, "apply", "--server-side", "-f", "-", input=ROUTE)
            assert control.webhook.reviews >= 2
            assert all(i.served for i in server.source.informers), [i.kind.plural for i in server.source.informers
                                                                    if not i.served]
            deadline = time.monotonic() + 20
            while True:
                hook = kube.get(HOOK)["webhooks"][0]["clientConfig"].get("caBundle")
                route = kube.get(f"/apis/gateway.networking.k8s.io/v1/namespaces/{NS}/httproutes/models")
                pool = kube.get(f"/apis/inference.networking.k8s.io/v1/namespaces/{NS}/inferencepools/mcp-models")
                if hook and route.get("status") and (pool.get("status") or {}).get("parents"):
                    break
                assert time.monotonic() < deadline, (hook, route.get("status"), pool.get("status"), api.refused)
                await asyncio.sleep(0.2)
            assert hook == base64.b64encode(ca.root_pem()).decode()
            assert pool["status"]["parents"][0]["parentRef"]["name"] == "models"
            assert control.election.leading
            assert await control.authenticator.reviewer.who(proxy_token) == (NS, "mcp-model")
            # not one refusal (a 404 is a Lease or configuration not made yet, a 429 a fresh CRD)
            assert not {401, 403} & set(api.refused), api.refused
        finally:
            await control.stop()
            await server.stop()
            await server.source.stop()
            await api.client.close()
            kube.call("DELETE", HOOK)      # no webhook left that nothing serves
    asyncio.run(run())

    # ... and no more: what it does not use, it may not do.
    def can(*args: str) -> bool:
        return kube.kubectl("auth", "can-i", *args, kubeconfig=sa_config, check=False).stdout.strip() == "yes"
    assert can("list", "virtualservices.networking.istio.io", "-A")
    assert can("patch", "httproutes.gateway.networking.k8s.io", "--subresource=status", "-n", "default")
    for denied in (("get", "secrets", "-n", "default"), ("create", "virtualservices.networking.istio.io", "-n", NS),
                   ("patch", "httproutes.gateway.networking.k8s.io", "-n", NS), ("delete", "pods", "-n", NS),
                   ("list", "configmaps", "-A"), ("update", "leases.coordination.k8s.io", "other", "-n", NS),
                   ("patch", "validatingwebhookconfigurations", "istio-validator"), ("create", "serviceaccounts/token", "-n", NS),
                   ("list", "leases.coordination.k8s.io", "-n", "kube-system")):
        assert not can(*denied), denied


def test_the_endpoint_pickers_role_reads_its_pool_and_no_more(kube):
    objects, _ = rendered()
    kube.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(objects))
    for name, ip in (("model-a", "127.0.0.2"), ("model-b", "127.0.0.3")):    # the Deployment's Pods
        kube.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": {"app": "mcp-model"}},
             "spec": {"containers": [{"name": "server", "image": "mcp-mesh"}]}}))
        kube.set_pod_ip(NS, name, ip)
    epp_config = kube.write_kubeconfig(kube.token(NS, "mcp-epp", "https://kubernetes.default.svc.cluster.local"),
                                       "mcp-epp")

    async def run():
        api = KubeApi(await api_client(epp_config))
        source = KubePoolSource(api, f"{NS}/mcp-models")
        try:
            await source.start()
            assert source.refresh(), source.error
            assert [e.key for e in source.view.endpoints] == ["127.0.0.2:8080", "127.0.0.3:8080"]
            assert not {401, 403} & set(api.refused), api.refused
        finally:
            await source.stop()
            await api.client.close()
    asyncio.run(run())

    def can(*args: str) -> bool:
        return kube.kubectl("auth", "can-i", *args, kubeconfig=epp_config, check=False).stdout.strip() == "yes"
    assert can("watch", "pods", "-n", NS) and can("list", "inferencepools.inference.networking.k8s.io", "-n", NS)
    for denied in (("list", "pods", "-A"), ("get", "secrets", "-n", NS), ("patch", "pods", "-n", NS),
                   ("list", "services", "-n", NS), ("update", "inferencepools.inference.networking.k8s.io", "-n", NS)):
        assert not can(*denied), denied
