"""What runs beside the control plane when its config source is the Kubernetes API server:
the status writer behind its Lease (kube_status.py), and the admission webhook with its
caBundle keeper (admission.py). `KubeControl.start()` after the server's, `stop()` before."""
from __future__ import annotations

import asyncio
import logging
import os
from mcp26.xds.admission import WEBHOOK_CONFIGURATION, AdmissionServer, keep_ca_bundle, server_certificate
from mcp26.xds.kube_auth import DEFAULT_AUDIENCE, StreamAuthenticator, TokenReviewer
from mcp26.mesh.kube_source import KINDS
from mcp26.xds.kube_status import LEASE_NAME, STATUS_KINDS, LeaderElection, StatusWriter

log = logging.getLogger("mcp26.xds.kube")

DEFAULT_NAMESPACE = "mcp-mesh"


def pod_namespace() -> str:
    """The namespace this runs in: $POD_NAMESPACE (the Downward API), the service account's, or mcp-mesh."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip() or DEFAULT_NAMESPACE
    except OSError:
        return DEFAULT_NAMESPACE


class KubeControl:
    def __init__(self, server, api, namespace: str, status: bool = True, webhook_port: int = 0,
                 webhook_address: str = "", webhook_hosts: tuple[str, ...] = (),
                 webhook_configuration: str = "", state_dir: str = "", secure_port: int = 0,
                 secure_address: str = "0.0.0.0", token_audience: str = ""):
        self.server, self.api, self.namespace = server, api, namespace
        self.status, self.webhook_port = status, webhook_port
        self.webhook_address = webhook_address or server.address
        self.webhook_hosts = webhook_hosts or (f"mcp-mesh-xds.{namespace}.svc",)
        self.webhook_configuration = webhook_configuration
        self.state_dir = state_dir
        self.secure_port, self.secure_address, self.token_audience = secure_port, secure_address, token_audience
        self.authenticator = None
        self.election = self.writer = self.webhook = None
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.status:
            self.election = LeaderElection(self.api, self.namespace)
            self.writer = StatusWriter(self.api, self.server.source, self.election)
            self._tasks += [loop.create_task(self.election.run(), name="status lease"),
                            loop.create_task(self.writer.run(self.server), name="status writer")]
        if self.webhook_port:
            ca = self.server.identity.ca
            if ca is None:
                raise ValueError("the admission webhook needs the mesh CA (--ca-dir): its certificate comes from it")
            hosts = [*self.webhook_hosts, *([self.webhook_address] if self.webhook_address not in ("0.0.0.0", "::") else [])]
            cert, key = server_certificate(ca, hosts, self.state_dir or None)
            self.webhook = AdmissionServer(cert, key, self.webhook_address, self.webhook_port)
            await self.webhook.start()
            if self.webhook_configuration:
                self._tasks.append(loop.create_task(
                    keep_ca_bundle(self.api, ca.root_pem(), self.webhook_configuration), name="caBundle"))

        if self.secure_port:
            ca = self.server.identity.ca
            if ca is None:
                raise ValueError("ADS over TLS needs the mesh CA (--ca-dir): its certificate comes from it")
            self.authenticator = StreamAuthenticator(TokenReviewer(self.api, self.token_audience or DEFAULT_AUDIENCE), ca)
            hosts = [*self.webhook_hosts,
                     *([self.secure_address] if self.secure_address not in ("0.0.0.0", "::") else ["127.0.0.1"])]
            chain, key = ca.issue_server(hosts)
            self.secure_port = await self.server.start_secure(self.secure_address, self.secure_port,
                                                              self.authenticator, chain, key)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.election is not None:
            await self.election.release()
        if self.webhook is not None:
            await self.webhook.stop()


def cluster_rules() -> list[dict]:
    """The ClusterRole the control plane needs, exactly (deploy/kubernetes/control-plane.yaml holds
    it; tests/xds/e2e/test_kube_manifests.py runs the control plane under it): list and watch each
    kind the source reads, patch the status it writes, create TokenReviews, and get and patch its
    own webhook configuration's caBundle."""
    watched: dict[str, list[str]] = {}
    status: dict[str, list[str]] = {}
    for k in KINDS:
        watched.setdefault(k.group, []).append(k.plural)
        if (k.group, k.kind) in STATUS_KINDS:
            status.setdefault(k.group, []).append(f"{k.plural}/status")
    rules = [{"apiGroups": [g], "resources": sorted(p), "verbs": ["list", "watch"]} for g, p in sorted(watched.items())]
    rules += [{"apiGroups": [g], "resources": sorted(p), "verbs": ["patch"]} for g, p in sorted(status.items())]
    rules += [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
              {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingwebhookconfigurations"],
               "resourceNames": [WEBHOOK_CONFIGURATION], "verbs": ["get", "patch"]}]
    return rules


def namespace_rules() -> list[dict]:
    """The Role in its own namespace: the status Lease (create cannot name a resource)."""
    return [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [LEASE_NAME],
             "verbs": ["get", "update"]}]
