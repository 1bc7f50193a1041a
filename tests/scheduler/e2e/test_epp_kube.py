"""`mcpctl epp serve --kubeconfig`: the Endpoint Picker reads its InferencePool, the Pods it
selects and its InferenceObjectives from a real kube-apiserver (harness.kube_cluster; skipped,
saying why, where $MCP_KUBE_APISERVER is unset), with a token whose Role allows only those three
kinds in the pool's namespace, as deploy/kubernetes/endpoint-picker.yaml grants."""
import time

import pytest
import yaml

from harness.endpoint_picker import PickerProcess

pytestmark = pytest.mark.e2e

NS = "inference"
POOL = f"""apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {{name: decoders, namespace: {NS}}}
spec:
  selector: {{matchLabels: {{app: decoder}}}}
  targetPorts: [{{number: 8000}}]
  endpointPickerRef: {{name: epp, port: {{number: 9002}}}}
---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {{name: chat, namespace: {NS}}}
spec: {{priority: 2, poolRef: {{name: decoders}}}}
"""
ROLE = f"""apiVersion: v1
kind: ServiceAccount
metadata: {{name: epp, namespace: {NS}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: epp, namespace: {NS}}}
rules:
- {{apiGroups: [""], resources: [pods], verbs: [get, list, watch]}}
- {{apiGroups: [inference.networking.k8s.io], resources: [inferencepools], verbs: [get, list, watch]}}
- {{apiGroups: [inference.networking.x-k8s.io], resources: [inferenceobjectives], verbs: [get, list, watch]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: epp, namespace: {NS}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: epp}}
subjects: [{{kind: ServiceAccount, name: epp, namespace: {NS}}}]
"""


def pod(name: str, app: str, namespace: str = NS) -> str:
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace,
                                                                           "labels": {"app": app}},
                           "spec": {"containers": [{"name": "server", "image": "mcp-mesh"}]}})


def endpoints(picker: PickerProcess) -> set[str]:
    return set(picker.stats()["endpoints"])


def wait_for(picker: PickerProcess, want: set[str], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while endpoints(picker) != want:
        assert time.monotonic() < deadline, (endpoints(picker), want, picker.stats()["config_error"])
        time.sleep(0.1)


@pytest.fixture(scope="module")
def pool(kube):
    kube.namespace(NS)
    kube.namespace("elsewhere")
    kube.kubectl("apply", "--server-side", "-f", "-", input=POOL + "---\n" + ROLE)
    kube.kubectl("apply", "--server-side", "-f", "-", input="---\n".join(
        [pod("dec-a", "decoder"), pod("dec-b", "decoder"), pod("web", "web"),
         pod("dec-other", "decoder", "elsewhere")]))
    for name, ip in (("dec-a", "127.0.0.2"), ("dec-b", "127.0.0.3"), ("web", "127.0.0.4")):
        kube.set_pod_ip(NS, name, ip)
    kube.set_pod_ip("elsewhere", "dec-other", "127.0.0.5")
    config = kube.write_kubeconfig(kube.token(NS, "epp", "https://kubernetes.default.svc.cluster.local"), "epp")
    picker = PickerProcess(None, "--kubeconfig", config, "--metrics-interval-ms", "50", pool=f"{NS}/decoders")
    try:
        yield kube, picker
    finally:
        picker.stop()


def test_the_pools_pods_with_an_address_are_its_endpoints_read_with_a_namespaced_role(pool):
    kube, picker = pool
    assert set(picker.ready["endpoints"]) == {"127.0.0.2:8000", "127.0.0.3:8000"}    # not web, not elsewhere's
    wait_for(picker, {"127.0.0.2:8000", "127.0.0.3:8000"})
    assert picker.stats()["pool"] == f"{NS}/decoders" and picker.stats()["config_error"] is None


def test_pods_coming_and_going_and_a_changed_selector_reach_the_picker(pool):
    kube, picker = pool
    kube.kubectl("apply", "--server-side", "-f", "-", input=pod("dec-c", "decoder"))
    time.sleep(0.5)
    assert "127.0.0.6:8000" not in endpoints(picker)          # no podIP yet: not an endpoint
    kube.set_pod_ip(NS, "dec-c", "127.0.0.6")
    wait_for(picker, {"127.0.0.2:8000", "127.0.0.3:8000", "127.0.0.6:8000"})
    kube.kubectl("delete", "pod", "-n", NS, "dec-a", "--grace-period=0", "--force", "--wait=false")
    wait_for(picker, {"127.0.0.3:8000", "127.0.0.6:8000"})
    kube.kubectl("patch", "inferencepool.inference.networking.k8s.io", "decoders", "-n", NS, "--type=merge",
                 "-p", '{"spec": {"selector": {"matchLabels": {"app": "web"}}}}')
    wait_for(picker, {"127.0.0.4:8000"})


def test_a_token_without_the_role_serves_not_ready_and_says_why(pool):
    """A Role missing (or an API server away): the picker still serves its admin port, says
    NOT_SERVING, and /stats names the refusal (after its 10 s wait for the first lists)."""
    kube, _ = pool
    kube.call("POST", f"/api/v1/namespaces/{NS}/serviceaccounts",
              {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "nobody"}})
    config = kube.write_kubeconfig(kube.token(NS, "nobody", "https://kubernetes.default.svc.cluster.local"), "nobody")
    picker = PickerProcess(None, "--kubeconfig", config, pool=f"{NS}/decoders")
    try:
        stats = picker.stats()
        assert picker.ready["endpoints"] == [] and stats["pool"] is None
        assert "waiting for the API server's first list of" in stats["config_error"], stats["config_error"]
        assert "403" in stats["config_error"] or "forbidden" in stats["config_error"].lower(), stats["config_error"]
    finally:
        picker.stop()
