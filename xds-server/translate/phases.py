"""The phases of the HTTP filter chain (http_filters.py orders them).

Istio's WasmPlugin phases -- AUTHN (before Istio's authentication filters),
AUTHZ (after authentication, before authorization), STATS (after
authorization), UNSPECIFIED_PHASE (last, before the router) -- plus PROTOCOL,
where protocol translation (gRPC-Web) sits, between authentication and the
later Wasm phases.
"""
from __future__ import annotations

import enum


class Phase(enum.Enum):
    AUTHN = "AUTHN"
    PROTOCOL = "PROTOCOL"
    AUTHZ = "AUTHZ"
    STATS = "STATS"
    UNSPECIFIED = "UNSPECIFIED_PHASE"
