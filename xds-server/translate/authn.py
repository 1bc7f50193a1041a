"""RequestAuthentication -> envoy.filters.http.jwt_authn, as istiod does it.

Every RequestAuthentication that applies to the proxy (its namespace, or the
root namespace; `selector.matchLabels` a subset of the node's labels) adds
one JWT provider per `jwtRules` entry. The requirement is Istio's: any one
provider's valid token, or no token at all (allow_missing) -- so an invalid,
expired, wrongly signed or wrong-audience token gets 401 and never reaches
the upstream, while a request without a token goes on (an AuthorizationPolicy
decides whether that is enough).

The verified payload goes to dynamic metadata (`payload_in_metadata`) where
the header-contract Wasm filter reads the claims: a client can send any
header, but cannot write metadata. `clear_route_cache` makes the router
re-select the route after claim headers are set.

`jwksUri` is fetched by Envoy through a cluster this module adds.
jwt_authn is this module's filter in the AUTHN phase (http_filters.py puts
AUTHN-phase WasmPlugins before it, Istio's order).
"""
from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from google.protobuf import duration_pb2
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import http_uri_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2
from envoy.extensions.access_loggers.filters.cel.v3.cel_pb2 import ExpressionFilter
from envoy.extensions.filters.http.jwt_authn.v3 import config_pb2 as jwt
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2

from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.mesh.header_contract import JWT_AUTHN_FILTER, JWT_PAYLOAD_METADATA_KEY
from mcp26.xds.model import type_urls
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.model.type_urls import Snapshot
from mcp26.xds.translate.overlay import Overlay
from mcp26.xds.translate.phases import Phase
from mcp26.xds.translate.policy_scope import request_authentications


def jwks_cluster_name(uri: str) -> str:
    u = urlsplit(uri)
    return f"jwks|{u.hostname}|{u.port or (443 if u.scheme == 'https' else 80)}"


def _jwks_cluster(uri: str) -> cluster_pb2.Cluster:
    u = urlsplit(uri)
    port = u.port or (443 if u.scheme == "https" else 80)
    name = jwks_cluster_name(uri)
    try:
        ipaddress.ip_address(u.hostname)
        kind = cluster_pb2.Cluster.STATIC
    except ValueError:
        kind = cluster_pb2.Cluster.LOGICAL_DNS
    c = cluster_pb2.Cluster(name=name, type=kind, connect_timeout=duration_pb2.Duration(seconds=5))
    lb = endpoint_components_pb2.LbEndpoint()
    lb.endpoint.address.socket_address.address = u.hostname
    lb.endpoint.address.socket_address.port_value = port
    c.load_assignment.cluster_name = name
    c.load_assignment.endpoints.add().lb_endpoints.append(lb)
    if u.scheme == "https":
        ctx = tls_pb2.UpstreamTlsContext(sni=u.hostname)
        c.transport_socket.name = "envoy.transport_sockets.tls"
        c.transport_socket.typed_config.Pack(ctx)
    return c


def _duration(text: str | None, default_s: int) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    if not text:
        d.seconds = default_s
        return d
    d.FromJsonString(str(text))
    return d


def provider_name(res: Resource, index: int) -> str:
    return f"{res.namespace}/{res.name}/{index}"


def _provider(rule: dict) -> jwt.JwtProvider:
    p = jwt.JwtProvider(issuer=rule["issuer"], audiences=list(rule.get("audiences") or []),
                        forward=bool(rule.get("forwardOriginalToken", False)),
                        payload_in_metadata=JWT_PAYLOAD_METADATA_KEY, clear_route_cache=True)
    if rule.get("jwks"):
        p.local_jwks.inline_string = rule["jwks"]
    elif rule.get("jwksUri"):
        uri = rule["jwksUri"]
        p.remote_jwks.http_uri.CopyFrom(http_uri_pb2.HttpUri(
            uri=uri, cluster=jwks_cluster_name(uri), timeout=_duration(rule.get("timeout"), 5)))
        p.remote_jwks.cache_duration.seconds = 300
        p.remote_jwks.async_fetch.SetInParent()      # fetch before the listener serves
        p.remote_jwks.retry_policy.num_retries.value = 3
    for h in rule.get("fromHeaders") or []:
        p.from_headers.add(name=h["name"], value_prefix=h.get("prefix", ""))
    p.from_params.extend(rule.get("fromParams") or [])
    p.from_cookies.extend(rule.get("fromCookies") or [])
    for c in rule.get("outputClaimToHeaders") or []:
        p.claim_to_headers.add(header_name=c["header"], claim_name=c["claim"])
    if rule.get("outputPayloadToHeader"):
        p.forward_payload_header = rule["outputPayloadToHeader"]
    return p


def jwt_authn_config(config: MeshConfig, node: ProxyNode) -> jwt.JwtAuthentication | None:
    resources = request_authentications(config, node)
    if not resources:
        return None
    cfg = jwt.JwtAuthentication(bypass_cors_preflight=True)
    names = []
    for res in resources:
        for i, rule in enumerate(res.spec.get("jwtRules") or []):
            name = provider_name(res, i)
            cfg.providers[name].CopyFrom(_provider(rule))
            names.append(name)
    if not names:
        return None
    # Istio's semantics: a valid token from any provider, or none at all.
    req = jwt.JwtRequirement()
    for n in names:
        req.requires_any.requirements.add(provider_name=n)
    req.requires_any.requirements.add().allow_missing.SetInParent()
    rule = cfg.rules.add()
    rule.match.prefix = "/"
    rule.requires.CopyFrom(req)
    return cfg


def http_filters(config: MeshConfig, node: ProxyNode, port: int, phase: Phase) -> list:
    """jwt_authn, in the AUTHN phase, when a RequestAuthentication applies."""
    cfg = jwt_authn_config(config, node) if phase is Phase.AUTHN else None
    if cfg is None:
        return []
    f = hcm.HttpFilter(name=JWT_AUTHN_FILTER)
    f.typed_config.Pack(cfg)
    return [f]


def bad_token_reply() -> hcm.LocalReplyConfig:
    """HCM local-reply mapping: every token jwt_authn rejects answers 401.

    jwt_authn answers a verified token for another audience with 403 (its
    JwtAudienceNotAllowed); to the mesh a token not meant for this service is
    an invalid token, so it becomes 401 with the RFC 6750 challenge like the
    others. Only jwt_authn's own replies are matched, by their details.
    """
    expr = ExpressionFilter(expression="response.code == 403 && "
                                       "response.code_details.startsWith('jwt_authn_access_denied')")
    mapper = hcm.ResponseMapper()
    mapper.filter.extension_filter.name = "envoy.access_loggers.extension_filters.cel"
    mapper.filter.extension_filter.typed_config.Pack(expr)
    mapper.status_code.value = 401
    challenge = mapper.headers_to_add.add()
    challenge.header.key = "www-authenticate"
    challenge.header.value = 'Bearer realm="mcp-mesh", error="invalid_token"'
    return hcm.LocalReplyConfig(mappers=[mapper])


def resources(config: MeshConfig, node: ProxyNode, overlay: Overlay) -> Snapshot:
    """The clusters jwt_authn fetches jwksUri through."""
    clusters = {}
    for res in request_authentications(config, node):
        for rule in res.spec.get("jwtRules") or []:
            uri = rule.get("jwksUri")
            if uri and not rule.get("jwks"):
                c = _jwks_cluster(uri)
                clusters[c.name] = c
    return {type_urls.CLUSTER: clusters} if clusters else {}
