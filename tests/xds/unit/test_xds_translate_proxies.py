"""Which listeners, route configs and virtual hosts each proxy kind gets."""
import pytest
from google.protobuf import json_format

from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from mcp26.mesh.resources import MeshConfig
from mcp26.mesh.parse import parse_documents
from mcp26.mesh.diagnostics import ConfigError
from mcp26.xds import translate as translate_pkg
from mcp26.xds.translate import authn, translate
from mcp26.xds.model.type_urls import CLUSTER, ENDPOINT, LISTENER, ROUTE
from mcp26.xds.model.node import ProxyNode

MESH = """
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: public, namespace: edge}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8080, name: http, protocol: HTTP}
    hosts: ["shop/*.example.com", "./own.example.com"]
  - port: {number: 8080, name: http-b, protocol: HTTP}
    hosts: ["*/b.example.org"]
  - port: {number: 8443, name: https, protocol: HTTPS}
    hosts: ["*"]
    tls: {mode: SIMPLE, credentialName: c}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews, namespace: shop}
spec:
  hosts: [reviews.shop.svc.cluster.local]
  ports: [{number: 9080, name: http, protocol: HTTP}, {number: 9090, name: grpc, protocol: GRPC}]
  resolution: STATIC
  endpoints:
  - {address: 127.0.0.1, ports: {http: 9001, grpc: 9101}, labels: {version: v1}}
  - {address: 127.0.0.2, ports: {http: 9002, grpc: 9102}, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ratings, namespace: shop}
spec:
  hosts: [ratings.shop.svc.cluster.local]
  ports: [{number: 9080, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.3}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: shop}
spec:
  host: reviews
  trafficPolicy: {loadBalancer: {simple: RANDOM}}
  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: shop-edge, namespace: shop}
spec:
  hosts: ["www.example.com", "b.example.org", "other.net"]
  gateways: [edge/public]
  http: [{route: [{destination: {host: reviews, port: {number: 9080}}}]}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: shop}
spec:
  hosts: [reviews]
  http:
  - match: [{headers: {end-user: {exact: jason}}}]
    timeout: 3s
    fault: {abort: {grpcStatus: UNAVAILABLE, percentage: {value: 50}}}
    route: [{destination: {host: reviews, subset: v2}}]
  - route: [{destination: {host: reviews, subset: v1}}]
"""
import json
GATEWAY = ProxyNode("router~1~gw.edge~edge.svc.cluster.local", namespace="edge", labels={"istio": "ingressgateway"})
SIDECAR = ProxyNode("sidecar~2~app.shop~shop.svc.cluster.local", namespace="shop", kind="sidecar")
GRPC = ProxyNode("grpc-client-1", namespace="shop", kind="grpc")


def snap(node, text=MESH):
    return translate(MeshConfig(parse_documents(text, "mesh.yaml")), node)


def hcm_of(listener) -> dict:
    if listener.HasField("api_listener"):
        any_ = listener.api_listener.api_listener
    else:
        any_ = listener.filter_chains[0].filters[0].typed_config
    hcm = hcm_pb2.HttpConnectionManager()
    assert any_.Unpack(hcm)
    return json_format.MessageToDict(hcm)


# -- gateways --------------------------------------------------------------
def test_gateway_servers_on_one_port_share_a_listener_and_route_config():
    s = snap(GATEWAY)
    assert set(s[LISTENER]) == {"127.0.0.1_8080", "127.0.0.1_8443"}   # 8443: credentialName over SDS
    assert set(s[ROUTE]) == {"http.8080", "https.8443.https.public.edge"}


def test_gateway_host_namespaces_admit_only_matching_virtual_service_hosts():
    vhosts = {vh.name: list(vh.domains) for vh in snap(GATEWAY)[ROUTE]["http.8080"].virtual_hosts}
    # www.example.com: shop/*.example.com admits shop's VS; b.example.org: */ admits any;
    # other.net matches no server host; ./own.example.com is edge's, and no VS names it.
    assert vhosts == {"b.example.org:8080": ["b.example.org", "b.example.org:8080"],
                      "www.example.com:8080": ["www.example.com", "www.example.com:8080"]}


def test_mesh_virtual_service_does_not_reach_the_gateway():
    routes = [r for vh in snap(GATEWAY)[ROUTE]["http.8080"].virtual_hosts for r in vh.routes]
    assert {r.route.cluster for r in routes} == {"outbound|9080||reviews.shop.svc.cluster.local"}


# -- sidecars --------------------------------------------------------------
def test_sidecar_gets_a_listener_and_route_config_per_service_port():
    s = snap(SIDECAR)
    assert set(s[LISTENER]) == {"127.0.0.1_9080", "127.0.0.1_9090"}
    assert set(s[ROUTE]) == {"9080", "9090"}
    assert hcm_of(s[LISTENER]["127.0.0.1_9080"])["rds"]["routeConfigName"] == "9080"
    assert hcm_of(s[LISTENER]["127.0.0.1_9080"])["useRemoteAddress"] is False


def test_sidecar_routes_mesh_virtual_service_and_defaults_the_rest():
    rc = snap(SIDECAR)[ROUTE]["9080"]
    vh = {v.name: v for v in rc.virtual_hosts}
    assert set(vh) == {"ratings.shop.svc.cluster.local:9080", "reviews.shop.svc.cluster.local:9080"}
    assert [r.route.cluster for r in vh["reviews.shop.svc.cluster.local:9080"].routes] == [
        "outbound|9080|v2|reviews.shop.svc.cluster.local", "outbound|9080|v1|reviews.shop.svc.cluster.local"]
    [default] = vh["ratings.shop.svc.cluster.local:9080"].routes
    assert (default.name, default.route.cluster) == ("default", "outbound|9080||ratings.shop.svc.cluster.local")


# -- proxyless gRPC --------------------------------------------------------
def test_proxyless_grpc_gets_api_listeners_named_host_port():
    s = snap(GRPC)
    names = {"reviews.shop.svc.cluster.local:9080", "reviews.shop.svc.cluster.local:9090",
             "ratings.shop.svc.cluster.local:9080"}
    assert set(s[LISTENER]) == names and set(s[ROUTE]) == names
    lis = s[LISTENER]["reviews.shop.svc.cluster.local:9090"]
    assert not lis.HasField("address") and lis.HasField("api_listener")
    hcm = hcm_of(lis)
    assert hcm["rds"] == {"configSource": {"ads": {}, "resourceApiVersion": "V3"},
                          "routeConfigName": "reviews.shop.svc.cluster.local:9090"}
    # gRPC implements fault and router (gRFC A33, A39); the router comes last.
    assert [f["name"] for f in hcm["httpFilters"]] == ["envoy.filters.http.fault", "envoy.filters.http.router"]


def test_proxyless_route_config_matches_target_authority_and_carries_features():
    rc = snap(GRPC)[ROUTE]["reviews.shop.svc.cluster.local:9090"]
    [vh] = rc.virtual_hosts
    assert list(vh.domains) == ["reviews.shop.svc.cluster.local:9090", "reviews.shop.svc.cluster.local"]
    jason = json_format.MessageToDict(vh.routes[0])
    assert jason["route"]["cluster"] == "outbound|9090|v2|reviews.shop.svc.cluster.local"
    assert jason["route"]["maxStreamDuration"] == {"maxStreamDuration": "3s"}      # gRFC A31
    assert jason["typedPerFilterConfig"]["envoy.filters.http.fault"]["abort"]["grpcStatus"] == 14


def test_proxyless_clusters_are_eds_with_a_grpc_lb_policy():
    s = snap(GRPC)
    c = s[CLUSTER]["outbound|9090|v2|reviews.shop.svc.cluster.local"]
    d = json_format.MessageToDict(c)
    assert d["type"] == "EDS" and d["edsClusterConfig"]["edsConfig"] == {"ads": {}, "resourceApiVersion": "V3"}
    assert "lbPolicy" not in d                 # RANDOM is not in gRPC's set: ROUND_ROBIN
    # Nor is Istio's default LEAST_REQUEST: grpcio NACKs it ("LB policy is not supported").
    assert "lbPolicy" not in json_format.MessageToDict(s[CLUSTER]["outbound|9080||ratings.shop.svc.cluster.local"])
    assert "typedExtensionProtocolOptions" not in d
    [loc] = s[ENDPOINT]["outbound|9090|v2|reviews.shop.svc.cluster.local"].endpoints
    assert [(e.endpoint.address.socket_address.address, e.endpoint.address.socket_address.port_value)
            for e in loc.lb_endpoints] == [("127.0.0.2", 9102)]


# -- the HTTP filter chain (http_filters.py) ---------------------------------
def test_chain_is_cors_then_each_phase_in_order_then_fault_router(monkeypatch):
    for module in translate_pkg.FILTER_MODULES:
        name = f"test.{module.__name__.rsplit('.', 1)[-1]}"
        monkeypatch.setattr(module, "http_filters", lambda config, node, port, phase, name=name:
                            [hcm_pb2.HttpFilter(name=f"{name}.{phase.name}.{port}")])
    hcm = hcm_of(snap(GATEWAY)[LISTENER]["127.0.0.1_8080"])
    assert [f["name"] for f in hcm["httpFilters"]] == [
        "envoy.filters.http.cors",
        "test.wasm_plugins.AUTHN.8080", "test.authn.AUTHN.8080",       # Istio: AUTHN plugins before jwt_authn
        "test.grpc_web.PROTOCOL.8080",
        "test.wasm_plugins.AUTHZ.8080", "test.rbac.AUTHZ.8080",        # Istio: AUTHZ plugins before RBAC
        "test.wasm_plugins.STATS.8080", "test.wasm_plugins.UNSPECIFIED.8080",
        "test.endpoint_picker.UNSPECIFIED.8080",                        # Istio: the InferencePool ext_proc last
        "envoy.filters.http.fault", "envoy.filters.http.router"]


def test_filter_resources_merge_and_a_name_clash_is_an_error(monkeypatch):
    from envoy.config.cluster.v3 import cluster_pb2
    monkeypatch.setattr(authn, "resources",
                        lambda config, node, overlay: {CLUSTER: {"jwks|issuer": cluster_pb2.Cluster(name="jwks|issuer")}})
    assert "jwks|issuer" in snap(GATEWAY)[CLUSTER]
    clash = "outbound|9080||ratings.shop.svc.cluster.local"
    monkeypatch.setattr(authn, "resources",
                        lambda config, node, overlay: {CLUSTER: {clash: cluster_pb2.Cluster(name=clash)}})
    with pytest.raises(ConfigError, match="already emits"):
        snap(GATEWAY)


# -- HTTPS gateway servers ----------------------------------------------------
TLS_GATEWAY = """
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: tls, namespace: edge}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 443, name: https-a, protocol: HTTPS}
    hosts: [a.example.com]
    tls: {mode: SIMPLE, serverCertificate: /certs/a.pem, privateKey: /certs/a.key}
  - port: {number: 443, name: https-b, protocol: HTTPS}
    hosts: ["*.b.example.com"]
    tls: {mode: MUTUAL, serverCertificate: /certs/b.pem, privateKey: /certs/b.key, caCertificates: /certs/ca.pem,
          minProtocolVersion: TLSV1_3}
  - port: {number: 8443, name: https-sds, protocol: HTTPS}
    hosts: [c.example.com]
    tls: {mode: SIMPLE, credentialName: c-cert}
  - port: {number: 80, name: http, protocol: HTTP}
    hosts: [a.example.com]
    tls: {httpsRedirect: true}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: tls, namespace: edge}
spec:
  hosts: [a.example.com, x.b.example.com]
  gateways: [tls]
  http: [{route: [{destination: {host: reviews.shop.svc.cluster.local, port: {number: 9080}}}]}]
"""


def test_https_servers_get_a_tls_chain_and_route_config_each():
    s = snap(GATEWAY, MESH + "---" + TLS_GATEWAY)
    assert {"127.0.0.1_443", "127.0.0.1_80"} <= set(s[LISTENER])
    sds = json_format.MessageToDict(s[LISTENER]["127.0.0.1_8443"])["filterChains"][-1]["transportSocket"]
    assert sds["typedConfig"]["commonTlsContext"]["tlsCertificateSdsSecretConfigs"][0]["name"] == "kubernetes://c-cert"
    assert {"https.443.https-a.tls.edge", "https.443.https-b.tls.edge"} <= set(s[ROUTE])
    lis = json_format.MessageToDict(s[LISTENER]["127.0.0.1_443"])
    assert [f["name"] for f in lis["listenerFilters"]] == ["envoy.filters.listener.tls_inspector"]
    # Per server: one chain per ALPN of the QoS classes, then the default one.
    a, b = [c for c in lis["filterChains"] if "applicationProtocols" not in c["filterChainMatch"]]
    assert a["filterChainMatch"] == {"serverNames": ["a.example.com"]}
    assert b["filterChainMatch"] == {"serverNames": ["*.b.example.com"]}
    tls_a = a["transportSocket"]["typedConfig"]
    assert tls_a["commonTlsContext"]["tlsCertificates"] == [
        {"certificateChain": {"filename": "/certs/a.pem"}, "privateKey": {"filename": "/certs/a.key"}}]
    assert tls_a["commonTlsContext"]["alpnProtocols"] == ["h2", "http/1.1"]
    assert "requireClientCertificate" not in tls_a
    tls_b = b["transportSocket"]["typedConfig"]
    assert tls_b["requireClientCertificate"] is True
    assert tls_b["commonTlsContext"]["validationContext"] == {"trustedCa": {"filename": "/certs/ca.pem"}}
    assert tls_b["commonTlsContext"]["tlsParams"]["tlsMinimumProtocolVersion"] == "TLSv1_3"
    assert [f["typedConfig"]["rds"]["routeConfigName"] for f in (a["filters"][0], b["filters"][0])] == [
        "https.443.https-a.tls.edge", "https.443.https-b.tls.edge"]
    # Each HTTPS route configuration holds only its server's hosts.
    assert [vh.name for vh in s[ROUTE]["https.443.https-b.tls.edge"].virtual_hosts] == ["x.b.example.com:443"]


def _early_mutations(chain: dict) -> list[dict]:
    [hcm] = [f["typedConfig"] for f in chain["filters"]]
    [ext] = hcm["earlyHeaderMutationExtensions"]
    assert ext["name"] == "envoy.http.early_header_mutation.header_mutation"
    assert ext["typedConfig"]["@type"].endswith("early_header_mutation.header_mutation.v3.HeaderMutation")
    return ext["typedConfig"]["mutations"]


def test_https_servers_get_one_chain_per_qos_alpn_that_sets_the_alpn_header():
    from mcp26.mesh import headers as H
    from mcp26.mesh.qos import ALPN_CLASSES
    s = snap(GATEWAY, MESH + "---" + TLS_GATEWAY)
    lis = json_format.MessageToDict(s[LISTENER]["127.0.0.1_443"])
    chains = lis["filterChains"]
    assert [(c["filterChainMatch"]["serverNames"], c["filterChainMatch"].get("applicationProtocols")) for c in chains] == [
        (["a.example.com"], [alpn]) for alpn in ALPN_CLASSES] + [(["a.example.com"], None)] + [
        (["*.b.example.com"], [alpn]) for alpn in ALPN_CLASSES] + [(["*.b.example.com"], None)]
    for c in chains:
        alpn = c["filterChainMatch"].get("applicationProtocols", [None])[0]
        want = [{"remove": H.DOWNSTREAM_ALPN}]
        if alpn:
            want.append({"append": {"header": {"key": H.DOWNSTREAM_ALPN, "value": alpn},
                                    "appendAction": "OVERWRITE_IF_EXISTS_OR_ADD"}})
        assert _early_mutations(c) == want
    # Apart from the match and the header mutation, a server's chains are identical.
    def rest(c):
        c = json.loads(json.dumps(c))
        c.pop("filterChainMatch")
        c["filters"][0]["typedConfig"].pop("earlyHeaderMutationExtensions")
        return c
    n = len(ALPN_CLASSES) + 1
    for server in (chains[:n], chains[n:]):
        assert all(rest(c) == rest(server[-1]) for c in server)
    assert rest(chains[0]) != rest(chains[n])
    # Plaintext listeners set nothing, but still remove a client's copy.
    plain = json_format.MessageToDict(s[LISTENER]["127.0.0.1_80"])
    for c in plain["filterChains"]:
        assert "applicationProtocols" not in c.get("filterChainMatch", {})
        assert _early_mutations(c) == [{"remove": H.DOWNSTREAM_ALPN}]


def test_https_redirect_requires_tls_on_the_plain_servers_hosts():
    s = snap(GATEWAY, MESH + "---" + TLS_GATEWAY)
    [vh] = s[ROUTE]["http.80"].virtual_hosts
    assert vh.name == "a.example.com:80" and json_format.MessageToDict(vh)["requireTls"] == "ALL"


# -- TCP and TLS passthrough --------------------------------------------------
L4 = """
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: l4, namespace: edge}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 5432, name: tcp, protocol: TCP}
    hosts: ["*"]
  - port: {number: 9443, name: tls, protocol: TLS}
    hosts: ["*.example.com"]
    tls: {mode: PASSTHROUGH}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db, namespace: shop}
spec:
  hosts: [db.shop.svc.cluster.local]
  ports: [{number: 5432, name: tcp, protocol: TCP}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.4, labels: {role: primary}}, {address: 127.0.0.5, labels: {role: replica}}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: db, namespace: shop}
spec:
  host: db
  subsets: [{name: primary, labels: {role: primary}}, {name: replica, labels: {role: replica}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: l4, namespace: shop}
spec:
  hosts: ["*"]
  gateways: [edge/l4]
  tcp:
  - match: [{port: 1111}]
    route: [{destination: {host: ratings}}]
  - route:
    - {destination: {host: db, subset: primary}, weight: 80}
    - {destination: {host: db, subset: replica}, weight: 20}
  tls:
  - match: [{sniHosts: [a.example.com]}]
    route: [{destination: {host: reviews, port: {number: 9080}}}]
  - match: [{sniHosts: [b.example.com, c.example.com]}]
    route: [{destination: {host: ratings, port: {number: 9080}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: db, namespace: shop}
spec:
  hosts: [db]
  tcp: [{route: [{destination: {host: db, subset: replica}}]}]
"""


def network_filters(listener) -> list[tuple[list, dict]]:
    d = json_format.MessageToDict(listener)
    return [(c.get("filterChainMatch", {}).get("serverNames", []), c["filters"][0]) for c in d["filterChains"]]


def test_gateway_tcp_server_gets_the_first_applicable_tcp_route():
    s = snap(GATEWAY, MESH + "---" + L4)
    [(sni, f)] = network_filters(s[LISTENER]["127.0.0.1_5432"])
    assert sni == [] and f["name"] == "envoy.filters.network.tcp_proxy"
    assert f["typedConfig"]["weightedClusters"]["clusters"] == [
        {"name": "outbound|5432|primary|db.shop.svc.cluster.local", "weight": 80},
        {"name": "outbound|5432|replica|db.shop.svc.cluster.local", "weight": 20}]


def test_gateway_tls_passthrough_routes_by_sni():
    s = snap(GATEWAY, MESH + "---" + L4)
    lis = s[LISTENER]["127.0.0.1_9443"]
    assert [f.name for f in lis.listener_filters] == ["envoy.filters.listener.tls_inspector"]
    chains = network_filters(lis)
    assert [(sni, f["typedConfig"]["cluster"]) for sni, f in chains] == [
        (["a.example.com"], "outbound|9080||reviews.shop.svc.cluster.local"),
        (["b.example.com", "c.example.com"], "outbound|9080||ratings.shop.svc.cluster.local")]
    assert all("transportSocket" not in c for c in json_format.MessageToDict(lis)["filterChains"])  # not terminated


def test_sidecar_tcp_port_follows_the_mesh_tcp_route():
    s = snap(SIDECAR, MESH + "---" + L4)
    [(_, f)] = network_filters(s[LISTENER]["127.0.0.1_5432"])
    assert f["typedConfig"]["cluster"] == "outbound|5432|replica|db.shop.svc.cluster.local"
    assert "5432" not in s[ROUTE]
    c = json_format.MessageToDict(s[CLUSTER]["outbound|5432||db.shop.svc.cluster.local"])
    assert "typedExtensionProtocolOptions" not in c      # bytes, not HTTP


def test_sidecar_tcp_services_sharing_a_port_listen_on_their_vips():
    shared = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: redis-a, namespace: shop}
spec:
  hosts: [redis-a.shop.svc.cluster.local]
  addresses: [127.10.0.1]
  ports: [{number: 6379, name: redis, protocol: REDIS}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.8}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: redis-b, namespace: shop}
spec:
  hosts: [redis-b.shop.svc.cluster.local]
  addresses: [127.10.0.2/32]
  ports: [{number: 6379, name: redis, protocol: REDIS}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.9}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: redis-c, namespace: shop}
spec:
  hosts: [redis-c.shop.svc.cluster.local]
  ports: [{number: 6379, name: redis, protocol: REDIS}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.10}]
"""
    s = snap(SIDECAR, shared)
    assert set(s[LISTENER]) == {"127.10.0.1_6379", "127.10.0.2_6379"}    # redis-c has no VIP: no listener
    lis = s[LISTENER]["127.10.0.2_6379"]
    assert lis.address.socket_address.address == "127.10.0.2"
    [(_, f)] = network_filters(lis)
    assert f["typedConfig"]["cluster"] == "outbound|6379||redis-b.shop.svc.cluster.local"


def test_sidecar_gets_virtual_hosts_for_mesh_hosts_that_are_no_service():
    extra = MESH + """---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: external, namespace: shop}
spec:
  hosts: [api.partner.com, "*.internal.example"]
  http:
  - match: [{port: 9090}]
    route: [{destination: {host: reviews, port: {number: 9090}}}]
  - route: [{destination: {host: ratings}}]
"""
    s = snap(SIDECAR, extra)
    vh = {v.name: v for v in s[ROUTE]["9080"].virtual_hosts}
    assert {"api.partner.com:9080", "*.internal.example:9080"} <= set(vh)
    assert list(vh["*.internal.example:9080"].domains) == ["*.internal.example", "*.internal.example:9080"]
    assert [r.route.cluster for r in vh["api.partner.com:9080"].routes] == ["outbound|9080||ratings.shop.svc.cluster.local"]
    on_9090 = {v.name: v for v in s[ROUTE]["9090"].virtual_hosts}["api.partner.com:9090"]
    assert [r.route.cluster for r in on_9090.routes] == [
        "outbound|9090||reviews.shop.svc.cluster.local", "outbound|9080||ratings.shop.svc.cluster.local"]


def test_export_to_limits_what_each_namespace_sees():
    text = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: private, namespace: shop}
spec:
  hosts: [private.shop.svc.cluster.local]
  exportTo: ["."]
  ports: [{number: 9080, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.11}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: shared, namespace: shop}
spec:
  hosts: [shared.shop.svc.cluster.local]
  exportTo: [shop, billing]
  ports: [{number: 9080, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.12}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: public, namespace: shop}
spec:
  hosts: [public.shop.svc.cluster.local]
  ports: [{number: 9080, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.13}]
"""
    def seen(namespace):
        s = snap(ProxyNode(f"sidecar~1~a.{namespace}~{namespace}.svc.cluster.local", namespace=namespace,
                           kind="sidecar"), text)
        return {c.split("|")[3].split(".")[0] for c in s[CLUSTER]}, {vh.name.split(".")[0] for vh in s[ROUTE]["9080"].virtual_hosts}
    assert seen("shop") == ({"private", "shared", "public"},) * 2
    assert seen("billing") == ({"shared", "public"},) * 2
    assert seen("web") == ({"public"},) * 2


def test_gateway_server_bind_gets_its_own_listener_on_the_shared_route_config():
    text = """
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: bound, namespace: edge}
spec:
  selector: {istio: ingressgateway}
  servers:
  - {port: {number: 8080, name: http-a, protocol: HTTP}, hosts: ["*/a.example.com"], bind: 127.0.0.21}
  - {port: {number: 8080, name: http-b, protocol: HTTP}, hosts: ["*/b.example.com"]}
"""
    s = snap(GATEWAY, MESH + "---" + text)
    assert {"127.0.0.21_8080", "127.0.0.1_8080"} <= set(s[LISTENER])
    assert s[LISTENER]["127.0.0.21_8080"].address.socket_address.address == "127.0.0.21"
    assert hcm_of(s[LISTENER]["127.0.0.21_8080"])["rds"]["routeConfigName"] == "http.8080"


def test_sidecar_domains_include_kubernetes_short_names_and_vips():
    text = MESH.replace("hosts: [ratings.shop.svc.cluster.local]", "hosts: [ratings.shop.svc.cluster.local]\n  addresses: [127.20.0.1]")
    def domains(namespace):
        node = ProxyNode(f"sidecar~2~app.{namespace}~{namespace}.svc.cluster.local", namespace=namespace, kind="sidecar")
        return {vh.name: list(vh.domains) for vh in snap(node, text)[ROUTE]["9080"].virtual_hosts}
    assert domains("shop")["ratings.shop.svc.cluster.local:9080"] == [
        "ratings.shop.svc.cluster.local", "ratings.shop.svc.cluster.local:9080", "ratings", "ratings:9080",
        "ratings.shop", "ratings.shop:9080", "ratings.shop.svc", "ratings.shop.svc:9080", "127.20.0.1", "127.20.0.1:9080"]
    # From another namespace the bare short name means something else: not offered.
    assert "ratings" not in domains("web")["ratings.shop.svc.cluster.local:9080"]
    assert "ratings.shop" in domains("web")["ratings.shop.svc.cluster.local:9080"]
