"""What the status writer would write (kube_status.desired_statuses), from objects as the API
server holds them and the findings of the real change-set check: no API server needed."""
import json

import yaml

from harness.paths import TEST_DATA
from mcp26.mesh.change_set import load_texts
from mcp26.xds.kube_status import CONTROLLER_NAME, _keep_times, _without_times, desired_statuses, findings
from mcp26.xds.server import diagnostic_dict

STRAY = """apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: stray, namespace: other}
spec:
  parentRefs: [{name: shop-gateway, namespace: shop}]
  rules: [{backendRefs: [{name: cart, namespace: shop, port: 8080}]}]
"""


def objects_and_findings():
    text = (TEST_DATA / "kube-api" / "shop.yaml").read_text() + "---\n" + STRAY
    objs = [d for d in yaml.safe_load_all(text) if d]
    for i, o in enumerate(objs):
        o["metadata"].setdefault("generation", 3)
    config = load_texts({"shop.yaml": text})
    status = {"warnings": [diagnostic_dict(d) for d in config.warnings], "rejected": None}
    return objs, findings(status)


def cond(entry):
    return {c["type"]: (c["status"], c["reason"], c["observedGeneration"]) for c in entry["conditions"]}


def test_gateway_routes_and_their_reasons():
    objs, found = objects_and_findings()
    out = desired_statuses(objs, found)
    gw = out[("gateway.networking.k8s.io/v1", "Gateway", "shop", "shop-gateway")]
    assert cond(gw) == {"Accepted": ("True", "Accepted", 3), "Programmed": ("True", "Programmed", 3)}
    assert gw["listeners"][0]["attachedRoutes"] == 1
    route = out[("gateway.networking.k8s.io/v1", "HTTPRoute", "shop", "shop")]
    (parent,) = route["parents"]
    assert parent["controllerName"] == CONTROLLER_NAME and cond(parent)["Accepted"][0] == "True"
    stray = out[("gateway.networking.k8s.io/v1", "HTTPRoute", "other", "stray")]
    assert cond(stray["parents"][0])["Accepted"][:2] == ("False", "NotAllowedByListeners")
    # Istio kinds with no finding: nothing to say (and so nothing written)
    assert out[("networking.istio.io/v1", "VirtualService", "shop", "cart")] == {}


def test_a_condition_keeps_its_transition_time_while_its_status_stays():
    old = {"parents": [{"conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted",
                                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}]}
    same = {"parents": [{"conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}]}]}
    flipped = {"parents": [{"conditions": [{"type": "Accepted", "status": "False", "reason": "NoMatchingParent"}]}]}
    assert _keep_times(same, old)["parents"][0]["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert _keep_times(flipped, old)["parents"][0]["conditions"][0]["lastTransitionTime"] != "2026-01-01T00:00:00Z"
    assert _without_times(_keep_times(same, old)) == _without_times(old)
    json.dumps(_keep_times(flipped, old))
