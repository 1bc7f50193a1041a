"""The shipped L7SchedulingPolicy CRD and ValidatingAdmissionPolicy on a real kube-apiserver
(harness.kube_cluster; skipped, saying why, where $MCP_KUBE_APISERVER is unset): the API server's
verdict on every spec of tests/data/l7schedulingpolicy_specs.py is the mesh's
(mesh.batching_policy.parse_spec + mesh.l7_routing.parse_routing, what `mcpctl validate` applies),
the seed's example object (istio-manifests/examples/l7-routing.yaml) is admitted, and a refusal
names the field. tests/mesh/unit/test_mesh_manifests.py runs the same CEL with cel-python; this
is the API server's own CEL, OpenAPI schema and strict field validation."""
import copy
import time

import pytest
import yaml

from harness.kube_cluster import KubeCluster, binaries
from mcp26.manifests import ADMISSION, CRDS, EXAMPLES
from mcp26.mesh import batching_policy, l7_routing
from tests.data.l7schedulingpolicy_specs import SPECS

pytestmark = pytest.mark.e2e

NS = "inference"
PATH = f"/apis/scheduling.mcp-mesh.io/v1alpha1/namespaces/{NS}/l7schedulingpolicies"
# dryRun: admission runs, nothing is stored; Strict: unknown fields are refused, as kubectl does
QUERY = "?dryRun=All&fieldValidation=Strict"


def load(path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def policy(spec: dict, name: str = "p") -> dict:
    return {"apiVersion": batching_policy.API_VERSION, "kind": batching_policy.KIND,
            "metadata": {"name": name, "namespace": NS}, "spec": spec}


@pytest.fixture(scope="module")
def kube():
    _, _, why = binaries()
    if why:
        pytest.skip(why)
    cluster = KubeCluster().start()
    try:
        cluster.crds(load(CRDS / "l7schedulingpolicy.yaml"))
        for doc in load(ADMISSION / "l7schedulingpolicy-policy.yaml"):
            kind = "validatingadmissionpolicies" if doc["kind"] == "ValidatingAdmissionPolicy" \
                else "validatingadmissionpolicybindings"
            cluster.ok("POST", f"/apis/admissionregistration.k8s.io/v1/{kind}", doc)
        cluster.namespace(NS)
        # The policy is enforced once the API server has loaded it (asynchronously): wait until
        # an object only the admission policy refuses (the schema allows it) is refused.
        probe = policy({"priority": 50, "matchHeaders": {"x a": "1"}, "backendService": "llm"})
        deadline = time.monotonic() + 30
        while cluster.call("POST", PATH + QUERY, probe)[0] != 422:
            assert time.monotonic() < deadline, "the ValidatingAdmissionPolicy was never enforced"
            time.sleep(0.2)
        yield cluster
    finally:
        cluster.stop()


def mesh_verdict(spec: dict) -> list[str]:
    _, problems = batching_policy.parse_spec(copy.deepcopy(spec))
    _, routing = l7_routing.parse_routing(copy.deepcopy(spec))
    return problems + routing


def test_the_api_server_and_the_mesh_agree_on_every_spec(kube):
    disagree = []
    for spec in SPECS:
        status, body = kube.call("POST", PATH + QUERY, policy(spec))
        assert status in (201, 400, 422), (spec, status, body)
        if (status == 201) != (not mesh_verdict(spec)):
            disagree.append((spec, status, body.get("message") if isinstance(body, dict) else body, mesh_verdict(spec)))
    assert not disagree, "\n".join(map(str, disagree))


def test_the_seeds_example_is_admitted_and_stored_as_written(kube):
    example = next(d for d in load(EXAMPLES / "l7-routing.yaml") if d["kind"] == batching_policy.KIND)
    assert not mesh_verdict(example["spec"])
    stored = kube.ok("POST", f"/apis/scheduling.mcp-mesh.io/v1alpha1/namespaces/{example['metadata']['namespace']}"
                             "/l7schedulingpolicies?fieldValidation=Strict", example)
    assert stored["spec"]["priority"] == 90
    assert stored["spec"]["matchHeaders"] == {"x-llm-model": "llama-70b", "x-user-tier": "premium"}
    assert stored["spec"]["backendService"] == "llm-premium.inference.svc.cluster.local"


@pytest.mark.parametrize("spec, field", [
    ({"priority": 101, "matchHeaders": {"x-a": "1"}, "backendService": "llm"}, "spec.priority"),
    ({"priority": 50, "matchHeaders": {"x(a)": "1"}, "backendService": "llm"}, "spec.matchHeaders"),
    ({"priority": 50, "matchHeaders": {"X-MCP-Qos-Class": "latency-critical"}, "backendService": "llm"},
     "spec.matchHeaders"),
    ({"priority": 50, "matchHeaders": {"x-a": "1"}}, "backendService"),
])
def test_a_refusal_names_the_field(kube, spec, field):
    status, body = kube.call("POST", PATH + QUERY, policy(spec))
    assert status == 422, body
    assert field in body["message"], body["message"]
