"""Seam: request authentication (jwt_authn) from RequestAuthentication.

Owner: the header-contract engineer. Until filled, returning nothing is the
correct behaviour (no RequestAuthentication is translated yet); this is a
seam, not a feature. See the protocol in `xds_server.translate`.
"""
from __future__ import annotations

from mesh.config import MeshConfig
from xds_server.types import ProxyNode, Snapshot


def http_filters(config: MeshConfig, node: ProxyNode, port: int) -> list:
    """HttpFilters (jwt_authn, ...) for the HCM of `port`; placed first in the chain."""
    return []


def resources(config: MeshConfig, node: ProxyNode) -> Snapshot:
    """Extra resources (e.g. the JWKS cluster) merged into the node's snapshot."""
    return {}
