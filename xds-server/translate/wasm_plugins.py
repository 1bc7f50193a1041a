"""Seam: the Wasm header-contract filter from WasmPlugin, delivered via ECDS.

Owner: the header-contract engineer. Until filled, returning nothing is the
correct behaviour (no WasmPlugin is translated yet); this is a seam, not a
feature. See the protocol in `xds_server.translate`.
"""
from __future__ import annotations

from mesh.config import MeshConfig
from xds_server.types import ProxyNode, Snapshot


def http_filters(config: MeshConfig, node: ProxyNode, port: int) -> list:
    """HttpFilters (config_discovery pointing at ECDS) for the HCM of `port`; after authn."""
    return []


def resources(config: MeshConfig, node: ProxyNode) -> Snapshot:
    """Extra resources (the ECDS TypedExtensionConfig, ...) merged into the snapshot."""
    return {}
