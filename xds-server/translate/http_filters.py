"""The HTTP connection manager's filter chain: which filter module gives
which filters, in which phase, in what order.

    cors
    AUTHN        Wasm plugins of phase AUTHN, then jwt_authn (RequestAuthentication)
    PROTOCOL     the gRPC-Web frame check, grpc_web
    AUTHZ        Wasm plugins of phase AUTHZ, then RBAC (AuthorizationPolicy: CUSTOM, AUDIT, DENY, ALLOW)
    STATS        Wasm plugins of phase STATS
    UNSPECIFIED  Wasm plugins without a phase, then ext_proc to an InferencePool's
                 endpoint picker (disabled but on routes to a pool)
    fault, router (the router last, as Envoy and gRPC require)

cors goes first so that preflights need no token and replies made by later
filters (a jwt_authn 401, a header-contract denial) still carry CORS headers.
grpc_web sits before the later Wasm phases so that on the response path the
header-contract filter sees gRPC trailers (grpc-status), not the gRPC-Web body
they are folded into.

A filter module exposes

    http_filters(config, node, port, phase) -> list[HttpFilter]
        its filters for the HCM serving `port` (a Gateway server port; for
        proxyless gRPC the service port of the API listener) in `phase`;
        [] for a phase it has nothing in.
    resources(config, node, overlay) -> Snapshot
        extra resources merged into the node's snapshot (a JWKS cluster, the
        ECDS TypedExtensionConfigs, which carry the overlay's Wasm bytes and
        class remaps: overlay.py). A name clash with a translated resource
        is an error, never a silent overwrite.

Both must be pure, deterministic functions of their arguments (no file, no
module-level state): the Translator caches listeners by the filters they
return. No filter module
imports another; what two of them read lives in a module of its own
(policy_scope.py). Adding a filter is one module and one line in CHAIN.
"""
from __future__ import annotations

from mcp26.mesh.diagnostics import ConfigError, Diagnostic
from mcp26.mesh.resources import MeshConfig
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.model.type_urls import Snapshot
from mcp26.xds.translate import authn, endpoint_picker, grpc_web, rbac, wasm_plugins
from mcp26.xds.translate.overlay import Overlay
from mcp26.xds.translate.phases import Phase

# Per phase, the modules asked for filters, in order.
CHAIN = (
    (Phase.AUTHN, (wasm_plugins, authn)),
    (Phase.PROTOCOL, (grpc_web,)),
    (Phase.AUTHZ, (wasm_plugins, rbac)),
    (Phase.STATS, (wasm_plugins,)),
    (Phase.UNSPECIFIED, (wasm_plugins,)),
    (Phase.UNSPECIFIED, (endpoint_picker,)),     # last: the picker sees the request as routed
)
FILTER_MODULES = tuple(dict.fromkeys(m for _, modules in CHAIN for m in modules))


def phase_filters(config: MeshConfig, node: ProxyNode, port: int) -> list:
    """The filters between cors and fault, phase by phase. Proxyless gRPC
    implements only a few HTTP filters (gRFC A39): the modules' filters
    (jwt_authn, Wasm, grpc_web) are Envoy-only."""
    if node.kind == "grpc":
        return []
    return [f for phase, modules in CHAIN for m in modules for f in m.http_filters(config, node, port, phase)]


def resources(config: MeshConfig, node: ProxyNode, overlay: Overlay, snapshot: Snapshot) -> None:
    """Merge every filter module's extra resources into `snapshot`."""
    for module in FILTER_MODULES:
        owner = module.__name__.rsplit(".", 1)[-1]
        for type_url, extra in (module.resources(config, node, overlay) or {}).items():
            target = snapshot.setdefault(type_url, {})
            for name, msg in extra.items():
                if name in target:
                    raise ConfigError([Diagnostic(
                        f"{owner} adds {type_url.rsplit('.', 1)[-1]} {name!r}, which translation already emits")])
                target[name] = msg
