"""Seam: the grpc_web filter, so browsers' gRPC-Web calls reach gRPC backends.

Envoy's envoy.filters.http.grpc_web turns a gRPC-Web request
(application/grpc-web[-text][+proto], over HTTP/1.1 or HTTP/2) into gRPC
(application/grpc over HTTP/2, `te: trailers`) and folds the response's
trailers back into the body as the final frame. Requests that are not
gRPC-Web pass through untouched, so, as istiod does, every HTTP connection
manager of a gateway or sidecar gets it; proxyless gRPC does not implement it.

Its place in the chain (see xds.translate): after authn and the Wasm
header contract -- which therefore see the original request and stamp the
L6->L7 headers and the QoS class on it as on any other -- and before cors,
fault and router. The route's cluster must speak HTTP/2 upstream: the
translator does that for ServiceEntry ports of protocol GRPC, GRPC-WEB and
HTTP2 (clusters.py, explicit_http_config.http2_protocol_options).

A browser on another origin also needs CORS: the VirtualService's
`corsPolicy` (translated in routes.py) must allow the request headers
gRPC-Web clients send and expose grpc-status/grpc-message, which a
trailers-only error carries as headers; see xds-server/console/README.md.

Before grpc_web, a Lua filter (grpc_web_frames.lua) answers a gRPC-Web body
that is not whole frames with INVALID_ARGUMENT: upstreams may wait forever
on one (grpcio's asyncio server does), and the caller with them. A body whose
content-length says its message is over MAX_REQUEST_MESSAGE is answered
RESOURCE_EXHAUSTED at once. What the filter cannot check (no content-length:
chunked HTTP/1.1 or h2c; over FRAMES_CHECK_LIMIT) streams through, and the
HCM's stream idle timeout (listeners.py) bounds a stall on either side.
"""
from __future__ import annotations

import os

from envoy.extensions.filters.http.grpc_web.v3 import grpc_web_pb2
from envoy.extensions.filters.http.lua.v3 import lua_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from google.protobuf import any_pb2

from mcp26.mesh.resources import MeshConfig
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.model.type_urls import Snapshot
from mcp26.xds.translate.overlay import Overlay
from mcp26.xds.translate.phases import Phase

GRPC_WEB_FILTER = "envoy.filters.http.grpc_web"
FRAMES_FILTER = "mcp.grpc_web.frames"          # a Lua filter; named apart from other Lua uses
FRAMES_CHECK_LIMIT = 1 << 20                   # Envoy's default per-connection buffer limit
# The largest request message a gRPC-Web body may declare (gRPC's default
# max_receive_message_length): above it the gateway answers RESOURCE_EXHAUSTED
# from the headers alone, before taking any of the body.
MAX_REQUEST_MESSAGE = 4 << 20
_LUA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "grpc_web_frames.lua")


def _filter(name: str, config) -> hcm_pb2.HttpFilter:
    typed = any_pb2.Any()
    typed.Pack(config)
    return hcm_pb2.HttpFilter(name=name, typed_config=typed)


def grpc_web_filter() -> hcm_pb2.HttpFilter:
    return _filter(GRPC_WEB_FILTER, grpc_web_pb2.GrpcWeb())


def _frames_source() -> str:
    with open(_LUA, encoding="utf-8") as f:
        return (f.read().replace("__LIMIT__", str(FRAMES_CHECK_LIMIT))
                .replace("__MAX_MESSAGE__", str(MAX_REQUEST_MESSAGE)))


FRAMES_SOURCE = _frames_source()        # the package's own Lua, read once at import: translation reads no file


def frames_filter() -> hcm_pb2.HttpFilter:
    lua = lua_pb2.Lua()
    lua.default_source_code.inline_string = FRAMES_SOURCE
    return _filter(FRAMES_FILTER, lua)


def http_filters(config: MeshConfig, node: ProxyNode, port: int, phase: Phase) -> list:
    """[frames check, grpc_web] in the PROTOCOL phase of every HTTP connection
    manager of an Envoy (gateway or sidecar)."""
    if node.kind == "grpc" or phase is not Phase.PROTOCOL:
        return []
    return [frames_filter(), grpc_web_filter()]


def resources(config: MeshConfig, node: ProxyNode, overlay: Overlay) -> Snapshot:
    """Nothing extra: the filter needs no cluster or extension config of its own."""
    return {}
