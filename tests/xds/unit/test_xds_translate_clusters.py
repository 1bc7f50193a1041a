"""ServiceEntry/WorkloadEntry/DestinationRule -> Envoy clusters and endpoints."""
import pytest
from google.protobuf import json_format

from mcp26.mesh.resources import MeshConfig
from mcp26.mesh.parse import parse_documents
from mcp26.mesh.diagnostics import ConfigError
from mcp26.mesh.qos import QosClass
from mcp26.xds.translate import TranslateOptions, translate
from mcp26.xds.translate.routes import RouteContext
from mcp26.xds.model.type_urls import CLUSTER, ENDPOINT, ROUTE
from mcp26.xds.model.node import ProxyNode

SE = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: svc, namespace: default}
spec:
  hosts: [svc.mesh.local]
  ports: [{number: 80, name: http, protocol: HTTP}, {number: 90, name: grpc, protocol: GRPC}]
  resolution: STATIC
  endpoints:
  - {address: 127.0.0.1, ports: {http: 9001, grpc: 9101}, labels: {version: v1}, locality: r1/z1, weight: 2}
  - {address: 127.0.0.2, ports: {http: 9002}, labels: {version: v2}, locality: r1/z2}
"""
NODE = ProxyNode("router~1~gw~default", labels={"istio": "ingressgateway"})


def snap(extra: str = "", node=NODE, options=None):
    return translate(MeshConfig(parse_documents(SE + extra, "c.yaml")), node, options)


def cluster(s, name) -> dict:
    return json_format.MessageToDict(s[CLUSTER][name])


def dr(spec: str, annotations: str = "{}") -> str:
    return f"""---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: svc, namespace: default, annotations: {annotations}}}
spec:
  host: svc.mesh.local
{spec}
"""


def test_cluster_per_port_and_subset_with_istio_names():
    s = snap(dr("  subsets: [{name: v1, labels: {version: v1}}]"))
    assert set(s[CLUSTER]) == {"outbound|80||svc.mesh.local", "outbound|80|v1|svc.mesh.local",
                               "outbound|90||svc.mesh.local", "outbound|90|v1|svc.mesh.local"}


def test_endpoint_ports_localities_weights():
    cla = json_format.MessageToDict(snap()[ENDPOINT]["outbound|90||svc.mesh.local"])
    # The second endpoint names no grpc port: it is reached on the service port.
    assert cla["endpoints"] == [
        {"locality": {"region": "r1", "zone": "z1"}, "lbEndpoints": [
            {"endpoint": {"address": {"socketAddress": {"address": "127.0.0.1", "portValue": 9101}}}, "loadBalancingWeight": 2}],
         "loadBalancingWeight": 2},
        {"locality": {"region": "r1", "zone": "z2"}, "lbEndpoints": [
            {"endpoint": {"address": {"socketAddress": {"address": "127.0.0.2", "portValue": 90}}}}],
         "loadBalancingWeight": 1}]


def test_every_locality_is_present_and_weighted_for_grpc():
    # gRPC NACKs an assignment without locality and ignores one of weight 0.
    [loc] = snap(node=ProxyNode("g", kind="grpc"), extra="""---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: plain, namespace: default}
spec:
  hosts: [plain.mesh.local]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.9}, {address: 127.0.0.10}]
""")[ENDPOINT]["outbound|80||plain.mesh.local"].endpoints
    assert loc.HasField("locality") and loc.load_balancing_weight.value == 2


def test_port_protocol_sets_upstream_http_version():
    s = snap()
    opts = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    assert cluster(s, "outbound|80||svc.mesh.local")["typedExtensionProtocolOptions"][opts]["explicitHttpConfig"] == {"httpProtocolOptions": {}}
    assert cluster(s, "outbound|90||svc.mesh.local")["typedExtensionProtocolOptions"][opts]["explicitHttpConfig"] == {"http2ProtocolOptions": {}}


@pytest.mark.parametrize("simple,policy", [("ROUND_ROBIN", None), ("LEAST_REQUEST", "LEAST_REQUEST"),
                                           ("LEAST_CONN", "LEAST_REQUEST"), ("RANDOM", "RANDOM")])
def test_simple_load_balancer(simple, policy):
    c = cluster(snap(dr(f"  trafficPolicy: {{loadBalancer: {{simple: {simple}}}}}")), "outbound|80||svc.mesh.local")
    assert c.get("lbPolicy") == policy       # ROUND_ROBIN is the proto default (absent)


def test_default_load_balancer_is_least_request_like_istiod():
    assert cluster(snap(), "outbound|80||svc.mesh.local")["lbPolicy"] == "LEAST_REQUEST"


def test_passthrough_is_original_destination():
    c = cluster(snap(dr("  trafficPolicy: {loadBalancer: {simple: PASSTHROUGH}}")), "outbound|80||svc.mesh.local")
    assert (c["type"], c["lbPolicy"]) == ("ORIGINAL_DST", "CLUSTER_PROVIDED")


def test_consistent_hash_on_header_gives_ring_hash_and_route_hash_policy():
    vs = """---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: gw, namespace: default}
spec:
  selector: {istio: ingressgateway}
  servers: [{port: {number: 8080, name: http, protocol: HTTP}, hosts: ["*"]}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: vs, namespace: default}
spec:
  hosts: ["*"]
  gateways: [gw]
  http: [{route: [{destination: {host: svc.mesh.local, port: {number: 80}}}]}]
"""
    s = snap(dr("  trafficPolicy: {loadBalancer: {consistentHash: {httpHeaderName: x-user, minimumRingSize: 2048}}}") + vs)
    c = cluster(s, "outbound|80||svc.mesh.local")
    assert c["lbPolicy"] == "RING_HASH" and c["ringHashLbConfig"] == {"minimumRingSize": "2048"}
    route = json_format.MessageToDict(s[ROUTE]["http.8080"].virtual_hosts[0].routes[0])
    assert route["route"]["hashPolicy"] == [{"header": {"headerName": "x-user"}}]


def test_connection_pool_to_circuit_breakers_and_protocol_options():
    c = cluster(snap(dr("""  trafficPolicy:
    connectionPool:
      tcp: {maxConnections: 7, connectTimeout: 250ms, tcpKeepalive: {time: 60s, interval: 5s, probes: 2}}
      http: {http1MaxPendingRequests: 3, http2MaxRequests: 11, maxRetries: 1, maxRequestsPerConnection: 4, idleTimeout: 9s, h2UpgradePolicy: UPGRADE}
""")), "outbound|80||svc.mesh.local")
    assert c["circuitBreakers"]["thresholds"] == [{"maxConnections": 7, "maxPendingRequests": 3, "maxRequests": 11,
                                                    "maxRetries": 1, "trackRemaining": True}]
    assert c["connectTimeout"] == "0.250s"
    assert c["upstreamConnectionOptions"]["tcpKeepalive"] == {"keepaliveProbes": 2, "keepaliveTime": 60, "keepaliveInterval": 5}
    opts = c["typedExtensionProtocolOptions"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert opts["commonHttpProtocolOptions"] == {"idleTimeout": "9s", "maxRequestsPerConnection": 4}
    assert opts["explicitHttpConfig"] == {"http2ProtocolOptions": {}}       # h2UpgradePolicy: UPGRADE


def test_unlimited_circuit_breakers_by_default():
    t = cluster(snap(), "outbound|80||svc.mesh.local")["circuitBreakers"]["thresholds"][0]
    assert {t[k] for k in ("maxConnections", "maxPendingRequests", "maxRequests", "maxRetries")} == {4294967295}


def test_outlier_detection():
    c = cluster(snap(dr("""  trafficPolicy:
    outlierDetection: {consecutive5xxErrors: 4, consecutiveGatewayErrors: 0, interval: 3s, baseEjectionTime: 1m, maxEjectionPercent: 40, minHealthPercent: 20}
""")), "outbound|80||svc.mesh.local")
    assert c["outlierDetection"] == {"consecutive5xx": 4, "enforcingConsecutive5xx": 100, "consecutiveGatewayFailure": 0,
                                     "enforcingConsecutiveGatewayFailure": 0, "interval": "3s", "baseEjectionTime": "60s",
                                     "maxEjectionPercent": 40, "enforcingSuccessRate": 0}
    assert c["commonLbConfig"]["healthyPanicThreshold"] == {"value": 20.0}


def test_subset_and_port_level_policies_override_whole_fields():
    s = snap(dr("""  trafficPolicy:
    loadBalancer: {simple: RANDOM}
    connectionPool: {tcp: {maxConnections: 5}}
    portLevelSettings: [{port: {number: 90}, loadBalancer: {simple: ROUND_ROBIN}}]
  subsets:
  - name: v2
    labels: {version: v2}
    trafficPolicy: {connectionPool: {tcp: {maxConnections: 9}}}
"""))
    assert cluster(s, "outbound|80||svc.mesh.local")["lbPolicy"] == "RANDOM"
    assert "lbPolicy" not in cluster(s, "outbound|90||svc.mesh.local")            # ROUND_ROBIN
    v2 = cluster(s, "outbound|80|v2|svc.mesh.local")
    assert v2["lbPolicy"] == "RANDOM"                                           # inherited
    assert v2["circuitBreakers"]["thresholds"][0]["maxConnections"] == 9         # replaced
    addrs = [e.endpoint.address.socket_address.address for loc in s[ENDPOINT]["outbound|80|v2|svc.mesh.local"].endpoints
             for e in loc.lb_endpoints]
    assert addrs == ["127.0.0.2"]


def test_dns_resolutions():
    s = snap("""---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ext, namespace: default}
spec:
  hosts: [api.external.com]
  ports: [{number: 443, name: https, protocol: HTTPS}]
  resolution: DNS
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: rr, namespace: default}
spec:
  hosts: [rr.external.com]
  ports: [{number: 80, name: http}]
  resolution: DNS_ROUND_ROBIN
  endpoints: [{address: a.rr.external.com}, {address: b.rr.external.com}]
""")
    ext = cluster(s, "outbound|443||api.external.com")
    assert ext["type"] == "STRICT_DNS" and ext["dnsLookupFamily"] == "V4_ONLY"
    assert ext["loadAssignment"]["endpoints"][0]["lbEndpoints"][0]["endpoint"]["address"]["socketAddress"] == \
        {"address": "api.external.com", "portValue": 443}
    rr = cluster(s, "outbound|80||rr.external.com")
    assert rr["type"] == "LOGICAL_DNS"
    assert len(rr["loadAssignment"]["endpoints"][0]["lbEndpoints"]) == 1     # LOGICAL_DNS takes one host
    assert "outbound|443||api.external.com" not in s[ENDPOINT]


def test_workload_entries_selected_by_service_entry_workload_selector():
    s = translate(MeshConfig(parse_documents("""
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: w, namespace: ns1}
spec:
  hosts: [w.mesh.local]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  workloadSelector: {labels: {app: w}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: w1, namespace: ns1}
spec: {address: 127.0.0.5, ports: {http: 7001}, labels: {app: w, version: v1}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: other-app, namespace: ns1}
spec: {address: 127.0.0.6, labels: {app: x}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: other-ns, namespace: ns2}
spec: {address: 127.0.0.7, labels: {app: w}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: w, namespace: ns1}
spec:
  host: w.mesh.local
  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]
""", "w.yaml")), NODE)
    def eps(name):
        return [(e.endpoint.address.socket_address.address, e.endpoint.address.socket_address.port_value)
                for loc in s[ENDPOINT][name].endpoints for e in loc.lb_endpoints]
    assert eps("outbound|80||w.mesh.local") == [("127.0.0.5", 7001)]
    assert eps("outbound|80|v1|w.mesh.local") == [("127.0.0.5", 7001)]
    assert eps("outbound|80|v2|w.mesh.local") == []


def test_short_destination_rule_host_resolves_in_its_namespace():
    s = translate(MeshConfig(parse_documents("""
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: r, namespace: shop}
spec:
  hosts: [reviews.shop.svc.cluster.local]
  ports: [{number: 9080, name: http, protocol: HTTP}]
  resolution: STATIC
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: r, namespace: shop}
spec:
  host: reviews
  subsets: [{name: v1, labels: {version: v1}}]
""", "r.yaml")), NODE)
    assert "outbound|9080|v1|reviews.shop.svc.cluster.local" in s[CLUSTER]


def test_qos_annotation_sets_bind_config_and_ip_tos():
    s = snap(dr("  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]",
                "{qos.mcp-mesh.io/class: batch, qos.mcp-mesh.io/class.v2: latency-critical}"))
    def tos(name):
        b = s[CLUSTER][name].upstream_bind_config
        assert (b.source_address.address, b.source_address.port_value) == ("127.0.0.1", 0)
        [so] = b.socket_options
        assert (so.level, so.name, so.state) == (0, 1, 0)          # IPPROTO_IP, IP_TOS, STATE_PREBIND
        return so.int_value
    assert tos("outbound|80||svc.mesh.local") == QosClass.BATCH.tos == 8 << 2
    assert tos("outbound|80|v1|svc.mesh.local") == QosClass.BATCH.tos
    assert tos("outbound|80|v2|svc.mesh.local") == QosClass.LATENCY_CRITICAL.tos == 46 << 2


def test_qos_over_ipv6_uses_ipv6_tclass():
    s = snap(dr("", "{qos.mcp-mesh.io/class: interactive}"), options=TranslateOptions(upstream_bind_address="::1"))
    [so] = s[CLUSTER]["outbound|80||svc.mesh.local"].upstream_bind_config.socket_options
    assert (so.level, so.name, so.int_value) == (41, 67, QosClass.INTERACTIVE.tos)


def test_no_qos_annotation_no_bind_config():
    assert not snap()[CLUSTER]["outbound|80||svc.mesh.local"].HasField("upstream_bind_config")


def test_unknown_qos_class_is_a_config_error_naming_the_rule():
    with pytest.raises(ConfigError) as e:
        snap(dr("", "{qos.mcp-mesh.io/class: platinum}"))
    d = e.value.diagnostics[0]
    assert d.resource == "DestinationRule/default/svc" and d.field == "metadata.annotations"
    assert "platinum" in d.message


def test_destination_rule_tls_simple_and_mutual_from_files():
    s = snap(dr("""  trafficPolicy:
    tls: {mode: SIMPLE, sni: svc.example.com, caCertificates: /ca.pem, subjectAltNames: [svc.example.com]}
    portLevelSettings:
    - port: {number: 90}
      tls: {mode: MUTUAL, clientCertificate: /c.pem, privateKey: /c.key, caCertificates: /ca.pem}
  subsets:
  - {name: plain, labels: {version: v1}, trafficPolicy: {tls: {mode: DISABLE}}}
  - {name: mesh, labels: {version: v2}, trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}}
"""))
    simple = cluster(s, "outbound|80||svc.mesh.local")["transportSocket"]
    assert simple["name"] == "envoy.transport_sockets.tls"
    ctx = simple["typedConfig"]
    assert ctx["sni"] == "svc.example.com"
    assert ctx["commonTlsContext"]["validationContext"] == {
        "trustedCa": {"filename": "/ca.pem"},
        "matchTypedSubjectAltNames": [{"sanType": "DNS", "matcher": {"exact": "svc.example.com"}}]}
    mutual = cluster(s, "outbound|90||svc.mesh.local")["transportSocket"]["typedConfig"]["commonTlsContext"]
    assert mutual["tlsCertificates"] == [{"certificateChain": {"filename": "/c.pem"}, "privateKey": {"filename": "/c.key"}}]
    assert mutual["alpnProtocols"] == ["h2"]                       # a GRPC port
    assert "transportSocket" not in cluster(s, "outbound|80|plain|svc.mesh.local")   # DISABLE
    istio = cluster(s, "outbound|80|mesh|svc.mesh.local")["transportSocket"]["typedConfig"]   # ISTIO_MUTUAL: SDS
    assert istio["sni"] == "outbound_.80_.mesh_.svc.mesh.local"
    assert istio["commonTlsContext"]["tlsCertificateSdsSecretConfigs"][0]["name"] == "default"


def test_default_routes_hash_as_the_destination_rule_says():
    s = snap(dr("  trafficPolicy: {loadBalancer: {consistentHash: {httpCookie: {name: sticky, path: /, ttl: 90s}}}}"),
             node=ProxyNode("sidecar~1~a.default~default.svc.cluster.local", kind="sidecar"))
    [vh] = s[ROUTE]["80"].virtual_hosts
    [route] = vh.routes
    assert route.name == "default"
    assert json_format.MessageToDict(route)["route"]["hashPolicy"] == [{"cookie": {"name": "sticky", "path": "/", "ttl": "90s"}}]


def test_destination_rule_precedence_proxy_namespace_then_service_then_root():
    text = SE.replace("namespace: default", "namespace: svcns") + """---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: root, namespace: istio-system}
spec: {host: svc.mesh.local, trafficPolicy: {loadBalancer: {simple: RANDOM}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: own, namespace: svcns}
spec: {host: svc.mesh.local, trafficPolicy: {connectionPool: {tcp: {maxConnections: 11}}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: client, namespace: team-a}
spec: {host: svc.mesh.local, trafficPolicy: {connectionPool: {tcp: {maxConnections: 22}}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: wild, namespace: team-b}
spec: {host: "*.mesh.local", trafficPolicy: {connectionPool: {tcp: {maxConnections: 33}}}}
"""
    def max_conns(namespace):
        s = translate(MeshConfig(parse_documents(text, "p.yaml")),
                      ProxyNode(f"sidecar~1~x.{namespace}~{namespace}.svc.cluster.local", namespace=namespace, kind="sidecar"))
        return s[CLUSTER]["outbound|80||svc.mesh.local"].circuit_breakers.thresholds[0].max_connections.value
    assert max_conns("team-a") == 22          # the client's own namespace first
    assert max_conns("team-b") == 33          # its own wildcard rule still comes before other namespaces
    assert max_conns("elsewhere") == 11       # then the service's namespace (before the root's)
