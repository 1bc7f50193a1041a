"""VirtualService http actions -> Envoy route actions and per-route filter config."""
import pytest
from google.protobuf import json_format

from mcp26.mesh.resources import MeshConfig
from mcp26.mesh.parse import parse_documents
from mcp26.mesh.diagnostics import ConfigError
from mcp26.xds.translate import translate
from mcp26.xds.model.type_urls import ROUTE
from mcp26.xds.model.node import ProxyNode

HEAD = """
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: gw, namespace: default}
spec:
  selector: {istio: ingressgateway}
  servers: [{port: {number: 8080, name: http, protocol: HTTP}, hosts: ["*"]}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: svc, namespace: default}
spec:
  hosts: [svc.mesh.local]
  ports: [{number: 80, name: http, protocol: HTTP}, {number: 81, name: http-2, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.1, ports: {http: 9001}}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: svc, namespace: default}
spec:
  host: svc.mesh.local
  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: vs, namespace: default}
spec:
  hosts: [a.example.com]
  gateways: [gw]
  http:
"""
GATEWAY = ProxyNode("router~1~gw~default", labels={"istio": "ingressgateway"})
DEST = "{destination: {host: svc.mesh.local, port: {number: 80}}}"


def routes(http_yaml: str) -> list[dict]:
    cfg = MeshConfig(parse_documents(HEAD + http_yaml, "a.yaml"))
    rc = translate(cfg, GATEWAY)[ROUTE]["http.8080"]
    return [json_format.MessageToDict(r) for vh in rc.virtual_hosts for r in vh.routes]


def test_redirect_with_code_scheme_port():
    r = routes("""
  - redirect: {uri: /new, authority: b.example.com, redirectCode: 302, scheme: https, port: 8443}
""")[0]
    assert r["redirect"] == {"pathRedirect": "/new", "hostRedirect": "b.example.com", "schemeRedirect": "https",
                             "portRedirect": 8443, "responseCode": "FOUND"}
    assert "route" not in r


def test_direct_response_string_and_bytes():
    r = routes("""
  - match: [{uri: {prefix: /s}}]
    directResponse: {status: 503, body: {string: down}}
  - directResponse: {status: 200, body: {bytes: aGVsbG8=}}
""")
    assert r[0]["directResponse"] == {"status": 503, "body": {"inlineString": "down"}}
    assert r[1]["directResponse"] == {"status": 200, "body": {"inlineBytes": "aGVsbG8="}}


def test_rewrite_prefix_authority_and_regex():
    r = routes(f"""
  - match: [{{uri: {{prefix: /old}}}}]
    rewrite: {{uri: /new, authority: b.example.com}}
    route: [{DEST}]
  - match: [{{uri: {{regex: "/x/.*"}}}}]
    rewrite: {{uri: /y}}
    route: [{DEST}]
  - rewrite: {{uriRegexRewrite: {{match: "^/a/(.*)$", rewrite: '/b/\\1'}}}}
    route: [{DEST}]
""")
    assert r[0]["route"]["prefixRewrite"] == "/new"
    assert r[0]["route"]["hostRewriteLiteral"] == "b.example.com"
    assert r[1]["route"]["regexRewrite"] == {"pattern": {"regex": "/x/.*"}, "substitution": "/y"}
    assert r[2]["route"]["regexRewrite"] == {"pattern": {"regex": "^/a/(.*)$"}, "substitution": "/b/\\1"}


def test_timeout_set_or_disabled_like_istiod():
    r = routes(f"""
  - match: [{{uri: {{prefix: /t}}}}]
    timeout: 1.5s
    route: [{DEST}]
  - route: [{DEST}]
""")
    assert r[0]["route"]["timeout"] == "1.500s"
    assert r[1]["route"]["timeout"] == "0s"
    # A client's grpc-timeout is honoured by Envoy, capped by the route timeout.
    assert r[0]["route"]["maxGrpcTimeout"] == "1.500s"
    assert r[1]["route"]["maxGrpcTimeout"] == "0s"


def test_retries_default_explicit_and_off():
    r = routes(f"""
  - match: [{{uri: {{prefix: /r}}}}]
    retries: {{attempts: 4, perTryTimeout: 250ms, retryOn: "gateway-error,connect-failure,409"}}
    route: [{DEST}]
  - match: [{{uri: {{prefix: /off}}}}]
    retries: {{attempts: 0}}
    route: [{DEST}]
  - route: [{DEST}]
""")
    explicit = r[0]["route"]["retryPolicy"]
    assert explicit["numRetries"] == 4 and explicit["perTryTimeout"] == "0.250s"
    assert explicit["retryOn"] == "gateway-error,connect-failure,retriable-status-codes"
    assert explicit["retriableStatusCodes"] == [409]
    assert "retryPolicy" not in r[1]["route"]
    default = r[2]["route"]["retryPolicy"]
    assert default["numRetries"] == 2
    assert default["retryOn"] == "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
    assert default["retryHostPredicate"][0]["name"] == "envoy.retry_host_predicates.previous_hosts"


def test_fault_delay_and_abort_with_percentages():
    r = routes(f"""
  - match: [{{uri: {{prefix: /f}}}}]
    fault:
      delay: {{fixedDelay: 2s, percentage: {{value: 12.5}}}}
      abort: {{httpStatus: 503, percentage: {{value: 0.1}}}}
    route: [{DEST}]
  - fault: {{abort: {{grpcStatus: UNAVAILABLE}}, delay: {{fixedDelay: 1s, percent: 30}}}}
    route: [{DEST}]
""")
    f = r[0]["typedPerFilterConfig"]["envoy.filters.http.fault"]
    assert f["@type"].endswith("envoy.extensions.filters.http.fault.v3.HTTPFault")
    assert f["delay"] == {"fixedDelay": "2s", "percentage": {"numerator": 125000, "denominator": "MILLION"}}
    assert f["abort"] == {"httpStatus": 503, "percentage": {"numerator": 1000, "denominator": "MILLION"}}
    g = r[1]["typedPerFilterConfig"]["envoy.filters.http.fault"]
    assert g["abort"]["grpcStatus"] == 14
    assert g["abort"]["percentage"] == {"numerator": 1000000, "denominator": "MILLION"}
    assert g["delay"]["percentage"] == {"numerator": 30}          # deprecated percent: per hundred


def test_mirror_with_percentage_and_mirrors_list():
    r = routes(f"""
  - route: [{DEST}]
    mirror: {{host: svc.mesh.local, subset: v2, port: {{number: 80}}}}
    mirrorPercentage: {{value: 25}}
    mirrors: [{{destination: {{host: svc.mesh.local, subset: v1, port: {{number: 81}}}}}}]
""")
    mp = r[0]["route"]["requestMirrorPolicies"]
    assert [m["cluster"] for m in mp] == ["outbound|80|v2|svc.mesh.local", "outbound|81|v1|svc.mesh.local"]
    assert mp[0]["runtimeFraction"]["defaultValue"] == {"numerator": 250000, "denominator": "MILLION"}
    assert mp[1]["runtimeFraction"]["defaultValue"] == {"numerator": 1000000, "denominator": "MILLION"}


def test_header_set_add_remove_route_and_destination_level():
    r = routes("""
  - headers:
      request: {set: {x-a: "1", Host: h.example.com}, add: {x-b: "2"}, remove: [x-c]}
      response: {set: {x-d: "3"}, remove: [server]}
    route:
    - destination: {host: svc.mesh.local, subset: v1, port: {number: 80}}
      weight: 70
      headers: {request: {set: {x-sub: v1}}, response: {add: {x-from: v1}}}
    - destination: {host: svc.mesh.local, subset: v2, port: {number: 80}}
      weight: 30
""")[0]
    assert r["requestHeadersToAdd"] == [
        {"header": {"key": "x-a", "value": "1"}, "appendAction": "OVERWRITE_IF_EXISTS_OR_ADD"},
        {"header": {"key": "x-b", "value": "2"}}]          # APPEND_IF_EXISTS_OR_ADD is the default (0)
    assert r["requestHeadersToRemove"] == ["x-c"]
    assert r["responseHeadersToAdd"] == [{"header": {"key": "x-d", "value": "3"}, "appendAction": "OVERWRITE_IF_EXISTS_OR_ADD"}]
    assert r["responseHeadersToRemove"] == ["server"]
    assert r["route"]["hostRewriteLiteral"] == "h.example.com"   # Envoy will not add a Host header
    v1 = r["route"]["weightedClusters"]["clusters"][0]
    assert v1["requestHeadersToAdd"] == [{"header": {"key": "x-sub", "value": "v1"}, "appendAction": "OVERWRITE_IF_EXISTS_OR_ADD"}]
    assert v1["responseHeadersToAdd"] == [{"header": {"key": "x-from", "value": "v1"}}]


def test_cors_policy_per_route():
    r = routes(f"""
  - corsPolicy:
      allowOrigins: [{{exact: "https://a.com"}}, {{prefix: "https://b."}}, {{regex: ".*c.com"}}]
      allowMethods: [GET, POST]
      allowHeaders: [authorization]
      exposeHeaders: [x-upstream, x-b]
      maxAge: 24h
      allowCredentials: false
    route: [{DEST}]
""")[0]
    c = r["typedPerFilterConfig"]["envoy.filters.http.cors"]
    assert c["@type"].endswith("envoy.extensions.filters.http.cors.v3.CorsPolicy")
    assert c["allowOriginStringMatch"] == [{"exact": "https://a.com"}, {"prefix": "https://b."},
                                           {"safeRegex": {"regex": ".*c.com"}}]
    assert (c["allowMethods"], c["allowHeaders"], c["exposeHeaders"], c["maxAge"], c["allowCredentials"]) == \
        ("GET,POST", "authorization", "x-upstream,x-b", "86400", False)


def test_zero_weight_destinations_are_dropped_and_a_single_one_is_a_plain_cluster():
    r = routes("""
  - route:
    - {destination: {host: svc.mesh.local, subset: v1, port: {number: 80}}, weight: 100}
    - {destination: {host: svc.mesh.local, subset: v2, port: {number: 80}}, weight: 0}
""")[0]
    assert r["route"]["cluster"] == "outbound|80|v1|svc.mesh.local"


def test_route_metadata_names_its_virtual_service():
    r = routes(f"  - route: [{DEST}]\n")[0]
    assert r["metadata"]["filterMetadata"]["istio"]["config"] == \
        "/apis/networking.istio.io/v1/namespaces/default/virtual-service/vs"


def test_unreadable_duration_is_a_config_error_naming_file_resource_field():
    with pytest.raises(ConfigError) as e:
        routes(f"""
  - route: [{DEST}]
  - timeout: soon
    route: [{DEST}]
""")
    d = e.value.diagnostics[0]
    assert (d.file, d.resource, d.field) == ("a.yaml", "VirtualService/default/vs", "spec.http[1].timeout")
    assert d.line == HEAD.count("\n") + 3


def test_odd_but_valid_routes_never_give_envoy_an_action_less_route():
    r = routes("""
  - match: [{uri: {prefix: /nothing}}]
    route: []
  - route:
    - {destination: {host: svc.mesh.local, subset: v1, port: {number: 80}}}
    - {destination: {host: svc.mesh.local, subset: v2, port: {number: 80}}}
""")
    # The action-less route is left out; unweighted destinations go to the first.
    assert [x["match"] for x in r] == [{"prefix": "/"}]
    assert r[0]["route"]["cluster"] == "outbound|80|v1|svc.mesh.local"


def test_hosts_differing_only_in_case_make_one_virtual_host():
    cfg = MeshConfig(parse_documents(HEAD.replace("hosts: [a.example.com]", "hosts: [a.example.com, A.Example.com]")
                                     + f"  - route: [{DEST}]\n", "a.yaml"))
    rc = translate(cfg, GATEWAY)[ROUTE]["http.8080"]
    assert [vh.name for vh in rc.virtual_hosts] == ["a.example.com:8080"]


def test_route_config_raises_envoys_direct_response_limit_only_when_needed():
    def rc_for(size):
        cfg = MeshConfig(parse_documents(HEAD + f'  - directResponse: {{status: 200, body: {{string: "{"x" * size}"}}}}\n', "a.yaml"))
        return translate(cfg, GATEWAY)[ROUTE]["http.8080"]
    assert not rc_for(4096).HasField("max_direct_response_body_size_bytes")
    assert rc_for(5000).max_direct_response_body_size_bytes.value == 5000
