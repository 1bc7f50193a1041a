"""L7SchedulingPolicy's routing fields (mesh/l7_routing.py) -> routes before every virtual host's
own, at the proxies of the policy's namespace, with the class of its priority in the route's
metadata (xds-server/translate/route_configs.py). The seed's example is the shipped
istio-manifests/examples/l7-routing.yaml."""
from google.protobuf import json_format

from mcp26.mesh.l7_routing import class_for_priority
from mcp26.mesh.parse import parse_documents
from mcp26.mesh.resources import MeshConfig
from mcp26.manifests import EXAMPLES
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.translate import translate
from mcp26.xds.model.type_urls import ROUTE

EXAMPLE = (EXAMPLES / "l7-routing.yaml").read_text()
GATEWAY = """
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: gw, namespace: inference}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8080, name: http, protocol: HTTP}
    hosts: ["*"]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: vs, namespace: inference}
spec:
  hosts: [a.example.com, b.example.com]
  gateways: [gw]
  http:
  - route: [{destination: {host: llm-premium.inference.svc.cluster.local}}]
"""
LOWER = """
---
apiVersion: scheduling.mcp-mesh.io/v1alpha1
kind: L7SchedulingPolicy
metadata: {name: bulk, namespace: inference}
spec:
  priority: 10
  matchHeaders: {X-Job: nightly}
  backendService: llm-premium.inference.svc.cluster.local:8080
"""


def routes(text: str, node: ProxyNode, name: str = "http.8080") -> list[dict]:
    cfg = MeshConfig(parse_documents(text, "m.yaml"))
    rc = translate(cfg, node)[ROUTE][name]
    return [[json_format.MessageToDict(r) for r in vh.routes] for vh in rc.virtual_hosts]


def gateway(namespace: str = "inference") -> ProxyNode:
    return ProxyNode(f"router~1~gw.{namespace}~{namespace}.svc.cluster.local", namespace=namespace,
                     labels={"istio": "ingressgateway"})


def test_the_seeds_example_routes_matching_requests_first_with_its_class():
    vhosts = routes(EXAMPLE + "---\n" + GATEWAY, gateway())
    assert len(vhosts) == 2
    for vh in vhosts:
        first = vh[0]
        assert first["match"] == {"prefix": "/", "headers": [
            {"name": "x-llm-model", "stringMatch": {"exact": "llama-70b"}},
            {"name": "x-user-tier", "stringMatch": {"exact": "premium"}}]}
        assert first["route"]["cluster"] == "outbound|8080||llm-premium.inference.svc.cluster.local"
        meta = first["metadata"]["filterMetadata"]["mcp-mesh"]
        assert meta["qos_class"] == "latency-critical" == class_for_priority(90).header_value
        assert meta["resource"] == "L7SchedulingPolicy/inference/premium-llm"
        assert "headers" not in vh[1]["match"]                  # the VirtualService's own route after it


def test_policies_go_highest_priority_first_and_only_in_their_namespace():
    vhosts = routes(EXAMPLE + LOWER + "---\n" + GATEWAY, gateway())
    names = [r.get("name", "") for r in vhosts[0]]
    assert names[:2] == ["l7schedulingpolicy.inference.premium-llm", "l7schedulingpolicy.inference.bulk"]
    assert vhosts[0][1]["metadata"]["filterMetadata"]["mcp-mesh"]["qos_class"] == "batch"
    assert vhosts[0][1]["match"]["headers"] == [{"name": "x-job", "stringMatch": {"exact": "nightly"}}]
    other = routes(EXAMPLE + "---\n" + GATEWAY.replace("namespace: inference", "namespace: edge"), gateway("edge"))
    assert all(not r.get("name", "").startswith("l7schedulingpolicy.") for vh in other for r in vh)


def test_a_sidecar_of_the_namespace_gets_them_on_each_http_port():
    sidecar = ProxyNode("sidecar~10.0.0.5~app-1.inference~inference.svc.cluster.local", namespace="inference",
                        kind="sidecar", labels={"app": "a"})
    vhosts = routes(EXAMPLE, sidecar, name="8080")
    assert vhosts and all(vh[0]["name"] == "l7schedulingpolicy.inference.premium-llm" for vh in vhosts)


def test_a_batching_only_policy_adds_no_route():
    text = EXAMPLE.replace("""  priority: 90
  matchHeaders:
    x-llm-model: llama-70b
    x-user-tier: premium
  backendService: llm-premium.inference.svc.cluster.local
""", "  qosPolicy: throughput\n")
    assert "priority:" not in text
    vhosts = routes(text + "---\n" + GATEWAY, gateway())
    assert all(not r.get("name", "").startswith("l7schedulingpolicy.") for vh in vhosts for r in vh)


def test_route_explain_names_the_policy_and_the_line_of_its_match():
    from mcp26.mesh.change_set import load_texts
    from mcp26.xds.explain import envoy_match as em
    from mcp26.xds.explain.route_explain import explain, proxy_for
    text = EXAMPLE + "---\n" + GATEWAY
    config = load_texts({"l7.yaml": text})
    r = explain(config, proxy_for(config), em.Request("a.example.com", "/v1/chat", "POST",
                                                      {"x-llm-model": ["llama-70b"], "x-user-tier": ["premium"]}))
    src = r["route"]["source"]
    assert src["resource"] == "L7SchedulingPolicy/inference/premium-llm"
    assert "matchHeaders" in text.splitlines()[int(src["match_at"].split(":")[1]) - 1]
    plain = explain(config, proxy_for(config), em.Request("a.example.com", "/v1/chat", "POST", {"x-user-tier": ["premium"]}))
    assert plain["route"]["source"]["resource"] == "VirtualService/inference/vs"   # one header short: not matched
