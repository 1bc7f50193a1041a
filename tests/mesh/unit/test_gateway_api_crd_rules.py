"""HTTPRoute as the Kubernetes API server checks it (the Gateway API v1 CRDs' patterns,
ranges, list limits, uniqueness and CEL rules; GRPCRoute shares the hostname, header,
parentRef and backendRef checks): each bad input named by file, line, resource and field,
the valid forms beside them still passing."""
from __future__ import annotations

import pytest

from mcp26.mesh.parse import parse_documents
from mcp26.mesh.resources import MeshConfig
from mcp26.mesh.validation import validate

ROUTE = """apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: default}
spec:
  parentRefs: [{name: gw}]
  hostnames: [shop.example.com]
  rules:
  - matches: [{path: {type: PathPrefix, value: /api}}]
    backendRefs: [{name: svc, port: 80}]
"""


def findings(text: str) -> list:
    return list(validate(MeshConfig(parse_documents(text, file="route.yaml"))))


def route(old: str, new: str) -> str:
    assert old in ROUTE
    return ROUTE.replace(old, new, 1)


def test_the_base_route_is_valid():
    assert findings(ROUTE) == []


@pytest.mark.parametrize("old, new, field, words", [
    ("{name: gw}", "{name: gw, port: 99999}", "spec.parentRefs[0].port", "1..65535"),
    ("[shop.example.com]", "[Shop.Example.com]", "spec.hostnames[0]", "lower-case"),
    ("[shop.example.com]", "[" + ", ".join(f"h{i}.example.com" for i in range(17)) + "]",
     "spec.hostnames", "at most 16 items"),
    ("value: /api}", "value: /api//v1}", "spec.rules[0].matches[0].path.value", "'//'"),
    ("value: /api}", "value: /api/..}", "spec.rules[0].matches[0].path.value", "must not end with '/..'"),
    ("value: /api}", "value: /api%2Fv1}", "spec.rules[0].matches[0].path.value", "'%2F'"),
    ("value: /api}", "value: '/api v1'}", "spec.rules[0].matches[0].path.value", "valid characters"),
    ("value: /api}}", "value: /api}, headers: [{name: 'x tenant', value: a}]}",
     "spec.rules[0].matches[0].headers[0].name", "invalid header name"),
    ("value: /api}}", "value: /api}, headers: [{name: x-a, value: a}, {name: x-a, value: b}]}",
     "spec.rules[0].matches[0].headers[1].name", "Duplicate value"),
    ("port: 80}]", "port: 80}]\n    timeouts: {request: 10 seconds}", "spec.rules[0].timeouts.request", "invalid duration"),
    ("port: 80}]", "port: 80}]\n    timeouts: {request: 1s, backendRequest: 1m}", "spec.rules[0].timeouts",
     "backendRequest timeout cannot be longer than request timeout"),
    ("port: 80}]", "port: 0}]", "spec.rules[0].backendRefs[0].port", "1..65535"),
    ("    backendRefs:", "    filters:\n    - {type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x-a, value: '1'}]}}\n"
                       "    - {type: RequestHeaderModifier, requestHeaderModifier: {add: [{name: x-b, value: '2'}]}}\n"
                       "    backendRefs:", "spec.rules[0].filters", "RequestHeaderModifier filter cannot be repeated"),
    ("    backendRefs:", "    filters:\n    - {type: RequestHeaderModifier, requestHeaderModifier: "
                       "{set: [{name: x-a, value: '1'}, {name: x-a, value: '2'}]}}\n    backendRefs:",
     "spec.rules[0].filters[0].requestHeaderModifier.set[1]", "Duplicate value"),
    ("    backendRefs:", "    filters:\n    - {type: RequestRedirect, requestRedirect: {hostname: '*.example.com'}}\n"
                       "    backendRefs:", "spec.rules[0].filters[0].requestRedirect.hostname", "no wildcard"),
    ("    backendRefs:", "    filters:\n    - {type: RequestRedirect, requestRedirect: {scheme: https}}\n    backendRefs:",
     "spec.rules[0].backendRefs", "RequestRedirect filter must not be used together with backendRefs"),
    ("  - matches: [{path: {type: PathPrefix, value: /api}}]",
     "  - matches: [{path: {type: Exact, value: /api}}]\n    filters:\n    - {type: URLRewrite, urlRewrite: "
     "{path: {type: ReplacePrefixMatch, replacePrefixMatch: /v2}}}",
     "spec.rules[0].filters[0].urlRewrite.path", "exactly one PathPrefix match"),
])
def test_what_the_api_server_refuses_is_an_error_naming_the_field(old, new, field, words):
    found = [d for d in findings(route(old, new)) if d.severity == "error"]
    match = [d for d in found if d.field == field and words in d.message]
    assert match, [f"{d.field}: {d.message}" for d in found]
    d = match[0]
    assert d.file == "route.yaml" and d.line > 0 and d.resource == "HTTPRoute/default/r"


@pytest.mark.parametrize("old, new", [
    ("{name: gw}", "{name: gw, port: 8080}"),
    ("[shop.example.com]", "['*.example.com']"),
    ("value: /api}", "value: /api/v1.2/~user%20x}"),
    ("port: 80}]", "port: 80}]\n    timeouts: {request: 1m30s, backendRequest: 500ms}"),
    ("port: 80}]", "port: 80}]\n    timeouts: {request: 0s, backendRequest: 1h}"),     # 0s: no request timeout
    ("  - matches: [{path: {type: PathPrefix, value: /api}}]",                         # one PathPrefix match
     "  - matches: [{path: {type: PathPrefix, value: /api}}]\n    filters:\n    - {type: URLRewrite, urlRewrite: "
     "{hostname: shop.internal, path: {type: ReplacePrefixMatch, replacePrefixMatch: /v2}}}"),
])
def test_the_valid_forms_beside_them_pass(old, new):
    assert [f"{d.field}: {d.message}" for d in findings(route(old, new)) if d.severity == "error"] == []


def test_header_names_equal_but_for_case_are_warned_not_refused():
    text = route("value: /api}}", "value: /api}, headers: [{name: x-a, value: a}, {name: X-A, value: b}]}")
    found = findings(text)
    assert [d for d in found if d.severity == "error"] == []
    assert any(d.severity == "warning" and d.field == "spec.rules[0].matches[0].headers[1].name" for d in found)
