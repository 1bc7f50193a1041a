"""VirtualService http match -> Envoy RouteMatch, and which matches apply where."""
from google.protobuf import json_format

from mcp26.mesh.resources import MeshConfig
from mcp26.mesh.parse import parse_documents
from mcp26.xds.translate import translate
from mcp26.xds.model.type_urls import ROUTE
from mcp26.xds.model.node import ProxyNode

HEAD = """
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: gw, namespace: default}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8080, name: http, protocol: HTTP}
    hosts: ["*"]
  - port: {number: 9090, name: http-alt, protocol: HTTP}
    hosts: ["*"]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: svc, namespace: default}
spec:
  hosts: [svc.mesh.local]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.1, ports: {http: 9001}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: vs, namespace: default}
spec:
  hosts: [a.example.com]
  gateways: [gw]
  http:
"""
GATEWAY = ProxyNode("router~1~gw~default", labels={"istio": "ingressgateway", "app": "edge"})


def matches(http_yaml: str, port: int = 8080, node=GATEWAY) -> list[dict]:
    cfg = MeshConfig(parse_documents(HEAD + http_yaml, "m.yaml"))
    rc = translate(cfg, node)[ROUTE][f"http.{port}"]
    return [json_format.MessageToDict(r)["match"] for vh in rc.virtual_hosts for r in vh.routes]


ROUTE_TO = "    route: [{destination: {host: svc.mesh.local}}]\n"


def test_uri_exact_prefix_regex_and_ignore_case():
    got = matches("""
  - match: [{uri: {exact: /a}}, {uri: {prefix: /b}}, {uri: {regex: "/c/[0-9]+"}, ignoreUriCase: true}]
""" + ROUTE_TO)
    assert got == [{"path": "/a"}, {"prefix": "/b"},
                   {"safeRegex": {"regex": "/c/[0-9]+"}, "caseSensitive": False}]


def test_no_match_is_the_catch_all_prefix():
    assert matches("  - route: [{destination: {host: svc.mesh.local}}]\n") == [{"prefix": "/"}]


def test_authority_method_scheme_become_pseudo_header_matchers():
    got = matches("""
  - match: [{authority: {prefix: api.}, method: {exact: POST}, scheme: {regex: "https?"}}]
""" + ROUTE_TO)
    assert got[0]["headers"] == [
        {"name": ":authority", "stringMatch": {"prefix": "api."}},
        {"name": ":method", "stringMatch": {"exact": "POST"}},
        {"name": ":scheme", "stringMatch": {"safeRegex": {"regex": "https?"}}}]


def test_headers_and_without_headers_invert():
    got = matches("""
  - match:
    - headers: {X-A: {exact: "1"}, x-b: {prefix: p}, x-c: {regex: "c+"}, x-d: {}}
      withoutHeaders: {x-e: {exact: bad}, x-f: {}}
""" + ROUTE_TO)
    assert got[0]["headers"] == [
        {"name": "x-a", "stringMatch": {"exact": "1"}},
        {"name": "x-b", "stringMatch": {"prefix": "p"}},
        {"name": "x-c", "stringMatch": {"safeRegex": {"regex": "c+"}}},
        {"name": "x-d", "presentMatch": True},
        {"name": "x-e", "stringMatch": {"exact": "bad"}, "invertMatch": True},
        {"name": "x-f", "presentMatch": True, "invertMatch": True}]


def test_query_params():
    got = matches("""
  - match: [{queryParams: {q: {exact: "1"}, r: {regex: "[0-9]+"}, s: {}}}]
""" + ROUTE_TO)
    assert got[0]["queryParameters"] == [
        {"name": "q", "stringMatch": {"exact": "1"}},
        {"name": "r", "stringMatch": {"safeRegex": {"regex": "[0-9]+"}}},
        {"name": "s", "presentMatch": True}]


def test_match_port_limits_the_route_to_that_listener_port():
    http = """
  - match: [{uri: {prefix: /only-9090}, port: 9090}]
""" + ROUTE_TO + "  - route: [{destination: {host: svc.mesh.local}}]\n"
    assert matches(http, 8080) == [{"prefix": "/"}]
    assert matches(http, 9090) == [{"prefix": "/only-9090"}, {"prefix": "/"}]


def test_match_gateways_and_source_labels_filter_per_proxy():
    http = """
  - match: [{uri: {prefix: /mesh-only}, gateways: [mesh]}]
""" + ROUTE_TO + """
  - match: [{uri: {prefix: /edge}, sourceLabels: {app: edge}}]
""" + ROUTE_TO
    assert matches(http) == [{"prefix": "/edge"}]
    other = ProxyNode("router~2~gw~default", labels={"istio": "ingressgateway", "app": "other"})
    assert matches(http, node=other) == []


DELEGATE = """
  - match: [{uri: {prefix: /reviews}, headers: {x-team: {exact: a}}}]
    delegate: {name: reviews-routes, namespace: team}
  - match: [{uri: {prefix: /missing}}]
    delegate: {name: nobody}
  - route: [{destination: {host: svc.mesh.local}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews-routes, namespace: team}
spec:
  http:
  - match: [{uri: {prefix: /reviews/v2}, headers: {end-user: {exact: jason}}}, {uri: {prefix: /other}}]
    route: [{destination: {host: svc.mesh.local}}]
    timeout: 7s
  - match: [{uri: {exact: /reviews}, headers: {x-team: {exact: b}}}]
    route: [{destination: {host: svc.mesh.local}}]
  - route: [{destination: {host: svc.mesh.local}}]
"""


def test_delegate_routes_merge_their_matches_into_the_roots():
    cfg = MeshConfig(parse_documents(HEAD + DELEGATE, "d.yaml"))
    rc = translate(cfg, GATEWAY)[ROUTE]["http.8080"]
    routes = [json_format.MessageToDict(r) for vh in rc.virtual_hosts for r in vh.routes]
    assert [r["match"] for r in routes] == [
        # /reviews/v2 within /reviews: both headers; /other conflicts with /reviews: dropped.
        {"prefix": "/reviews/v2", "headers": [{"name": "end-user", "stringMatch": {"exact": "jason"}},
                                              {"name": "x-team", "stringMatch": {"exact": "a"}}]},
        # x-team: b against the root's x-team: a is a conflict; the catch-all takes the root's match.
        {"prefix": "/reviews", "headers": [{"name": "x-team", "stringMatch": {"exact": "a"}}]},
        {"prefix": "/"}]
    assert routes[0]["route"]["timeout"] == "7s"          # the delegate's own action
    assert routes[0]["metadata"]["filterMetadata"]["istio"]["config"].endswith("/namespaces/team/virtual-service/reviews-routes")
