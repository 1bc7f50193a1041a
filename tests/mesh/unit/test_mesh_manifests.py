"""istio-manifests/: what an operator applies. Every file parses; the examples
validate; the CRD schema and the CEL admission rules (run by cel-python, as the
API server would run them) agree with the mesh code they mirror."""
import copy
import json
import os

import pytest
import yaml

from mcp26.mesh import batching_policy, l7_routing
from mcp26.mesh.diagnostics import ConfigError
from mcp26.mesh.headers import L7_READ_ONLY_HEADERS
from harness.paths import checkout_examples
from mcp26.mesh.change_set import load_texts

celpy = pytest.importorskip("celpy", reason="cel-python (test extra) evaluates the CEL rules")
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (test extra) checks the CRD schema")
from celpy import celtypes, json_to_cel  # noqa: E402
from harness.paths import ROOT

ROOT = str(ROOT / "istio-manifests")


def manifests():
    for d, _, files in os.walk(ROOT):
        for f in sorted(files):
            if f.endswith((".yaml", ".yml")):
                yield os.path.join(d, f)


def docs(rel):
    with open(os.path.join(ROOT, rel)) as fh:
        return [d for d in yaml.safe_load_all(fh) if d]


@pytest.mark.parametrize("path", list(manifests()), ids=lambda p: os.path.relpath(p, ROOT))
def test_every_manifest_parses_into_kubernetes_objects(path):
    with open(path) as fh:
        objects = [d for d in yaml.safe_load_all(fh) if d is not None]
    assert objects, "an empty manifest"
    for o in objects:
        assert isinstance(o, dict) and o.get("apiVersion") and o.get("kind"), o
        assert (o.get("metadata") or {}).get("name"), f"{o['kind']} without metadata.name"


def test_examples_pass_validation_and_analysis(tmp_path):
    texts = {str(p): p.read_text() for p in sorted(checkout_examples(tmp_path).glob("*.yaml"))}
    config = load_texts(texts)          # raises ConfigError on any error
    assert len(config) >= 15
    assert [str(w) for w in config.warnings if w.severity == "warning"] == []


# --- CEL, with the Kubernetes library functions the policies use ------------

ENV = celpy.Environment()
K8S_FUNCTIONS = {"lowerAscii": lambda s: celtypes.StringType(str(s).lower())}  # k8s strings extension


def cel(expression, activation):
    program = ENV.program(ENV.compile(expression), functions=K8S_FUNCTIONS)
    return program.evaluate(activation)


def admits(policy, obj):
    """The ValidatingAdmissionPolicy's verdict on `obj`, as the API server computes it."""
    act = {"object": json_to_cel(obj)}
    variables = {}
    for v in policy["spec"].get("variables", []):
        act["variables"] = celtypes.MapType({celtypes.StringType(k): x for k, x in variables.items()})
        variables[v["name"]] = cel(v["expression"], act)
    act["variables"] = celtypes.MapType({celtypes.StringType(k): x for k, x in variables.items()})
    return all(bool(cel(rule["expression"], act)) for rule in policy["spec"]["validations"])


# --- L7SchedulingPolicy: CRD + admission policy == mesh.batching_policy ------------

CRD = docs("crds/l7schedulingpolicy.yaml")[0]
SCHED_POLICY = docs("admission/l7schedulingpolicy-policy.yaml")[0]
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def strict_json_schema(node):
    """openAPIV3Schema -> JSON Schema, rejecting unknown fields as kubectl's
    strict field validation (the default) does."""
    out = {k: strict_json_schema(v) if isinstance(v, dict) else v
           for k, v in node.items() if not k.startswith("x-kubernetes-") and k not in ("default", "description")}
    if "properties" in node:
        out["properties"] = {k: strict_json_schema(v) for k, v in node["properties"].items()}
        if not node.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = strict_json_schema(node["additionalProperties"])
    if isinstance(node.get("items"), dict):
        out["items"] = strict_json_schema(node["items"])
    return out


def crd_rules(node, value):
    """Every x-kubernetes-validations rule in the schema, evaluated with `self`."""
    for rule in node.get("x-kubernetes-validations", []):
        if not cel(rule["rule"], {"self": json_to_cel(value)}):
            return False
    for k, sub in (node.get("properties") or {}).items():
        if isinstance(value, dict) and k in value and not crd_rules(sub, value[k]):
            return False
    return True


def cluster_accepts(spec):
    spec = json.loads(json.dumps(spec))   # kubectl sends JSON: YAML's `3:` key arrives as "3"
    obj = {"apiVersion": batching_policy.API_VERSION, "kind": batching_policy.KIND, "metadata": {"name": "p"}, "spec": spec}
    try:
        jsonschema.Draft4Validator(strict_json_schema(SCHEMA)).validate({"spec": spec})
    except jsonschema.ValidationError:
        return False
    return crd_rules(SCHEMA, {"spec": spec}) and admits(SCHED_POLICY, obj)


from tests.data.l7schedulingpolicy_specs import SPECS  # noqa: E402


@pytest.mark.parametrize("spec", SPECS, ids=[str(s) for s in SPECS])
def test_cluster_and_mesh_agree_on_l7schedulingpolicy(spec):
    _, problems = batching_policy.parse_spec(copy.deepcopy(spec))
    _, routing = l7_routing.parse_routing(copy.deepcopy(spec))
    assert cluster_accepts(spec) == (not problems and not routing), problems + routing


def test_crd_routing_fields_are_mesh_l7_routings():
    spec = SCHEMA["properties"]["spec"]["properties"]
    assert (spec["priority"]["minimum"], spec["priority"]["maximum"]) == (l7_routing.PRIORITY_MIN, l7_routing.PRIORITY_MAX)
    assert spec["matchHeaders"]["maxProperties"] == l7_routing.MAX_MATCH_HEADERS
    assert spec["matchHeaders"]["additionalProperties"]["maxLength"] == l7_routing.MAX_HEADER_VALUE
    assert spec["backendService"]["pattern"] == l7_routing._BACKEND.pattern
    assert spec["backendService"]["maxLength"] == l7_routing.MAX_BACKEND
    listed = next(v["expression"] for v in SCHED_POLICY["spec"]["variables"] if v["name"] == "unmatchable")
    assert cel(listed, {}) == [celtypes.StringType(h) for h in l7_routing.UNMATCHABLE]
    # the priority bands the CRD describes are the mesh's
    for low, cls in l7_routing.PRIORITY_BANDS:
        assert f"{low}.." in spec["priority"]["description"] and cls.header_value in spec["priority"]["description"]


def test_crd_schema_is_structural():
    """The API server's rules for a structural schema (apiextensions.k8s.io/v1)."""
    def walk(node, path):
        assert node.get("type") or node.get("x-kubernetes-preserve-unknown-fields") \
            or node.get("x-kubernetes-int-or-string"), f"{path}: no type"
        assert not ("properties" in node and "additionalProperties" in node), f"{path}: properties and additionalProperties"
        for k, sub in (node.get("properties") or {}).items():
            walk(sub, f"{path}.{k}")
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], f"{path}.*")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")
        if node.get("type") == "object" and "x-kubernetes-validations" in node and "additionalProperties" in node:
            assert "maxProperties" in node, f"{path}: a CEL rule over an unbounded map"
    walk(SCHEMA, "")


def test_crd_names_and_limits_are_mesh_schedulings():
    group, version = batching_policy.API_VERSION.split("/")
    assert CRD["spec"]["group"] == group and CRD["spec"]["names"]["kind"] == batching_policy.KIND
    assert [v["name"] for v in CRD["spec"]["versions"]] == [version]
    spec = SCHEMA["properties"]["spec"]["properties"]
    assert set(spec) == batching_policy._SPEC_FIELDS | batching_policy.ROUTING_FIELDS
    assert batching_policy.ROUTING_FIELDS == set(l7_routing.FIELDS)
    assert spec["qosPolicy"]["enum"] == list(batching_policy.PRESETS)
    assert spec["maxBatchSize"]["maximum"] == batching_policy.MAX_BATCH_SIZE_LIMIT
    assert spec["maxQueueDelayMicroseconds"]["maximum"] == batching_policy.MAX_QUEUE_DELAY_US_LIMIT
    assert spec["priorityLevels"]["maximum"] == batching_policy.MAX_PRIORITY_LEVELS
    assert spec["reservedLaneLevels"]["maximum"] == batching_policy.MAX_PRIORITY_LEVELS
    assert spec["reservedLaneThreads"]["maximum"] == batching_policy.MAX_LANE_THREADS
    weights = spec["classWeights"]
    assert weights["additionalProperties"]["maximum"] == batching_policy.MAX_CLASS_WEIGHT
    assert weights["maxProperties"] == len(batching_policy.SHARED_CLASSES)
    assert str(list(batching_policy.SHARED_CLASSES)) in weights["x-kubernetes-validations"][0]["rule"]
    queue = spec["queuePolicies"]["additionalProperties"]["properties"]
    assert set(queue) == batching_policy._QUEUE_FIELDS
    assert queue["timeoutAction"]["enum"] == list(batching_policy.TIMEOUT_ACTIONS)
    # The admission policy's preset table is mesh.batching_policy.PRESETS.
    table = next(v["expression"] for v in SCHED_POLICY["spec"]["variables"] if v["name"] == "maxBatchSize")
    for name, preset in batching_policy.PRESETS.items():
        assert f"'{name}': {preset.max_batch_size}" in table
    assert {p.priority_levels for p in batching_policy.PRESETS.values()} == {4}


def test_every_l7schedulingpolicy_in_the_manifests_is_admitted():
    for path in manifests():
        with open(path) as fh:
            for o in yaml.safe_load_all(fh):
                if o and o.get("kind") == batching_policy.KIND:
                    assert cluster_accepts(o.get("spec") or {}), path


# --- VirtualService session headers: admission policy == mesh validation -----

VS_POLICY = docs("admission/virtualservice-session-headers.yaml")[0]


def test_protected_headers_are_mesh_headers():
    listed = next(v["expression"] for v in VS_POLICY["spec"]["variables"] if v["name"] == "protected")
    assert cel(listed, {}) == [celtypes.StringType(h) for h in L7_READ_ONLY_HEADERS]


def virtual_service(http):
    return {"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": "reviews", "namespace": "bookinfo"},
            "spec": {"hosts": ["reviews"], "http": http}}


ROUTE = [{"destination": {"host": "reviews"}}]
VIRTUAL_SERVICES = {
    "match only": [{"match": [{"headers": {"end-user": {"exact": "jason"}}}], "route": ROUTE}],
    "other header": [{"headers": {"request": {"set": {"x-route": "a"}, "remove": ["x-debug"]}}, "route": ROUTE}],
    "response side": [{"headers": {"response": {"remove": ["x-mcp-tenant"]}}, "route": ROUTE}],
    "set end-user": [{"headers": {"request": {"set": {"end-user": "jason"}}}, "route": ROUTE}],
    "add tenant": [{"headers": {"request": {"add": {"X-MCP-Tenant": "acme"}}}, "route": ROUTE}],
    "remove sig": [{"headers": {"request": {"remove": ["x-mcp-session-sig"]}}, "route": ROUTE}],
    "second route": [{"route": ROUTE}, {"headers": {"request": {"set": {"x-mcp-qos-class": "batch"}}}, "route": ROUTE}],
    "per destination": [{"route": [{"destination": {"host": "reviews"},
                                    "headers": {"request": {"set": {"x-mcp-qos-class": "latency-critical"}}}}]}],
    "per destination other": [{"route": [{"destination": {"host": "reviews"},
                                          "headers": {"request": {"set": {"x-a": "b"}}}}]}],
    "no http": None,
}


@pytest.mark.parametrize("case", sorted(VIRTUAL_SERVICES))
def test_cluster_and_mesh_agree_on_session_headers(case):
    http = VIRTUAL_SERVICES[case]
    obj = virtual_service(http)
    if http is None:
        obj["spec"] = {"hosts": ["reviews"], "tcp": [{"route": ROUTE}]}
    try:
        load_texts({"vs.yaml": yaml.safe_dump(obj)})
        mesh_ok = True
    except ConfigError as e:
        mesh_ok = not any("mesh session/QoS header" in d.message for d in e.diagnostics)
    assert admits(VS_POLICY, obj) == mesh_ok
    assert mesh_ok == (case in ("match only", "other header", "response side", "per destination other", "no http"))


def test_the_header_contract_example_names_its_module_with_a_scheme():
    """Istio reads a url without a scheme as an OCI reference (and, FAIL_CLOSE, blocks the workload)."""
    from mcp26.manifests import EXAMPLES, WASM_MODULE_URL
    from mcp26.wasm import HEADER_CONTRACT_WASM
    plugin = next(o for o in docs("examples/header-contract.yaml") if o["kind"] == "WasmPlugin")
    assert plugin["spec"]["url"] == WASM_MODULE_URL and WASM_MODULE_URL.startswith("file:///")
    bare = str(HEADER_CONTRACT_WASM)          # the old form: a path, no scheme
    config = load_texts({"w.yaml": (EXAMPLES / "header-contract.yaml").read_text().replace(WASM_MODULE_URL, bare)})
    assert [w.message for w in config.warnings if w.field == "spec.url"] == [
        f"url {bare!r} has no scheme: Istio reads it as oci://{bare}; write file:// for a local module"]
