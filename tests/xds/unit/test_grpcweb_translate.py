"""The grpc_web seam in translation: filter placement, HTTP/2 upstream, CORS for the example."""
import os

from envoy.extensions.filters.http.cors.v3 import cors_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2

from mcp26.mesh import headers as H
from mcp26.mesh.change_set import load_config
from mcp26.xds.translate import translate
from mcp26.xds.model.type_urls import CLUSTER, LISTENER, ROUTE
from mcp26.xds.model.node import ProxyNode
from harness.paths import CONSOLE

EXAMPLE = str(CONSOLE / "examples")
GATEWAY = ProxyNode("router~127.0.0.1~gw.default~default.svc.cluster.local", labels={"istio": "ingressgateway"})
PROXYLESS = ProxyNode("grpc-client", kind="grpc")


def _hcm(listener) -> hcm_pb2.HttpConnectionManager:
    hcm = hcm_pb2.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(hcm)
    return hcm


def test_gateway_chain_has_cors_before_grpc_web_and_router_last():
    snap = translate(load_config(EXAMPLE), GATEWAY)
    names = [f.name for f in _hcm(snap[LISTENER]["127.0.0.1_8080"]).http_filters]
    assert "envoy.filters.http.grpc_web" in names
    # cors first: gateway-made replies (framing errors, 401s) still carry CORS headers.
    assert names.index("envoy.filters.http.cors") < names.index("envoy.filters.http.grpc_web")
    assert names[-1] == "envoy.filters.http.router"


def test_grpc_service_port_cluster_speaks_http2_upstream():
    cluster = translate(load_config(EXAMPLE), GATEWAY)[CLUSTER]["outbound|8001||inference.mesh.local"]
    opts = cluster.typed_extension_protocol_options["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    unpacked = http_protocol_options_pb2.HttpProtocolOptions()
    opts.Unpack(unpacked)
    assert unpacked.explicit_http_config.HasField("http2_protocol_options")


def test_example_cors_policy_covers_what_grpc_web_clients_need():
    rc = translate(load_config(EXAMPLE), GATEWAY)[ROUTE]["http.8080"]
    route = rc.virtual_hosts[0].routes[0]
    policy = cors_pb2.CorsPolicy()
    route.typed_per_filter_config["envoy.filters.http.cors"].Unpack(policy)
    allowed = set(policy.allow_headers.split(","))
    exposed = set(policy.expose_headers.split(","))
    assert set(H.GRPC_WEB_ALLOW_HEADERS) | {H.LLM_PRIORITY} <= allowed
    assert set(H.GRPC_WEB_EXPOSE_HEADERS) <= exposed


def test_proxyless_grpc_gets_no_grpc_web_filter():
    snap = translate(load_config(EXAMPLE), PROXYLESS)
    for lis in snap[LISTENER].values():
        hcm = hcm_pb2.HttpConnectionManager()
        lis.api_listener.api_listener.Unpack(hcm)
        assert "envoy.filters.http.grpc_web" not in [f.name for f in hcm.http_filters]
