"""gRPC-Web through the real Envoy (static bootstrap: grpc_web, cors, router) to a real grpcio server.

The upstream is a generic grpcio server (raw bytes in and out), so these tests
pin Envoy's translation and the test client's framing without depending on
any one proto: unary, server-streaming delivered incrementally, errors as
grpc-status, a malformed frame answered with a gRPC error rather than a hang.
"""
import base64
import json
import time
from concurrent import futures

import grpc
import pytest
from google.protobuf import json_format

from mcp26.mesh.resources import MeshConfig
from mcp26.xds.translate import Phase, grpc_web
from mcp26.xds.model.node import ProxyNode

from mcp26.demo.stack.envoy import Envoy
from mcp26.demo.stack.grpcweb import GRPC_WEB_TEXT, GrpcWebClient, encode_frame
from mcp26.demo.stack.ports import free_port

pytestmark = pytest.mark.e2e

ORIGIN = "http://127.0.0.1:9"  # a page's origin; never contacted
STREAM_GAP_S = 0.3


def _unary(request: bytes, context) -> bytes:
    context.set_trailing_metadata([("x-seen-keys", ",".join(sorted(k for k, _ in context.invocation_metadata())))])
    return request[::-1]


def _stream(request: bytes, context):
    for i in range(request[0]):
        if i:
            time.sleep(STREAM_GAP_S)
        yield bytes([i]) * 3


def _fail(request: bytes, context):
    context.abort(grpc.StatusCode.NOT_FOUND, "model 'ghost' is not loaded (ü)")


@pytest.fixture(scope="module")
def upstream():
    server = grpc.server(futures.ThreadPoolExecutor(4), options=[("grpc.max_receive_message_length", 8 << 20)])
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("test.Echo", {
        "Unary": grpc.unary_unary_rpc_method_handler(_unary),
        "Stream": grpc.unary_stream_rpc_method_handler(_stream),
        "Fail": grpc.unary_unary_rpc_method_handler(_fail),
    })])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port
    server.stop(0)


def _bootstrap(listen: int, upstream_port: int) -> dict:
    cors = {"@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.CorsPolicy",
            "allow_origin_string_match": [{"exact": ORIGIN}],
            "allow_methods": "POST, OPTIONS",
            "allow_headers": "content-type,x-grpc-web,x-user-agent,grpc-timeout",
            "expose_headers": "grpc-status,grpc-message", "max_age": "600"}
    hcm = {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
           "stat_prefix": "gw", "route_config": {"virtual_hosts": [{
               "name": "grpc", "domains": ["*"], "typed_per_filter_config": {"envoy.filters.http.cors": cors},
               "routes": [{"match": {"prefix": "/test.Echo/"}, "route": {"cluster": "echo", "timeout": "5s"}}]}]},
           # What the control plane's grpc_web seam emits, then cors and router.
           "http_filters": [json.loads(json_format.MessageToJson(f, preserving_proto_field_name=True))
                            for f in grpc_web.http_filters(MeshConfig(), ProxyNode("gw"), listen, Phase.PROTOCOL)] + [
               {"name": "envoy.filters.http.cors", "typed_config": {
                   "@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors"}},
               {"name": "envoy.filters.http.router", "typed_config": {
                   "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}
    return {"static_resources": {
        "listeners": [{"name": "gw", "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen}},
                       "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                       "typed_config": hcm}]}]}],
        "clusters": [{"name": "echo", "type": "STATIC", "connect_timeout": "1s",
                      "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                          "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                          "explicit_http_config": {"http2_protocol_options": {}}}},
                      "load_assignment": {"cluster_name": "echo", "endpoints": [{"lb_endpoints": [{"endpoint": {
                          "address": {"socket_address": {"address": "127.0.0.1", "port_value": upstream_port}}}}]}]}}]}}


@pytest.fixture(scope="module")
def gateway(upstream):
    listen = free_port()
    with Envoy(_bootstrap(listen, upstream)):
        yield listen


def test_unary_is_translated_to_grpc_and_back(gateway):
    res = GrpcWebClient("127.0.0.1", gateway).unary("/test.Echo/Unary", b"hello")
    assert res.http_status == 200 and res.headers["content-type"].startswith("application/grpc-web")
    assert res.messages == [b"olleh"]
    assert res.status == 0
    # grpcio only accepts HTTP/2 application/grpc, so it answering at all shows
    # the translation; x-request-id shows Envoy was on the path.
    assert "x-request-id" in res.trailers["x-seen-keys"].split(",")


def test_text_variant_round_trips(gateway):
    res = GrpcWebClient("127.0.0.1", gateway, text=True).unary("/test.Echo/Unary", b"\x00\xffbinary")
    assert res.headers["content-type"].startswith(GRPC_WEB_TEXT.split("+")[0])
    assert res.messages == [b"yranib\xff\x00"] and res.status == 0


def test_server_streaming_arrives_message_by_message(gateway):
    client = GrpcWebClient("127.0.0.1", gateway)
    res = client.call("/test.Echo/Stream", [bytes([4])])
    assert res.messages == [bytes([i]) * 3 for i in range(4)] and res.status == 0
    # Delivered as produced, not buffered to the end by Envoy.
    gaps = [b - a for a, b in zip(res.arrivals, res.arrivals[1:])]
    assert min(gaps) > STREAM_GAP_S * 0.5, gaps


def test_error_is_a_readable_grpc_status(gateway):
    res = GrpcWebClient("127.0.0.1", gateway).unary("/test.Echo/Fail", b"x")
    assert res.http_status == 200
    assert res.status == grpc.StatusCode.NOT_FOUND.value[0]
    assert res.message == "model 'ghost' is not loaded (ü)"


@pytest.mark.parametrize("body, why", [
    (b"\x00\x00\x00\x00\x64abc", "frame at offset 0 says 100 bytes, 3 follow"),
    (encode_frame(b"ok") + b"\x00\x00\x00", "body ends inside a frame header (3 of 5 bytes at offset 7)"),
    (b"", "no message frame"),
    (encode_frame(b"grpc-status: 0\r\n", 0x80), "has flags 0x80"),   # trailers are the server's
    (encode_frame(b"x", 0x42), "has flags 0x42"),
], ids=["truncated", "short-header", "empty", "trailer-frame", "reserved-flags"])
@pytest.mark.parametrize("text", [False, True], ids=["binary", "text"])
def test_malformed_body_is_answered_at_the_gateway_not_left_hanging(gateway, body, why, text):
    client = GrpcWebClient("127.0.0.1", gateway, timeout=8, text=text)
    started = time.monotonic()
    res = client.call("/test.Echo/Unary", raw_body=base64.b64encode(body) if text else body)
    assert time.monotonic() - started < 8
    assert res.http_status == 200 and res.messages == []
    assert res.status == grpc.StatusCode.INVALID_ARGUMENT.value[0], res
    assert res.message.startswith("malformed gRPC-Web request: ") and why in res.message, res.message


def test_well_framed_but_compressed_without_encoding_gets_the_upstreams_error(gateway):
    res = GrpcWebClient("127.0.0.1", gateway, timeout=8).call("/test.Echo/Unary", raw_body=encode_frame(b"x", 0x01))
    assert res.status not in (None, 0, grpc.StatusCode.INVALID_ARGUMENT.value[0]), res  # grpcio's own answer


def test_body_over_the_check_limit_streams_through_unchecked(gateway):
    big = bytes(range(256)) * ((grpc_web.FRAMES_CHECK_LIMIT + 4096) // 256)
    res = GrpcWebClient("127.0.0.1", gateway, timeout=15).unary("/test.Echo/Unary", big)
    assert res.status == 0, res.message
    assert res.messages == [big[::-1]]


def test_invalid_base64_text_body_gets_an_error_not_a_hang(gateway):
    res = GrpcWebClient("127.0.0.1", gateway, text=True, timeout=8).call(
        "/test.Echo/Unary", raw_body=b"@@@@not-base64@@@@")
    # Envoy's grpc_web filter answers itself, as a gRPC error.
    assert res.http_status == 400
    assert res.status == grpc.StatusCode.INTERNAL.value[0]
    assert "invalid base64" in res.message


def test_cors_preflight_allows_grpc_web_headers(gateway):
    status, headers = GrpcWebClient("127.0.0.1", gateway).preflight(
        "/test.Echo/Unary", ORIGIN, "content-type,x-grpc-web,x-user-agent")
    assert status == 200
    assert headers["access-control-allow-origin"] == ORIGIN
    allowed = {h.strip() for h in headers["access-control-allow-headers"].split(",")}
    assert {"content-type", "x-grpc-web", "x-user-agent"} <= allowed
    exposed = {h.strip() for h in headers["access-control-expose-headers"].split(",")}
    assert {"grpc-status", "grpc-message"} <= exposed
