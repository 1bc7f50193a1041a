"""A native ext_proc "processor" for the overhead benchmark: a second Envoy that
answers every ext_proc stream with one fixed message, the pick of `endpoint`
on the request headers, and ends the stream with grpc-status 0.

Envoy builds the whole answer in C++ without parsing the request, so a
gateway asking it measures what ext_proc itself costs per request on this
machine (the gateway's filter, a new gRPC stream, the hop to another process
and back), and nothing of Python: the floor under any processor, the picker
included. The gateway must ask for exactly one message (request headers, the
body NONE and nothing of the answer: ONE_MESSAGE_MODE): the stream ends with
the first answer.

How: the gRPC listener's grpc_http1_reverse_bridge sends the stream on as a
plain HTTP/1.1 request to an internal listener of the same Envoy (in memory,
no socket), whose direct_response is the framed message; the bridge adds the
grpc-status trailers on the way back. (A direct_response on the gRPC listener
itself is turned into a trailers-only gRPC answer that drops the message, by
Envoy's local-reply handling of gRPC requests: the gateway then goes on
without a pick, which the benchmark's landing check catches.) The inner
request is work a native processor would not do, so the row slightly
overstates what one costs.
"""
from __future__ import annotations

import base64
import struct

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from mcp26.mesh import endpoint_picker as epp

# The gateway's mode for the fixed processor and the null processor's comparable row.
ONE_MESSAGE_MODE = {**epp.LEAN_MODE, "request_body_mode": "NONE"}
PLAIN_TYPE = "application/x-protobuf"      # what the bridge expects of the inner answer
_HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_ROUTER = {"name": "envoy.filters.http.router", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}


def pick_message(endpoint: str) -> bytes:
    """The answer to the request headers as the picker gives it (header + envoy.lb), gRPC-framed."""
    out = pb.ProcessingResponse()
    opt = out.request_headers.response.header_mutation.set_headers.add()
    opt.header.key, opt.header.raw_value = epp.DESTINATION_ENDPOINT, endpoint.encode()
    out.dynamic_metadata.fields[epp.DESTINATION_NAMESPACE].struct_value.fields[
        epp.DESTINATION_ENDPOINT].string_value = endpoint
    msg = out.SerializeToString()
    return b"\0" + struct.pack(">I", len(msg)) + msg     # uncompressed, 4-byte big-endian length


def _listener(name: str, address: dict, codec: str, route: dict, filters: list[dict]) -> dict:
    hcm = {"@type": _HCM, "stat_prefix": name, "codec_type": codec, "http_filters": [*filters, _ROUTER],
           "route_config": {"virtual_hosts": [{"name": name, "domains": ["*"],
                                               "routes": [{"match": {"prefix": "/"}, **route}]}]}}
    return {"name": name, **address, "filter_chains": [{"filters": [
        {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}]}


def fixed_processor_bootstrap(port: int, endpoint: str) -> dict:
    """An Envoy answering ext_proc streams on 127.0.0.1:`port` (HTTP/2) with pick_message."""
    bridge = {"name": "envoy.filters.http.grpc_http1_reverse_bridge", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.grpc_http1_reverse_bridge.v3.FilterConfig",
        "content_type": PLAIN_TYPE, "withhold_grpc_frames": False}}
    answer = {"direct_response": {"status": 200, "body": {
                  "inline_bytes": base64.b64encode(pick_message(endpoint)).decode()}},
              "response_headers_to_add": [{"header": {"key": "content-type", "value": PLAIN_TYPE},
                                           "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]}
    inner = {"name": "fixed-answer", "type": "STATIC", "connect_timeout": "1s",
             "load_assignment": {"cluster_name": "fixed-answer", "endpoints": [{"lb_endpoints": [{"endpoint": {
                 "address": {"envoy_internal_address": {"server_listener_name": "fixed_answer"}}}}]}]}}
    outer_address = {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}
    return {
        "bootstrap_extensions": [{"name": "envoy.bootstrap.internal_listener", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener"}}],
        "static_resources": {
            "listeners": [
                _listener("fixed_processor", outer_address, "HTTP2", {"route": {"cluster": "fixed-answer"}}, [bridge]),
                _listener("fixed_answer", {"internal_listener": {}}, "HTTP1", answer, [])],
            "clusters": [inner]}}
