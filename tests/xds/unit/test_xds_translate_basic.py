"""translate(): Gateway + VirtualService + DestinationRule + ServiceEntry -> LDS/RDS/CDS/EDS."""
from google.protobuf import json_format

from mcp26.mesh.resources import MeshConfig
from mcp26.mesh.parse import parse_documents
from mcp26.xds.translate import TranslateOptions, Translator, translate
from mcp26.xds.model.type_urls import CLUSTER, ENDPOINT, LISTENER, ROUTE
from mcp26.xds.model.node import ProxyNode

BASIC = """
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: gw, namespace: default}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8080, name: http, protocol: HTTP}
    hosts: ["*"]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: echo, namespace: default}
spec:
  hosts: [echo.mesh.local]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints:
  - {address: 127.0.0.1, ports: {http: 9001}, labels: {version: v1}}
  - {address: 127.0.0.2, ports: {http: 9002}, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1beta1
kind: DestinationRule
metadata: {name: echo, namespace: default}
spec:
  host: echo.mesh.local
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo, namespace: default}
spec:
  hosts: [echo.example.com]
  gateways: [gw]
  http:
  - match: [{headers: {end-user: {exact: jason}}}]
    route: [{destination: {host: echo.mesh.local, subset: v2}}]
  - route:
    - {destination: {host: echo.mesh.local, subset: v1}, weight: 80}
    - {destination: {host: echo.mesh.local, subset: v2}, weight: 20}
"""

GATEWAY = ProxyNode("router~10.0.0.1~gw-1.default~default.svc.cluster.local", labels={"istio": "ingressgateway"})


def config(text: str) -> MeshConfig:
    return MeshConfig(parse_documents(text, "test.yaml"))


def as_dict(msg) -> dict:
    return json_format.MessageToDict(msg)


def test_gateway_gets_listener_route_config_clusters_and_endpoints():
    snap = translate(config(BASIC), GATEWAY)
    assert set(snap[LISTENER]) == {"127.0.0.1_8080"}
    assert set(snap[ROUTE]) == {"http.8080"}
    assert set(snap[CLUSTER]) == {"outbound|80||echo.mesh.local", "outbound|80|v1|echo.mesh.local",
                                  "outbound|80|v2|echo.mesh.local"}
    assert set(snap[ENDPOINT]) == set(snap[CLUSTER])


def test_listener_binds_loopback_by_default_and_options_change_it():
    lis = translate(config(BASIC), GATEWAY)[LISTENER]["127.0.0.1_8080"]
    assert lis.address.socket_address.address == "127.0.0.1"
    assert lis.address.socket_address.port_value == 8080
    other = translate(config(BASIC), GATEWAY, TranslateOptions(bind_address="0.0.0.0"))[LISTENER]
    assert set(other) == {"0.0.0.0_8080"}


def test_hcm_reads_rds_over_ads_and_chain_ends_with_router():
    lis = as_dict(translate(config(BASIC), GATEWAY)[LISTENER]["127.0.0.1_8080"])
    hcm = lis["filterChains"][0]["filters"][0]["typedConfig"]
    assert hcm["statPrefix"] == "outbound_127.0.0.1_8080"
    assert hcm["rds"] == {"configSource": {"ads": {}, "resourceApiVersion": "V3"}, "routeConfigName": "http.8080"}
    # cors first, then the seams' filters (authn, grpc_web, wasm_plugins); the tail is fixed.
    names = [f["name"] for f in hcm["httpFilters"]]
    assert names[0] == "envoy.filters.http.cors"
    assert names[-2:] == ["envoy.filters.http.fault", "envoy.filters.http.router"]


def test_virtual_host_per_host_and_port_with_both_domains():
    rc = translate(config(BASIC), GATEWAY)[ROUTE]["http.8080"]
    assert [(vh.name, list(vh.domains)) for vh in rc.virtual_hosts] == [
        ("echo.example.com:8080", ["echo.example.com", "echo.example.com:8080"])]


def test_header_match_and_weighted_subsets():
    routes = as_dict(translate(config(BASIC), GATEWAY)[ROUTE]["http.8080"])["virtualHosts"][0]["routes"]
    assert routes[0]["match"] == {"prefix": "/", "headers": [{"name": "end-user", "stringMatch": {"exact": "jason"}}]}
    assert routes[0]["route"]["cluster"] == "outbound|80|v2|echo.mesh.local"
    assert routes[1]["route"]["weightedClusters"]["clusters"] == [
        {"name": "outbound|80|v1|echo.mesh.local", "weight": 80},
        {"name": "outbound|80|v2|echo.mesh.local", "weight": 20}]


def test_subset_endpoints_are_filtered_by_labels():
    snap = translate(config(BASIC), GATEWAY)
    def addrs(name):
        cla = snap[ENDPOINT][name]
        return sorted((e.endpoint.address.socket_address.address, e.endpoint.address.socket_address.port_value)
                      for loc in cla.endpoints for e in loc.lb_endpoints)
    assert addrs("outbound|80||echo.mesh.local") == [("127.0.0.1", 9001), ("127.0.0.2", 9002)]
    assert addrs("outbound|80|v1|echo.mesh.local") == [("127.0.0.1", 9001)]
    assert addrs("outbound|80|v2|echo.mesh.local") == [("127.0.0.2", 9002)]
    c = snap[CLUSTER]["outbound|80|v2|echo.mesh.local"]
    assert as_dict(c)["type"] == "EDS"
    assert c.eds_cluster_config.service_name == "outbound|80|v2|echo.mesh.local"
    assert c.eds_cluster_config.eds_config.HasField("ads")


def test_gateway_not_selected_by_node_labels_gives_no_listener():
    snap = translate(config(BASIC), ProxyNode("router~x~other~default", labels={"istio": "egressgateway"}))
    assert snap[LISTENER] == {} and snap[ROUTE] == {}
    assert snap[CLUSTER]                     # clusters are still the whole mesh's, as istiod sends them


def test_translation_is_shared_between_nodes_with_one_routing_key():
    cfg, translator = config(BASIC), Translator()
    a = translator.translate(cfg, GATEWAY)
    b = translator.translate(cfg, ProxyNode("router~10.0.0.2~gw-2.default~default.svc.cluster.local",
                                 labels={"istio": "ingressgateway"}))
    assert a[ROUTE]["http.8080"] is b[ROUTE]["http.8080"]
    assert a[CLUSTER] == b[CLUSTER] and a is not b


def test_spans_for_each_translation_with_cache_and_resource_counts():
    from mcp26.xds.telemetry import Telemetry
    telemetry = Telemetry()                         # the tracer it is given, not a process-wide one
    cfg, translator = config(BASIC), Translator(tracer=telemetry.tracer)
    translator.translate(cfg, GATEWAY)
    translator.translate(cfg, ProxyNode("router~10.0.0.3~gw-3.default~default.svc.cluster.local",
                             labels={"istio": "ingressgateway"}))
    spans = [s for s in telemetry.recent_spans("xds.translate.node")
             if s["attributes"]["xds.node.id"] in (GATEWAY.id, "router~10.0.0.3~gw-3.default~default.svc.cluster.local")]
    first, second = spans[-2:]
    assert first["attributes"]["xds.translate.routes_cached"] is False
    assert second["attributes"]["xds.translate.routes_cached"] is True
    assert second["attributes"]["xds.resources.Cluster"] == 3
    assert second["attributes"]["xds.resources.Listener"] == 1
    assert telemetry.recent_spans("xds.translate.routes")        # the cold build is its own span
