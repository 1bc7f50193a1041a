"""Validators for Gateway API v1 (gateway.networking.k8s.io): Gateway,
GatewayClass, HTTPRoute, GRPCRoute, ReferenceGrant -- what the Kubernetes API
server refuses before any controller sees them: the CRDs' schemas, string
patterns, ranges, list limits and uniqueness (apis/v1/*_types.go) and their CEL
rules (listener names and port/protocol/hostname combinations unique, path
values, RE2 regexes, weights, filter fields matching their type and not
repeated, a redirect without backends, replacePrefixMatch with one PathPrefix
match, timeouts). mesh/gateway_api.py translates them."""
from __future__ import annotations

import re
from typing import Iterator

from mcp26.mesh import hosts
from mcp26.mesh.header_contract import is_token
from mcp26.mesh.diagnostics import Diagnostic
from mcp26.mesh.gateway_api import GROUP
from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.mesh.validation import validator
from mcp26.mesh.validation.regex import regex_error
from mcp26.mesh.validation.report import Report, schema_report
from mcp26.mesh.validation.schema import Enum, Map, Obj, duration_ns

VERSIONS = (f"{GROUP}/v1", f"{GROUP}/v1beta1")
PARENT_REF = Obj({"group": "string", "kind": "string", "namespace": "string", "name": "string",
                  "sectionName": "string", "port": "int32"}, required=("name",))
BACKEND_REF = Obj({"group": "string", "kind": "string", "namespace": "string", "name": "string",
                   "port": "int32", "weight": "int32", "filters": ["any"]}, required=("name",))
HEADER_MATCH = Obj({"type": Enum("Exact", "RegularExpression"), "name": "string", "value": "string"},
                   required=("name", "value"))
HEADER_MODIFIER = Obj({"set": [Obj({"name": "string", "value": "string"}, required=("name", "value"))],
                       "add": [Obj({"name": "string", "value": "string"}, required=("name", "value"))],
                       "remove": ["string"]})
PATH_MODIFIER = Obj({"type": Enum("ReplaceFullPath", "ReplacePrefixMatch"), "replaceFullPath": "string",
                     "replacePrefixMatch": "string"}, required=("type",))
FILTER = Obj({
    "type": Enum("RequestHeaderModifier", "ResponseHeaderModifier", "RequestRedirect", "URLRewrite",
                 "RequestMirror", "ExtensionRef", "CORS"),
    "requestHeaderModifier": HEADER_MODIFIER, "responseHeaderModifier": HEADER_MODIFIER,
    "requestRedirect": Obj({"scheme": Enum("http", "https"), "hostname": "string", "path": PATH_MODIFIER,
                            "port": "int32", "statusCode": "int32"}),
    "urlRewrite": Obj({"hostname": "string", "path": PATH_MODIFIER}),
    "requestMirror": Obj({"backendRef": BACKEND_REF, "percent": "int32",
                          "fraction": Obj({"numerator": "int32", "denominator": "int32"}, required=("numerator",))},
                         required=("backendRef",)),
    "extensionRef": Obj({"group": "string", "kind": "string", "name": "string"}),
    "cors": "any",
}, required=("type",))
TIMEOUTS = Obj({"request": "string", "backendRequest": "string"})
HTTP_MATCH = Obj({
    "path": Obj({"type": Enum("Exact", "PathPrefix", "RegularExpression"), "value": "string"}),
    "headers": [HEADER_MATCH], "queryParams": [HEADER_MATCH],
    "method": Enum("GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"),
})
GRPC_MATCH = Obj({"method": Obj({"type": Enum("Exact", "RegularExpression"), "service": "string", "method": "string"}),
                  "headers": [HEADER_MATCH]})
HTTP_ROUTE = Obj({"parentRefs": [PARENT_REF], "hostnames": ["string"], "rules": [Obj({
    "name": "string", "matches": [HTTP_MATCH], "filters": [FILTER], "backendRefs": [BACKEND_REF],
    "timeouts": TIMEOUTS, "retry": "any", "sessionPersistence": "any"})]})
GRPC_ROUTE = Obj({"parentRefs": [PARENT_REF], "hostnames": ["string"], "rules": [Obj({
    "name": "string", "matches": [GRPC_MATCH], "filters": [FILTER], "backendRefs": [BACKEND_REF],
    "sessionPersistence": "any"})]})
GATEWAY = Obj({
    "gatewayClassName": "string",
    "listeners": [Obj({
        "name": "string", "hostname": "string", "port": "int32",
        "protocol": "string",
        "tls": Obj({"mode": Enum("Terminate", "Passthrough"), "certificateRefs": [Obj({
            "group": "string", "kind": "string", "name": "string", "namespace": "string"}, required=("name",))],
            "options": Map("string"), "frontendValidation": "any"}),
        "allowedRoutes": Obj({"namespaces": Obj({"from": Enum("All", "Same", "Selector"),
                                                 "selector": Obj({"matchLabels": Map("string"),
                                                                  "matchExpressions": ["any"]})}),
                              "kinds": [Obj({"group": "string", "kind": "string"}, required=("kind",))]}),
    }, required=("name", "port", "protocol"))],
    "addresses": ["any"], "infrastructure": "any", "backendTLS": "any", "allowedListeners": "any",
}, required=("gatewayClassName", "listeners"))
GATEWAY_CLASS = Obj({"controllerName": "string", "parametersRef": "any", "description": "string"},
                    required=("controllerName",))
REFERENCE_GRANT = Obj({"from": [Obj({"group": "string", "kind": "string", "namespace": "string"},
                                    required=("group", "kind", "namespace"))],
                       "to": [Obj({"group": "string", "kind": "string", "name": "string"}, required=("group", "kind"))]},
                      required=("from", "to"))


# The CRDs' string types (apis/v1/shared_types.go): Hostname, PreciseHostname, Duration (HeaderName's
# pattern is RFC 7230's token: header_contract.is_token), and the CEL rule on Exact / PathPrefix path
# values (httproute_types.go).
HOSTNAME = re.compile(r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
PRECISE_HOSTNAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DURATION = re.compile(r"^([0-9]{1,5}(h|m|s|ms)){1,4}$")
PATH_CHARS = re.compile(r"^(?:[-A-Za-z0-9/._~!$&'()*+,;=:@]|[%][0-9a-fA-F]{2})+$")
_ONCE = ("CORS", "RequestHeaderModifier", "ResponseHeaderModifier", "RequestRedirect", "URLRewrite")
# list -> MaxItems in the CRDs
MOST = {"hostnames": 16, "parentRefs": 32, "rules": 16, "matches": 64, "filters": 16, "backendRefs": 16,
        "headers": 16, "queryParams": 16, "set": 16, "add": 16, "remove": 16}


def _hostname(rep: Report, path: str, h, wildcard: bool = True) -> None:
    h = str(h)
    if hosts.is_ip(h) or (hosts.fqdn_error(h[2:] if h.startswith("*.") else h)):
        rep.error(path, f"invalid hostname {h!r}: a DNS name, optionally with a leading '*.' label, not an IP")
    else:
        pattern = HOSTNAME if wildcard else PRECISE_HOSTNAME
        if not pattern.match(h) or len(h) > 253:
            rep.error(path, f"invalid hostname {h!r}: lower-case DNS labels"
                            f"{', optionally after a leading *.' if wildcard else ', no wildcard'}, "
                            f"at most 253 characters (should match '{pattern.pattern}')")


def _most(rep: Report, path: str, items, key: str) -> None:
    if isinstance(items, list) and len(items) > MOST[key]:
        rep.error(path, f"must have at most {MOST[key]} items, has {len(items)}")


def _header_name(rep: Report, path: str, name) -> None:
    if not is_token(name) or len(name) > 256:
        rep.error(path, f"invalid header name {name!r}: must be an RFC 7230 token of at most 256 characters")


def _path_value(rep: Report, path: str, value: str) -> None:
    """The CEL rules on an Exact or PathPrefix value (absolute, normalised, plain characters)."""
    if not value.startswith("/"):
        rep.error(path, "value must be an absolute path and start with '/' when type one of ['Exact', 'PathPrefix']")
        return
    for bad in ("//", "/./", "/../", "%2f", "%2F", "#"):
        if bad in value:
            rep.error(path, f"must not contain {bad!r} when type one of ['Exact', 'PathPrefix']")
    for end in ("/..", "/."):
        if value.endswith(end):
            rep.error(path, f"must not end with {end!r} when type one of ['Exact', 'PathPrefix']")
    if not PATH_CHARS.match(value):
        rep.error(path, f"must only contain valid characters (matching {PATH_CHARS.pattern}) "
                        f"for types ['Exact', 'PathPrefix']")


@validator("Gateway", group=GROUP)
def validate_gateway(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    rep, errs = schema_report(res, VERSIONS, GATEWAY)
    typed = not errs.wrong_type
    if typed:
        names, combos = set(), set()
        for i, lis in enumerate(res.spec.get("listeners") or []):
            p = f"spec.listeners[{i}]"
            if lis.get("name") in names:
                rep.error(f"{p}.name", f"listener name {lis.get('name')!r} must be unique within the Gateway")
            names.add(lis.get("name"))
            rep.port(f"{p}.port", lis.get("port"))
            if lis.get("hostname"):
                _hostname(rep, f"{p}.hostname", lis["hostname"])
            combo = (lis.get("port"), lis.get("protocol"), lis.get("hostname"))
            if combo in combos:
                rep.error(p, "combination of port, protocol and hostname must be unique for each listener")
            combos.add(combo)
            if lis.get("protocol") in ("HTTPS", "TLS") and not lis.get("tls"):
                rep.error(f"{p}.tls", "tls must be specified for protocols ['HTTPS', 'TLS']")
            if lis.get("protocol") in ("HTTP", "TCP", "UDP") and lis.get("tls"):
                rep.error(f"{p}.tls", "tls must not be specified for protocols ['HTTP', 'TCP', 'UDP']")
            tls = lis.get("tls") or {}
            if lis.get("protocol") == "HTTPS" and tls.get("mode") == "Passthrough":
                rep.error(f"{p}.tls.mode", "tls mode must be Terminate for protocol HTTPS")
            if (tls.get("mode") or "Terminate") == "Terminate" and lis.get("tls") and not tls.get("certificateRefs"):
                rep.error(f"{p}.tls.certificateRefs", "certificateRefs or options must be specified when mode is Terminate")
    yield from rep.out


@validator("GatewayClass", group=GROUP)
def validate_gateway_class(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    yield from schema_report(res, VERSIONS, GATEWAY_CLASS)[0].out


def _parent_refs(rep: Report, res: Resource) -> None:
    _most(rep, "spec.parentRefs", res.spec.get("parentRefs"), "parentRefs")
    for i, ref in enumerate(res.spec.get("parentRefs") or []):
        rep.port(f"spec.parentRefs[{i}].port", ref.get("port"))


def _header_modifier(rep: Report, path: str, mod: dict) -> None:
    for kind in ("set", "add", "remove"):
        items = mod.get(kind) or []
        _most(rep, f"{path}.{kind}", items, kind)
        seen = set()
        for k, item in enumerate(items):
            name = item if kind == "remove" else item.get("name")
            _header_name(rep, f"{path}.{kind}[{k}]" + ("" if kind == "remove" else ".name"), name)
            if name in seen:                # listType map (set, add) / set (remove): exact duplicates
                rep.error(f"{path}.{kind}[{k}]", f"Duplicate value: {name!r}")
            seen.add(name)


def _matches(rep: Report, p: str, rule: dict, grpc: bool) -> None:
    _most(rep, f"{p}.matches", rule.get("matches"), "matches")
    for j, m in enumerate(rule.get("matches") or []):
        mp = f"{p}.matches[{j}]"
        path = m.get("path") or {}
        if path:
            value = path.get("value", "/")
            if path.get("type", "PathPrefix") != "RegularExpression":
                _path_value(rep, f"{mp}.path.value", str(value))
            elif regex_error(str(value)):
                rep.error(f"{mp}.path.value", f"invalid regex {value!r}: {regex_error(str(value))}")
        for kind in ("headers", "queryParams"):
            _most(rep, f"{mp}.{kind}", m.get(kind), kind)
            exact, folded = set(), set()
            for k, h in enumerate(m.get(kind) or []):
                name = str(h.get("name"))
                _header_name(rep, f"{mp}.{kind}[{k}].name", name)
                if name in exact:           # listType map, key name: the API server refuses it
                    rep.error(f"{mp}.{kind}[{k}].name", f"Duplicate value: {name!r}")
                elif kind == "headers" and name.lower() in folded:
                    rep.warn(f"{mp}.{kind}[{k}].name", f"header {name!r} equals an earlier one but for case: "
                                                       "only the first is considered (Gateway API)")
                exact.add(name)
                folded.add(name.lower())
                if h.get("type") == "RegularExpression" and regex_error(str(h.get("value", ""))):
                    rep.error(f"{mp}.{kind}[{k}].value", f"invalid regex: {regex_error(str(h.get('value')))}")
        if grpc:
            method = m.get("method") or {}
            if method and not method.get("service") and not method.get("method"):
                rep.error(f"{mp}.method", "one or both of 'service' or 'method' must be specified")


def _timeouts(rep: Report, p: str, timeouts: dict | None) -> None:
    if not timeouts:
        return
    for k in ("request", "backendRequest"):
        if k in timeouts and not DURATION.match(str(timeouts[k])):
            rep.error(f"{p}.timeouts.{k}", f"invalid duration {timeouts[k]!r}: should match '{DURATION.pattern}' "
                                           "(e.g. 10s, 1m30s, 500ms)")
    req, back = str(timeouts.get("request", "")), str(timeouts.get("backendRequest", ""))
    if DURATION.match(req) and DURATION.match(back) and duration_ns(req) != 0 and duration_ns(back) > duration_ns(req):
        rep.error(f"{p}.timeouts", "backendRequest timeout cannot be longer than request timeout")


def _rules(rep: Report, res: Resource, grpc: bool) -> None:
    _most(rep, "spec.hostnames", res.spec.get("hostnames"), "hostnames")
    for i, h in enumerate(res.spec.get("hostnames") or []):
        _hostname(rep, f"spec.hostnames[{i}]", h)
    _parent_refs(rep, res)
    _most(rep, "spec.rules", res.spec.get("rules"), "rules")
    for i, rule in enumerate(res.spec.get("rules") or []):
        p = f"spec.rules[{i}]"
        _matches(rep, p, rule, grpc)
        _timeouts(rep, p, rule.get("timeouts"))
        _most(rep, f"{p}.filters", rule.get("filters"), "filters")
        for k, f in enumerate(rule.get("filters") or []):
            fp = f"{p}.filters[{k}]"
            field = {"RequestHeaderModifier": "requestHeaderModifier", "ResponseHeaderModifier": "responseHeaderModifier",
                     "RequestRedirect": "requestRedirect", "URLRewrite": "urlRewrite",
                     "RequestMirror": "requestMirror", "ExtensionRef": "extensionRef", "CORS": "cors"}.get(f.get("type"))
            for other in ("requestHeaderModifier", "responseHeaderModifier", "requestRedirect", "urlRewrite",
                          "requestMirror", "extensionRef", "cors"):
                if other != field and other in f:
                    rep.error(f"{fp}.{other}", f"filter.{other} must be nil if the filter.type is not {f.get('type')}")
            if field and field not in f:
                rep.error(f"{fp}.{field}", f"filter.{field} must be specified for {f.get('type')} filter.type")
            redirect = f.get("requestRedirect") or {}
            code = redirect.get("statusCode")
            if code is not None and code not in (301, 302):
                rep.error(f"{fp}.requestRedirect.statusCode", f"unsupported value {code}: expected 301 or 302")
            rep.port(f"{fp}.requestRedirect.port", redirect.get("port"))
            for field_name in ("requestHeaderModifier", "responseHeaderModifier"):
                if isinstance(f.get(field_name), dict):
                    _header_modifier(rep, f"{fp}.{field_name}", f[field_name])
            for field_name in ("requestRedirect", "urlRewrite"):
                target = f.get(field_name) or {}
                if target.get("hostname"):
                    _hostname(rep, f"{fp}.{field_name}.hostname", target["hostname"], wildcard=False)
                rewrite = target.get("path") or {}
                if rewrite.get("type") == "ReplacePrefixMatch" and rewrite.get("replacePrefixMatch") is not None:
                    # after the API server's defaults: no matches is one PathPrefix "/" match
                    matches = rule.get("matches") or [{}]
                    if len(matches) != 1 or (matches[0].get("path") or {}).get("type", "PathPrefix") != "PathPrefix":
                        name = "RequestRedirect" if field_name == "requestRedirect" else "URLRewrite"
                        rep.error(f"{fp}.{field_name}.path", f"When using {name} filter with path.replacePrefixMatch, "
                                                             "exactly one PathPrefix match must be specified")
        types = [f.get("type") for f in rule.get("filters") or []]
        for once in _ONCE:
            if types.count(once) > 1:
                rep.error(f"{p}.filters", f"{once} filter cannot be repeated")
        if "RequestRedirect" in types and "URLRewrite" in types:
            rep.error(f"{p}.filters", "May specify either httpRouteFilterRequestRedirect or "
                                      "httpRouteFilterRequestRewrite, but not both")
        if "RequestRedirect" in types and rule.get("backendRefs") and not grpc:
            rep.error(f"{p}.backendRefs", "RequestRedirect filter must not be used together with backendRefs")
        _most(rep, f"{p}.backendRefs", rule.get("backendRefs"), "backendRefs")
        for k, ref in enumerate(rule.get("backendRefs") or []):
            if ref.get("weight") is not None and not 0 <= int(ref["weight"]) <= 1_000_000:
                rep.error(f"{p}.backendRefs[{k}].weight", "weight must be in 0..1000000")
            rep.port(f"{p}.backendRefs[{k}].port", ref.get("port"))
            if (ref.get("kind") or "Service") == "Service" and not (ref.get("group") or "") and ref.get("port") is None:
                rep.error(f"{p}.backendRefs[{k}].port", "port is required when kind is Service")


@validator("HTTPRoute", group=GROUP)
def validate_http_route(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    rep, errs = schema_report(res, VERSIONS, HTTP_ROUTE)
    typed = not errs.wrong_type
    if typed:
        _rules(rep, res, grpc=False)
    yield from rep.out


@validator("GRPCRoute", group=GROUP)
def validate_grpc_route(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    rep, errs = schema_report(res, VERSIONS, GRPC_ROUTE)
    typed = not errs.wrong_type
    if typed:
        _rules(rep, res, grpc=True)
    yield from rep.out


@validator("ReferenceGrant", group=GROUP)
def validate_reference_grant(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    yield from schema_report(res, (f"{GROUP}/v1beta1", f"{GROUP}/v1"), REFERENCE_GRANT)[0].out
