"""Validators for Gateway API v1 (gateway.networking.k8s.io): Gateway,
GatewayClass, HTTPRoute, GRPCRoute, ReferenceGrant -- the CRDs' schemas and
their CEL rules that matter here (listener names and port/protocol/hostname
combinations unique, path values starting with '/', RE2 regexes, weights,
filter fields matching their type). mesh/gateway_api.py translates them."""
from __future__ import annotations

from typing import Iterator

from mesh import hosts
from mesh.diagnostics import Diagnostic
from mesh.gateway_api import GROUP
from mesh.resources import MeshConfig, Resource
from mesh.validation import validator
from mesh.validation.regex import regex_error
from mesh.validation.report import Report, schema_report
from mesh.validation.schema import Enum, Map, Obj

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


def _hostname(rep: Report, path: str, h) -> None:
    h = str(h)
    if hosts.is_ip(h) or (hosts.fqdn_error(h[2:] if h.startswith("*.") else h)):
        rep.error(path, f"invalid hostname {h!r}: a DNS name, optionally with a leading '*.' label, not an IP")


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


def _rules(rep: Report, res: Resource, grpc: bool) -> None:
    for i, h in enumerate(res.spec.get("hostnames") or []):
        _hostname(rep, f"spec.hostnames[{i}]", h)
    for i, rule in enumerate(res.spec.get("rules") or []):
        p = f"spec.rules[{i}]"
        for j, m in enumerate(rule.get("matches") or []):
            mp = f"{p}.matches[{j}]"
            path = m.get("path") or {}
            if path:
                value = path.get("value", "/")
                if path.get("type", "PathPrefix") != "RegularExpression" and not str(value).startswith("/"):
                    rep.error(f"{mp}.path.value", "value must be an absolute path and start with '/' "
                                                  "when type one of ['Exact', 'PathPrefix']")
                if path.get("type") == "RegularExpression" and regex_error(str(value)):
                    rep.error(f"{mp}.path.value", f"invalid regex {value!r}: {regex_error(str(value))}")
            for kind in ("headers", "queryParams"):
                seen = set()
                for k, h in enumerate(m.get(kind) or []):
                    key = str(h.get("name")).lower() if kind == "headers" else h.get("name")
                    if key in seen:
                        rep.error(f"{mp}.{kind}[{k}].name", f"{kind} names must be unique within a match")
                    seen.add(key)
                    if h.get("type") == "RegularExpression" and regex_error(str(h.get("value", ""))):
                        rep.error(f"{mp}.{kind}[{k}].value", f"invalid regex: {regex_error(str(h.get('value')))}")
            if grpc:
                method = m.get("method") or {}
                if method and not method.get("service") and not method.get("method"):
                    rep.error(f"{mp}.method", "one or both of 'service' or 'method' must be specified")
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
            code = (f.get("requestRedirect") or {}).get("statusCode")
            if code is not None and code not in (301, 302):
                rep.error(f"{fp}.requestRedirect.statusCode", f"unsupported value {code}: expected 301 or 302")
        types = [f.get("type") for f in rule.get("filters") or []]
        if "RequestRedirect" in types and "URLRewrite" in types:
            rep.error(f"{p}.filters", "May specify either httpRouteFilterRequestRedirect or "
                                      "httpRouteFilterRequestRewrite, but not both")
        if "RequestRedirect" in types and rule.get("backendRefs"):
            rep.warn(f"{p}.backendRefs", "a RequestRedirect answers the request: backendRefs are not used")
        for k, ref in enumerate(rule.get("backendRefs") or []):
            if ref.get("weight") is not None and not 0 <= int(ref["weight"]) <= 1_000_000:
                rep.error(f"{p}.backendRefs[{k}].weight", "weight must be in 0..1000000")
            if (ref.get("kind") or "Service") == "Service" and not (ref.get("group") or "") and not ref.get("port"):
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
