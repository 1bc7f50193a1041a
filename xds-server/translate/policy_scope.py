"""Which policy resources apply to a proxy, as Istio selects workloads.

RequestAuthentication and WasmPlugin (and, later, PeerAuthentication and
AuthorizationPolicy) apply to a proxy when they sit in its namespace or in the
root namespace and their `selector.matchLabels` is a subset of its labels.
Resources with `targetRef(s)` are not translated (validation warns): they are
never widened to the whole namespace.

What more than one filter module reads lives here, so that no filter module
imports another: the RequestAuthentications that apply, and the claim ->
header mappings they declare (jwt_authn is configured from them, and the
header-contract Wasm filter re-derives those headers from verified metadata).
"""
from __future__ import annotations

from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.translate.index import ROOT_NAMESPACE

REQUEST_AUTHENTICATION = "RequestAuthentication"


def selects(res: Resource, node: ProxyNode) -> bool:
    """Namespace (or the root namespace) and selector.matchLabels."""
    if res.namespace not in (node.namespace, ROOT_NAMESPACE):
        return False
    if res.spec.get("targetRef") or res.spec.get("targetRefs"):
        return False
    want = ((res.spec.get("selector") or {}).get("matchLabels")) or {}
    return all(node.labels.get(k) == v for k, v in want.items())


def request_authentications(config: MeshConfig, node: ProxyNode) -> list[Resource]:
    """The RequestAuthentications that apply to `node`, in a stable order."""
    found = [r for r in config.of_kind(REQUEST_AUTHENTICATION) if selects(r, node)]
    return sorted(found, key=lambda r: (r.namespace, r.name))


def output_claims(config: MeshConfig, node: ProxyNode) -> list[tuple[str, str]]:
    """(claim, header) pairs of outputClaimToHeaders: the Wasm filter re-derives
    them from metadata, so a client's own copy of such a header never passes."""
    out = []
    for res in request_authentications(config, node):
        for rule in res.spec.get("jwtRules") or []:
            for c in rule.get("outputClaimToHeaders") or []:
                out.append((c["claim"], c["header"].lower()))
    return out
