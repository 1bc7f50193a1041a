"""AuthorizationPolicy validation: Istio's ValidateAuthorizationPolicy rules,
each error naming file:line and the field."""
import pytest

from mcp26.mesh.parse import parse_documents
from mcp26.mesh.resources import MeshConfig
from mcp26.mesh.validation import validate_resource, _load_validators

_load_validators()


def diags(spec_yaml: str, meta_extra: str = ""):
    text = ("apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n"
            f"metadata:\n  name: p\n  namespace: shop\n{meta_extra}spec:\n{spec_yaml}")
    (res,) = parse_documents(text, file="ap.yaml")
    return validate_resource(res, MeshConfig([res]))


def errors(spec_yaml, meta_extra=""):
    return [(d.line, d.field, d.message) for d in diags(spec_yaml, meta_extra) if d.severity == "error"]


def test_good_policy_has_no_findings():
    assert diags("""  selector: {matchLabels: {app: cart}}
  action: ALLOW
  rules:
  - from: [{source: {principals: ["cluster.local/ns/a/sa/b", "*"], requestPrincipals: ["iss/sub"]}}]
    to: [{operation: {methods: [GET], paths: ["/a/{*}/b/{**}"], ports: ["8080"]}}]
    when:
    - {key: "request.auth.claims[realm][group]", values: [x]}
    - {key: "request.headers[x-env]", notValues: [dev]}
    - {key: source.ip, values: ["10.0.0.0/8"]}
    - {key: "experimental.envoy.filters.a.b[c]", values: [v]}
""") == []


@pytest.mark.parametrize("spec,line,field,words", [
    ("  action: DENNY\n  rules: [{}]\n", 7, "spec.action", "unsupported value 'DENNY'"),
    ("  rules:\n  - from: [{source: {principal: [x]}}]\n", 8, "spec.rules[0].from[0].source.principal",
     "did you mean 'principals'"),
    ("  rules:\n  - when: [{key: request.method, values: [GET]}]\n", 8, "spec.rules[0].when[0].key",
     "unknown attribute: request.method"),
    ("  rules:\n  - when: [{key: 'request.headers', values: [GET]}]\n", 8, "spec.rules[0].when[0].key",
     "should have format a[b]"),
    ("  rules:\n  - when: [{key: source.ip}]\n", 8, "spec.rules[0].when[0]", "at least one of `values`"),
    ("  rules:\n  - from:\n    - source:\n        principals: ['cluster.local/ns/*/sa/x']\n", 10,
     "spec.rules[0].from[0].source.principals[0]", "matched literally"),
    ("  rules:\n  - from: [{source: {ipBlocks: ['10.0.0.300']}}]\n", 8,
     "spec.rules[0].from[0].source.ipBlocks[0]", "bad IP address"),
    ("  rules:\n  - to: [{operation: {ports: ['70000']}}]\n", 8, "spec.rules[0].to[0].operation.ports[0]",
     "bad port"),
    ("  rules:\n  - to: [{operation: {}}]\n", 8, "spec.rules[0].to[0].operation", "must not be empty"),
    ("  rules:\n  - from: [{source: {serviceAccounts: [a/b/c]}}]\n", 8,
     "spec.rules[0].from[0].source.serviceAccounts[0]", "expected format"),
    ("  action: DENY\n", 6, "spec.rules", "DENY action without `rules` is meaningless"),
    ("  action: CUSTOM\n  rules: [{}]\n", 6, "spec.provider.name", "`provider.name` must not be empty"),
    ("  action: CUSTOM\n  provider: {name: x}\n  rules:\n  - from: [{source: {principals: [a]}}]\n", 10,
     "spec.rules[0].from[0].source.principals", "not supported with CUSTOM"),
    ("  provider: {name: x}\n  rules: [{}]\n", 7, "spec.provider", "must not be with non CUSTOM action"),
    ("  selector: {matchLabels: {app: cart}}\n  targetRefs: [{kind: Gateway, name: gw}]\n", 8, "spec.targetRefs",
     "only one of selector, targetRef, targetRefs"),
])
def test_errors_name_line_field_and_reason(spec, line, field, words):
    found = errors(spec)
    assert any(ln == line and f == field and words in m for ln, f, m in found), found


def test_deny_on_http_attributes_only_warns_about_tcp_ports():
    out = diags("  action: DENY\n  rules:\n  - from: [{source: {notRequestPrincipals: ['*']}}]\n")
    assert [(d.severity, d.field) for d in out] == [("warning", "spec.rules[0]")]
    assert "deny all traffic to TCP ports" in out[0].message


def test_provider_annotation_checked():
    meta = "  annotations:\n    mcp-mesh.io/extension-provider: '{name: a, envoyExtAuthzHttp: {service: s, port: 0}}'\n"
    found = errors("  action: CUSTOM\n  provider: {name: a}\n  rules: [{}]\n", meta)
    assert any(f == "metadata.annotations.mcp-mesh.io/extension-provider" and "port" in m for _, f, m in found)
