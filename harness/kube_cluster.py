"""A real Kubernetes API server on loopback for tests and benchmarks: etcd and kube-apiserver.

No registry ships kube-apiserver, so the binaries are found through environment variables:
MCP_KUBE_APISERVER (required) and MCP_ETCD (default: `etcd` on PATH, Debian's etcd-server).
Where either is absent the tests skip and say so (CI has no such binary). Both listen on
127.0.0.1 only, etcd keeps its data in a temporary directory, and the API server runs with
RBAC, a generated service-account signing key (so TokenRequest and TokenReview work), and a
static admin token for the test itself. There is no controller-manager: `namespace()` makes a
namespace's `default` ServiceAccount, and tests make EndpointSlices and set Pods'
`status.podIP` through the status subresource themselves.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from mcp26.demo.stack.ports import free_port

APISERVER_ENV, ETCD_ENV = "MCP_KUBE_APISERVER", "MCP_ETCD"
ISSUER = "https://kubernetes.default.svc.cluster.local"
ADMIN_USER = "mcp-test-admin"


def _die_with_parent() -> None:
    """SIGKILL when the test process dies, however it dies (a timeout's SIGKILL runs no finalizer):
    no etcd or API server outlives its test (Linux prctl PR_SET_PDEATHSIG)."""
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def binaries() -> tuple[str | None, str | None, str]:
    """(kube-apiserver, etcd, why not) from the environment."""
    api = os.environ.get(APISERVER_ENV) or ""
    etcd = os.environ.get(ETCD_ENV) or shutil.which("etcd") or ""
    if not api or not os.access(api, os.X_OK):
        return None, None, (f"${APISERVER_ENV} does not name a kube-apiserver binary (none is packaged; "
                            "build one from Kubernetes' source and point the variable at it)")
    if not etcd or not os.access(etcd, os.X_OK):
        return None, None, f"no etcd: set ${ETCD_ENV} or install Debian's etcd-server"
    if not shutil.which("kubectl"):
        return None, None, "no kubectl on PATH"
    return api, etcd, ""


class KubeCluster:
    def __init__(self, workdir: str | None = None, extra_flags: tuple[str, ...] = ()):
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="mcp-kube-", dir=base))
        self.extra_flags = extra_flags
        self.procs: list[subprocess.Popen] = []
        self.port = 0
        self.admin_token = base64.urlsafe_b64encode(os.urandom(24)).decode().rstrip("=")

    # --- lifecycle -------------------------------------------------------------------------
    def start(self, timeout: float = 60) -> "KubeCluster":
        api, etcd, why = binaries()
        if not api:
            raise RuntimeError(why)
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._spawn("etcd", [etcd, "--name", "mcp", "--data-dir", str(self.dir / "etcd"),
                             "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
                             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                             "--initial-cluster", f"mcp=http://127.0.0.1:{peer}", "--log-level", "error"])
        self._sa_key()
        (self.dir / "tokens.csv").write_text(f'{self.admin_token},{ADMIN_USER},1,"system:masters"\n')
        self.port = free_port()
        self._spawn("apiserver", [
            api, "--etcd-servers", self.etcd_url, "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(self.port), "--cert-dir", str(self.dir / "certs"),
            "--service-account-issuer", ISSUER, "--service-account-key-file", str(self.dir / "sa.pub"),
            "--service-account-signing-key-file", str(self.dir / "sa.key"),
            "--token-auth-file", str(self.dir / "tokens.csv"), "--authorization-mode", "RBAC",
            "--service-cluster-ip-range", "10.96.0.0/16", "--feature-gates", "WatchList=false",
            "--enable-priority-and-fairness=false", "--profiling=false", "--logging-format", "text", "-v", "0",
            *self.extra_flags])
        deadline = time.monotonic() + timeout
        while True:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited {p.returncode}: {self.log_tail(p)}")
            try:
                if self.get("/readyz") == "ok":
                    break
            except (OSError, urllib.error.URLError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"kube-apiserver not ready in {timeout} s: {self.log_tail(self.procs[-1])}")
            time.sleep(0.2)
        self.kubeconfig = self.write_kubeconfig(self.admin_token, "admin")
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.dir / f"{name}.log", "wb")
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                           preexec_fn=_die_with_parent))

    def log_tail(self, proc: subprocess.Popen, n: int = 2000) -> str:
        name = "etcd" if proc is self.procs[0] else "apiserver"
        try:
            return (self.dir / f"{name}.log").read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        self.procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _sa_key(self) -> None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        (self.dir / "sa.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                            serialization.PrivateFormat.PKCS8,
                                                            serialization.NoEncryption()))
        (self.dir / "sa.pub").write_bytes(key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))

    # --- access ----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> str:
        return str(self.dir / "certs" / "apiserver.crt")

    def write_kubeconfig(self, token: str, name: str) -> str:
        path = self.dir / f"kubeconfig-{name}"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "k", "cluster": {"server": self.url, "certificate-authority": self.ca_file}}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": name}}]}))
        path.chmod(0o600)
        return str(path)

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_file) if os.path.exists(self.ca_file) else \
            ssl._create_unverified_context()      # before the server wrote its certificate (start-up only)
        return ctx

    def call(self, method: str, path: str, body=None, token: str | None = None,
             content_type: str = "application/json") -> tuple[int, dict | str]:
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {token or self.admin_token}", "Content-Type": content_type,
            "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, context=self._ssl(), timeout=30) as r:
                text = r.read().decode()
                status = r.status
        except urllib.error.HTTPError as e:
            text, status = e.read().decode(), e.code
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def get(self, path: str):
        status, body = self.call("GET", path)
        if status != 200:
            raise ValueError(f"GET {path}: {status} {body}")
        return body

    def ok(self, method: str, path: str, body=None, **kw) -> dict:
        status, out = self.call(method, path, body, **kw)
        if not 200 <= status < 300:
            raise AssertionError(f"{method} {path}: {status} {out}")
        return out

    def kubectl(self, *args: str, input: str | None = None, kubeconfig: str | None = None,
                check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run(["kubectl", "--kubeconfig", kubeconfig or self.kubeconfig, *args],
                           input=input, capture_output=True, text=True, timeout=120)
        if check and r.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    # --- what a controller-manager would do ---------------------------------------------------
    def namespace(self, name: str) -> None:
        """The namespace and its `default` ServiceAccount (no controller-manager makes it here)."""
        self.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        self.call("POST", f"/api/v1/namespaces/{name}/serviceaccounts",
                  {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})

    def set_pod_ip(self, namespace: str, name: str, ip: str) -> None:
        self.ok("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status",
                {"status": {"podIP": ip, "podIPs": [{"ip": ip}], "phase": "Running"}},
                content_type="application/merge-patch+json")

    def token(self, namespace: str, service_account: str, audience: str, seconds: int = 3600) -> str:
        """A projected-style, audience-bound ServiceAccount token (TokenRequest), as a Pod gets one."""
        out = self.ok("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
                      {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                       "spec": {"audiences": [audience], "expirationSeconds": seconds}})
        return out["status"]["token"]

    def crds(self, crds: list[dict]) -> None:
        """Install CRDs and wait until each is Established."""
        for crd in crds:
            self.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        for crd in crds:
            deadline = time.monotonic() + 30
            while True:
                got = self.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}")
                if any(c["type"] == "Established" and c["status"] == "True"
                       for c in (got.get("status") or {}).get("conditions") or []):
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(f"CRD {crd['metadata']['name']} not established")
                time.sleep(0.1)


def stand_in_crds() -> list[dict]:
    """CRDs for the kinds the control plane watches whose real CRDs another project ships
    (Istio's base chart, the Gateway API's and the Inference Extension's releases): the same
    group, version, plural and scope, a schema that keeps any field, and the status
    subresource. L7SchedulingPolicy is this project's and comes from istio-manifests/crds."""
    import yaml
    from mcp26.manifests import CRDS
    from mcp26.mesh.kube_source import KINDS
    out = []
    for k in KINDS:
        if k.group in ("", "discovery.k8s.io"):
            continue
        if k.kind == "L7SchedulingPolicy":
            continue
        out.append({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{k.plural}.{k.group}",
                         # *.k8s.io groups are protected; the real CRDs carry their approval
                         **({"annotations": {"api-approved.kubernetes.io": "https://github.com/kubernetes/enhancements/pull/1111"}}
                            if k.group.endswith(".k8s.io") else {})},
            "spec": {"group": k.group, "scope": "Namespaced" if k.namespaced else "Cluster",
                     "names": {"plural": k.plural, "singular": k.kind.lower(), "kind": k.kind,
                               "listKind": f"{k.kind}List"},
                     "versions": [{"name": k.version, "served": True, "storage": True,
                                   "subresources": {"status": {}},
                                   "schema": {"openAPIV3Schema": {"type": "object",
                                                                  "x-kubernetes-preserve-unknown-fields": True}}}]}})
    for path in sorted(CRDS.glob("*.yaml")):
        out.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return out
