"""Validator for AuthorizationPolicy (security.istio.io v1/v1beta1), after
istio/istio pkg/config/validation (ValidateAuthorizationPolicy) and
pkg/config/security (ValidateAttribute, CheckServiceAccount, ...).

Beyond Istio: a `*` anywhere but at the start or end of a principal or
request principal is an error (istiod would match it literally, which is
never what was meant), and a CUSTOM policy's provider annotation
(`mcp-mesh.io/extension-provider`, there being no MeshConfig here) is
checked. Istio's warning that a DENY using only HTTP attributes denies all
traffic on TCP ports is kept.
"""
from __future__ import annotations

import ipaddress
import re
from typing import Iterator

import yaml

from mcp26.mesh.diagnostics import Diagnostic
from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.mesh.validation import validator
from mcp26.mesh.validation.report import Report, schema_report, semantic
from mcp26.mesh.validation.schema import Enum, Map, Obj

VERSIONS = ("security.istio.io/v1", "security.istio.io/v1beta1")
PROVIDER_ANNOTATION = "mcp-mesh.io/extension-provider"

_STRINGS = ["string"]
SOURCE_FIELDS = ("principals", "notPrincipals", "requestPrincipals", "notRequestPrincipals", "namespaces",
                 "notNamespaces", "ipBlocks", "notIpBlocks", "remoteIpBlocks", "notRemoteIpBlocks",
                 "serviceAccounts", "notServiceAccounts", "trustDomains", "notTrustDomains")
OPERATION_FIELDS = ("hosts", "notHosts", "ports", "notPorts", "methods", "notMethods", "paths", "notPaths")
TARGET_REF = Obj({"group": "string", "kind": "string", "name": "string", "namespace": "string"},
                 required=("kind", "name"))
AUTHORIZATION_POLICY = Obj({
    "selector": {"matchLabels": Map("string")},
    "targetRef": TARGET_REF, "targetRefs": [TARGET_REF],
    "action": Enum("ALLOW", "DENY", "AUDIT", "CUSTOM"),
    "provider": {"name": "string"},
    "rules": [{
        "from": [{"source": {f: _STRINGS for f in SOURCE_FIELDS}}],
        "to": [{"operation": {f: _STRINGS for f in OPERATION_FIELDS}}],
        "when": [Obj({"key": "string", "values": _STRINGS, "notValues": _STRINGS}, required=("key",))],
    }],
}, oneof=(("selector", "targetRef", "targetRefs"),))

# `when` keys (security.go ValidateAttribute); a key ending in [..] takes a name.
EXACT_KEYS = ("source.ip", "remote.ip", "source.namespace", "source.serviceAccount", "source.principal",
              "source.trustDomain", "request.auth.principal", "request.auth.audiences",
              "request.auth.presenter", "destination.ip", "destination.port", "connection.sni")
MAP_KEYS = ("request.headers", "request.auth.claims", "experimental.envoy.filters.")
IP_KEYS = ("source.ip", "remote.ip", "destination.ip")
# HTTP-only: a DENY rule that uses only these denies every TCP connection in scope.
TCP_SOURCE_FIELDS = ("principals", "notPrincipals", "ipBlocks", "notIpBlocks", "namespaces", "notNamespaces",
                     "remoteIpBlocks", "notRemoteIpBlocks", "serviceAccounts", "notServiceAccounts")
# Not supported with CUSTOM (istiod: "... is currently not supported with CUSTOM action").
CUSTOM_UNSUPPORTED_SOURCE = ("namespaces", "notNamespaces", "serviceAccounts", "notServiceAccounts",
                             "trustDomains", "notTrustDomains", "principals", "notPrincipals",
                             "requestPrincipals", "notRequestPrincipals")
CUSTOM_UNSUPPORTED_KEYS = ("source.namespace", "source.serviceAccount", "source.trustDomain", "source.principal")
_LITERAL = re.compile(r"^[a-zA-Z0-9\-._~%!$&'()+,;:@=]+$")   # a path template's literal segment
WILDCARD_ENDS_ONLY = ("principals", "notPrincipals", "requestPrincipals", "notRequestPrincipals")


@validator("AuthorizationPolicy")
def validate_authorization_policy(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    rep, errs = schema_report(res, VERSIONS, AUTHORIZATION_POLICY)
    rep.typed = not errs.errors
    yield from semantic(_rules, rep, res)


def _rules(rep: Report, res: Resource) -> None:
    spec = res.spec
    action = spec.get("action") or "ALLOW"
    rep.workload_selector("spec.selector.matchLabels", (spec.get("selector") or {}).get("matchLabels"))
    for ref in ("targetRef", "targetRefs"):
        if spec.get(ref):
            rep.warn(f"spec.{ref}", f"{ref} is not translated by this control plane: the policy applies to no "
                                    "proxy (use selector.matchLabels)")
    rules = spec.get("rules")
    if action == "CUSTOM":
        if not rules:
            rep.error("spec.rules", "CUSTOM action without `rules` is meaningless as it will never be triggered, "
                                    "add an empty rule `{}` if you want it be triggered for every request")
        elif not (spec.get("provider") or {}).get("name"):
            rep.error("spec.provider.name", "`provider.name` must not be empty")
    elif spec.get("provider") is not None:
        rep.error("spec.provider", f"`provider` must not be with non CUSTOM action, found {action}")
    if action == "DENY" and not rules:
        rep.error("spec.rules", "DENY action without `rules` is meaningless as it will never be triggered, "
                                "add an empty rule `{}` if you want it be triggered for every request")
    _provider_annotation(rep, res)
    for i, rule in enumerate(rules or []):
        _rule(rep, f"spec.rules[{i}]", rule or {}, action)


def _provider_annotation(rep: Report, res: Resource) -> None:
    text = (res.annotations or {}).get(PROVIDER_ANNOTATION)
    if text is None:
        return
    path = f"metadata.annotations.{PROVIDER_ANNOTATION}"
    try:
        p = yaml.safe_load(text)
    except yaml.YAMLError:
        p = None
    kinds = [k for k in ("envoyExtAuthzHttp", "envoyExtAuthzGrpc") if isinstance(p, dict) and k in p]
    if not isinstance(p, dict) or not p.get("name") or len(kinds) != 1 or set(p) - {"name", *kinds}:
        rep.error(path, "must be one MeshConfig extensionProviders entry: a `name` and exactly one of "
                        "envoyExtAuthzHttp, envoyExtAuthzGrpc")
        return
    c = p[kinds[0]] if isinstance(p[kinds[0]], dict) else {}
    if not c.get("service"):
        rep.error(path, f"{kinds[0]}.service must be set")
    if not isinstance(c.get("port"), int) or not 1 <= c["port"] <= 65535:
        rep.error(path, f"{kinds[0]}.port must be in the range [1, 65535], found: {c.get('port')}")
    status = c.get("statusOnError")
    if status not in (None, "") and not str(status).isdigit():
        rep.error(path, f"invalid statusOnError {status!r}")
    prefix = c.get("pathPrefix")
    if prefix and not str(prefix).startswith("/"):
        rep.error(path, f"pathPrefix must begin with `/`, found: {prefix!r}")


def _rule(rep: Report, p: str, rule: dict, action: str) -> None:
    from_exists = to_exists = tcp_from = tcp_to = False
    for j, f in enumerate(rule.get("from") or []):
        fp = f"{p}.from[{j}]"
        src = (f or {}).get("source")
        if src is None:
            rep.error(f"{fp}.source", "`from.source` must not be nil")
            continue
        from_exists = True
        if not any(src.get(k) for k in SOURCE_FIELDS):
            rep.error(f"{fp}.source", "`from.source` must not be empty")
        if any(src.get(k) for k in ("principals", "notPrincipals", "namespaces", "notNamespaces")) and \
                any(src.get(k) for k in ("serviceAccounts", "notServiceAccounts")):
            rep.error(f"{fp}.source", "cannot set serviceAccounts with namespaces or principals")
        for k in SOURCE_FIELDS:
            vals = src.get(k)
            if vals is None:
                continue
            vp = f"{fp}.source.{k}"
            _non_empty(rep, vp, vals)
            if k.lower().endswith("ipblocks"):
                _ips(rep, vp, vals)
            elif k in ("serviceAccounts", "notServiceAccounts"):
                _service_accounts(rep, vp, vals)
            elif k in ("trustDomains", "notTrustDomains"):
                _wildcards(rep, vp, vals, trust_domain=True)
            elif k in WILDCARD_ENDS_ONLY:
                _wildcards(rep, vp, vals)
            if action == "CUSTOM" and k in CUSTOM_UNSUPPORTED_SOURCE and vals:
                rep.error(vp, f"From.{k[0].upper()}{k[1:]} is currently not supported with CUSTOM action")
        tcp_from = tcp_from or any(src.get(k) is not None for k in TCP_SOURCE_FIELDS)
    for j, t in enumerate(rule.get("to") or []):
        tp = f"{p}.to[{j}]"
        op = (t or {}).get("operation")
        if op is None:
            rep.error(f"{tp}.operation", "`to.operation` must not be nil")
            continue
        to_exists = True
        if not any(op.get(k) for k in OPERATION_FIELDS):
            rep.error(f"{tp}.operation", "`to.operation` must not be empty")
        for k in OPERATION_FIELDS:
            vals = op.get(k)
            if vals is None:
                continue
            vp = f"{tp}.operation.{k}"
            _non_empty(rep, vp, vals)
            if k in ("ports", "notPorts"):
                _ports(rep, vp, vals)
            if k in ("paths", "notPaths"):
                _path_templates(rep, vp, vals)
        tcp_to = tcp_to or op.get("ports") is not None or op.get("notPorts") is not None
    for j, cond in enumerate(rule.get("when") or []):
        _condition(rep, f"{p}.when[{j}]", cond or {}, action)
    if action == "DENY" and ((from_exists and not to_exists and not tcp_from) or (to_exists and not tcp_to)):
        rep.warn(p, "configured AuthorizationPolicy will deny all traffic to TCP ports under its scope due to the "
                    "use of only HTTP attributes in a DENY rule; it is recommended to explicitly specify the port")


def _condition(rep: Report, p: str, cond: dict, action: str) -> None:
    key = cond.get("key") or ""
    if not key:
        rep.error(f"{p}.key", "`key` must not be empty")
        return
    values, not_values = cond.get("values") or [], cond.get("notValues") or []
    if not values and not not_values:
        rep.error(p, f"at least one of `values` or `notValues` must be set for key {key}")
        return
    if action == "CUSTOM" and (key in CUSTOM_UNSUPPORTED_KEYS or key.startswith("request.auth.")):
        rep.error(f"{p}.key", f"{key} is currently not supported with CUSTOM action")
    if _key(rep, p, key):
        for field, vals in (("values", values), ("notValues", not_values)):
            _attribute(rep, f"{p}.{field}", key, vals)


def _key(rep: Report, p: str, key: str) -> bool:
    """security.ValidateAttribute's key half: a known attribute, `name[...]` well formed."""
    if key.startswith(MAP_KEYS):
        prefix = next(m for m in MAP_KEYS if key.startswith(m))
        open_ = key.find("[")
        if not (key.endswith("]") and 0 < open_ < len(key) - 2) or (prefix != MAP_KEYS[2] and open_ != len(prefix)):
            rep.error(f"{p}.key", f"bad key ({key}): should have format a[b]")
            return False
        return True
    if key == "destination.namespace":
        rep.error(f"{p}.key", f"attribute {key} is replaced by the metadata.namespace")
    elif key.startswith("destination.labels"):
        rep.error(f"{p}.key", f"attribute {key} is replaced by the workload selector")
    elif key in ("destination.name", "destination.user"):
        rep.error(f"{p}.key", f"deprecated attribute {key}: only supported in v1alpha1")
    elif key not in EXACT_KEYS:
        rep.error(f"{p}.key", f"unknown attribute: {key} (one of {', '.join(EXACT_KEYS)}, "
                              "request.headers[NAME], request.auth.claims[NAME], experimental.envoy.filters.*[KEY])")
    else:
        return True
    return False


def _attribute(rep: Report, vp: str, key: str, vals: list) -> None:
    """security.ValidateAttribute's value half: what each `when` key accepts."""
    if any(v == "" for v in vals):
        rep.error(vp, f"empty value not allowed, found in {key}")
    elif key in IP_KEYS:
        _ips(rep, vp, vals)
    elif key == "destination.port":
        _ports(rep, vp, vals)
    elif key == "source.serviceAccount":
        _service_accounts(rep, vp, vals)
    elif key == "source.trustDomain":
        _wildcards(rep, vp, vals, trust_domain=True)
    elif key in ("source.principal", "request.auth.principal"):
        _wildcards(rep, vp, vals)


def _non_empty(rep: Report, p: str, vals: list) -> None:
    for i, v in enumerate(vals):
        if v == "":
            rep.error(f"{p}[{i}]", f"empty value not allowed, found in {p.rsplit('.', 1)[-1]}")


def _ips(rep: Report, p: str, vals: list) -> None:
    for i, v in enumerate(vals):
        try:
            ipaddress.ip_network(v, strict=False) if "/" in v else ipaddress.ip_address(v)
        except ValueError:
            what = "CIDR range" if "/" in v else "IP address"
            rep.error(f"{p}[{i}]", f"bad {what} ({v})")


def _ports(rep: Report, p: str, vals: list) -> None:
    for i, v in enumerate(vals):
        if not str(v).isdigit() or int(v) > 65535:
            rep.error(f"{p}[{i}]", f"bad port ({v}): must be a number in 0..65535")


def _wildcards(rep: Report, p: str, vals: list, trust_domain: bool = False) -> None:
    """Istio's CheckWildcardValues (trust domains); for principals it is this
    mesh's rule: istiod would take a `*` in the middle literally."""
    for i, v in enumerate(vals):
        n = v.count("*")
        if n > 1 or (n == 1 and v != "*" and not v.startswith("*") and not v.endswith("*")):
            rep.error(f"{p}[{i}]", f"wildcard is only allowed once, at the start or end, found {v!r}"
                      + ("" if trust_domain else " (a `*` elsewhere would be matched literally)"))
        if trust_domain and "/" in v:
            rep.error(f"{p}[{i}]", f"trust domain must not contain '/', found {v!r}")


def _service_accounts(rep: Report, p: str, vals: list) -> None:
    if len(vals) > 16:
        rep.error(p, "may not have more than 16 values")
    for i, v in enumerate(vals):
        if "*" in v:
            rep.error(f"{p}[{i}]", "wildcard not allowed in a service account")
        elif v.count("/") > 1 or (v.count("/") == 1 and "" in v.split("/")):
            rep.error(f"{p}[{i}]", f"expected format 'serviceAccount' or 'namespace/serviceAccount', found {v!r}")
        elif len(v) > 320:
            rep.error(f"{p}[{i}]", "value cannot exceed 320 characters")


def _path_templates(rep: Report, p: str, vals: list) -> None:
    """security.CheckValidPathTemplate: {*} one segment, {**} the rest (last)."""
    for i, path in enumerate(vals):
        templated = "{*}" in path or "{**}" in path
        seen_any = False
        for glob in path.strip("/").split("/"):
            if glob in ("{*}", "{**}") and not seen_any:
                seen_any = glob == "{**}"
                continue
            if glob in ("{*}", "{**}"):
                rep.error(f"{p}[{i}]", f"invalid or unsupported path {path}: {{**}} is not the last operator")
                break
            if "{" in glob or "}" in glob:
                rep.error(f"{p}[{i}]", f"invalid or unsupported path {path}: contains '{{' or '}}' beyond a "
                                       "supported path template")
                break
            if templated and not _LITERAL.match(glob):
                rep.error(f"{p}[{i}]", f"invalid or unsupported path {path}: contains segment {glob} with "
                                       "invalid string literal")
                break
