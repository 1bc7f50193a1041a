"""Seam: the grpc_web filter for gRPC-Web clients reaching gRPC backends.

Owner: the gRPC-Web engineer. Until filled, returning nothing is the correct
behaviour; this is a seam, not a feature. See the protocol in
`xds_server.translate`.
"""
from __future__ import annotations

from mesh.config import MeshConfig
from xds_server.types import ProxyNode, Snapshot


def http_filters(config: MeshConfig, node: ProxyNode, port: int) -> list:
    """HttpFilters (envoy.filters.http.grpc_web, ...) for the HCM of `port`; after wasm_plugins."""
    return []


def resources(config: MeshConfig, node: ProxyNode) -> Snapshot:
    """Extra resources merged into the node's snapshot."""
    return {}
