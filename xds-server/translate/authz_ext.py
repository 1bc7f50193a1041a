"""CUSTOM AuthorizationPolicy providers -> envoy.filters.http.ext_authz, as
istiod builds them (istio/istio pilot/pkg/security/authz/builder/extauthz.go).

Istio reads providers from MeshConfig `extensionProviders`; there is no
MeshConfig here, so a provider is declared where the policies are: the
annotation PROVIDER_ANNOTATION on an AuthorizationPolicy holds one
`extensionProviders` entry, as YAML or JSON, in MeshConfig's own shape:

    metadata:
      annotations:
        mcp-mesh.io/extension-provider: |
          name: ext-authz
          envoyExtAuthzHttp:
            service: authz.example.svc.cluster.local    # or ns/host
            port: 9000
            pathPrefix: /check
            includeRequestHeadersInCheck: [x-user]
            failOpen: false

A CUSTOM policy names it in `spec.provider.name`. Policies in the root
namespace are read first, then by namespace/name; the first definition of a
name wins. `service`/`port` must be a ServiceEntry's host and port (the
cluster `outbound|PORT||HOST` ext_authz calls). An undefined or invalid
provider makes the policy's rules DENY (Istio's `-deny-due-to-bad-CUSTOM-action`).
"""
from __future__ import annotations

import yaml
from google.protobuf import duration_pb2
from envoy.config.core.v3 import config_source_pb2, grpc_service_pb2, http_uri_pb2
from envoy.extensions.filters.http.ext_authz.v3 import ext_authz_pb2 as ext
from envoy.type.matcher.v3 import metadata_pb2, string_pb2, value_pb2
from envoy.type.v3 import http_status_pb2

from mcp26.mesh import hosts
from mcp26.mesh.resources import MeshConfig
from mcp26.xds.translate.index import ROOT_NAMESPACE
from mcp26.xds.translate.names import cluster_name

PROVIDER_ANNOTATION = "mcp-mesh.io/extension-provider"
EXT_AUTHZ_PREFIX = "istio-ext-authz"
SHADOW_EFFECTIVE_POLICY_ID = "istio_ext_authz_shadow_effective_policy_id"
RBAC_FILTER = "envoy.filters.http.rbac"


class ProviderError(ValueError):
    pass


def parse_provider(text: str) -> dict:
    """The annotation's value as a dict with a name and one known provider kind."""
    try:
        p = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ProviderError(f"not YAML or JSON: {e}") from None
    if not isinstance(p, dict) or not isinstance(p.get("name"), str) or not p["name"]:
        raise ProviderError("must be a mapping with a non-empty `name`")
    kinds = [k for k in ("envoyExtAuthzHttp", "envoyExtAuthzGrpc") if k in p]
    others = sorted(set(p) - {"name", "envoyExtAuthzHttp", "envoyExtAuthzGrpc"})
    if len(kinds) != 1 or others:
        raise ProviderError("must hold exactly one of envoyExtAuthzHttp, envoyExtAuthzGrpc besides `name`"
                            + (f" (unknown: {', '.join(others)})" if others else ""))
    if not isinstance(p[kinds[0]], dict):
        raise ProviderError(f"{kinds[0]} must be a mapping")
    return p


def providers(config: MeshConfig) -> dict[str, dict]:
    """name -> provider entry, root namespace first, then namespace/name; first wins."""
    pols = sorted(config.of_kind("AuthorizationPolicy"),
                  key=lambda r: (r.namespace != ROOT_NAMESPACE, r.namespace, r.name))
    out: dict[str, dict] = {}
    for r in pols:
        text = (r.annotations or {}).get(PROVIDER_ANNOTATION)
        if text is None:
            continue
        try:
            p = parse_provider(text)
        except ProviderError:
            continue    # validation reports it
        out.setdefault(p["name"], p)
    return out


def _headers(patterns) -> string_pb2.ListStringMatcher | None:
    if not patterns:
        return None
    out = string_pb2.ListStringMatcher()
    for h in patterns:
        if h.startswith("*"):
            out.patterns.add(suffix=h[1:], ignore_case=True)
        elif h.endswith("*"):
            out.patterns.add(prefix=h[:-1], ignore_case=True)
        else:
            out.patterns.add(exact=h, ignore_case=True)
    return out


def _lookup_cluster(config: MeshConfig, service: str, port: int) -> tuple[str, str]:
    """model.LookupCluster: `ns/host` or `host`, a ServiceEntry host declaring `port`."""
    ns, _, host = service.rpartition("/")
    for se in config.of_kind("ServiceEntry"):
        if ns and se.namespace != ns:
            continue
        for h in se.spec.get("hosts") or []:
            if hosts.resolve_short_name(h, se.namespace) == host.lower() and \
                    any(p.get("number") == port for p in se.spec.get("ports") or []):
                return host, cluster_name(host, port)
    raise ProviderError(f"no ServiceEntry declares {service} port {port}")


def _status(text) -> http_status_pb2.HttpStatus | None:
    if text in (None, ""):
        return None
    try:
        code = int(text)
    except ValueError:
        raise ProviderError(f"invalid statusOnError {text!r}") from None
    if code not in http_status_pb2.StatusCode.values() or code == 0:
        raise ProviderError(f"unsupported statusOnError {text}")
    return http_status_pb2.HttpStatus(code=code)


def _timeout(text) -> duration_pb2.Duration:
    d = duration_pb2.Duration(seconds=600)
    if text:
        d.FromJsonString(str(text))
    return d


def ext_authz(config: MeshConfig, provider: dict) -> ext.ExtAuthz:
    """The ext_authz filter for `provider`; ProviderError where istiod would fail it."""
    kind = "envoyExtAuthzHttp" if "envoyExtAuthzHttp" in provider else "envoyExtAuthzGrpc"
    c = provider[kind]
    port = c.get("port")
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise ProviderError(f"port must be in the range [1, 65535], found: {port}")
    host, cluster = _lookup_cluster(config, str(c.get("service") or ""), port)
    out = ext.ExtAuthz(failure_mode_allow=bool(c.get("failOpen", False)),
                       transport_api_version=config_source_pb2.V3)
    status = _status(c.get("statusOnError"))
    if status:
        out.status_on_error.CopyFrom(status)
    body = c.get("includeRequestBodyInCheck")
    if body:
        out.with_request_body.max_request_bytes = int(body.get("maxRequestBytes", 0))
        out.with_request_body.allow_partial_message = bool(body.get("allowPartialMessage", False))
        out.with_request_body.pack_as_bytes = bool(body.get("packAsBytes", False))
    if kind == "envoyExtAuthzGrpc":
        out.grpc_service.CopyFrom(grpc_service_pb2.GrpcService(
            envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=cluster, authority=host),
            timeout=_timeout(c.get("timeout"))))
        return out
    prefix = c.get("pathPrefix") or ""
    if prefix and not prefix.startswith("/"):
        raise ProviderError(f"pathPrefix must begin with `/`, found: {prefix!r}")
    for f in ("includeRequestHeadersInCheck", "includeHeadersInCheck", "headersToDownstreamOnDeny",
              "headersToDownstreamOnAllow", "headersToUpstreamOnAllow"):
        if "*" in (c.get(f) or []):
            raise ProviderError(f'a single wildcard ("*") is not supported, change it to either prefix or '
                                f'suffix match: {f}')
    svc = out.http_service
    svc.path_prefix = prefix
    svc.server_uri.CopyFrom(http_uri_pb2.HttpUri(uri=f"http://{host}", cluster=cluster,
                                                 timeout=_timeout(c.get("timeout"))))
    allowed = _headers(c.get("includeRequestHeadersInCheck")) or _headers(c.get("includeHeadersInCheck"))
    if allowed:
        out.allowed_headers.CopyFrom(allowed)
    for k in sorted(c.get("includeAdditionalHeadersInCheck") or {}):
        svc.authorization_request.headers_to_add.add(key=k, value=str(c["includeAdditionalHeadersInCheck"][k]))
    resp = {"allowed_upstream_headers": "headersToUpstreamOnAllow",
            "allowed_client_headers": "headersToDownstreamOnDeny",
            "allowed_client_headers_on_success": "headersToDownstreamOnAllow"}
    for field, key in resp.items():
        m = _headers(c.get(key))
        if m:
            getattr(svc.authorization_response, field).CopyFrom(m)
    return out


def enabled_for(provider_name: str) -> metadata_pb2.MetadataMatcher:
    """ext_authz runs only when the shadow RBAC before it matched one of this
    provider's policies (their names start with the prefix)."""
    m = metadata_pb2.MetadataMatcher(filter=RBAC_FILTER, value=value_pb2.ValueMatcher(
        string_match=string_pb2.StringMatcher(prefix=f"{EXT_AUTHZ_PREFIX}-{provider_name}")))
    m.path.add(key=SHADOW_EFFECTIVE_POLICY_ID)
    return m
