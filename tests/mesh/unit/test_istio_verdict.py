"""Istio's verdict on every file: fields Istio accepts that mesh rejected, and
rules Istio enforces that mesh missed, each stated with the Istio source it
follows (istio/istio pkg/config/validation/validation.go unless said).

Fixtures are in Istio's style (pkg/config/validation/testdata/crds): one valid
and one invalid file per kind under tests/data/istio_verdict/; each invalid
document names what it must be rejected for in `# _err: FIELD: MESSAGE` lines.
"""
from __future__ import annotations

import os
import re

import pytest

from mcp26.mesh.change_set import load_texts
from mcp26.mesh.diagnostics import ConfigError
from mcp26.mesh.parse import parse_documents
from mcp26.mesh.resources import MeshConfig
from mcp26.mesh.validation import validate
from harness.paths import TEST_DATA

DATA = os.path.join(TEST_DATA, "istio_verdict")
KINDS = ("destinationrule", "serviceentry", "reqauth", "wasm", "virtualservice")


def fixture(name: str) -> str:
    with open(os.path.join(DATA, name)) as f:
        return f.read()


def diagnostics(name: str) -> tuple[list, dict]:
    """(diagnostics, resources by name) of one fixture file."""
    resources = parse_documents(fixture(name), file=name)
    return validate(MeshConfig(resources)), {r.name: r for r in resources}


def expectations(name: str) -> list[tuple[str, str, str]]:
    """(resource name, field, message) of every `# _err:` line, per document."""
    out = []
    for doc in fixture(name).split("\n---\n"):
        errs = re.findall(r"^# _err: (\S+): (.+)$", doc, re.M)
        res = re.search(r"^  name: (\S+)$", doc, re.M)
        out.extend((res.group(1), f, m) for f, m in errs)
    return out


def line_of(res, field: str) -> int:
    """The field's own line, or its nearest parent's for a field that is missing."""
    while field not in res.lines:
        field = re.sub(r"(\.[^.\[]*|\[\d+\])$", "", field)
    return res.lines[field]


def find(diags: list, resource: str, field: str, severity: str = "error") -> list:
    return [d for d in diags if d.resource.endswith(f"/{resource}") and d.field == field and d.severity == severity]


@pytest.mark.parametrize("kind", KINDS)
def test_valid_file_has_no_error(kind):
    """Every document of KIND-valid.yaml is accepted by Istio's webhook."""
    diags, resources = diagnostics(f"{kind}-valid.yaml")
    assert resources
    assert [str(d) for d in diags if d.severity == "error"] == []


@pytest.mark.parametrize("kind", KINDS)
def test_invalid_file_is_rejected_for_the_stated_reason(kind):
    """Every `# _err` of KIND-invalid.yaml is an error at that field's own line."""
    name = f"{kind}-invalid.yaml"
    diags, resources = diagnostics(name)
    expected = expectations(name)
    assert expected and {r for r, _, _ in expected} == set(resources)
    for res, field, message in expected:
        found = find(diags, res, field)
        assert found, f"{res}: no error at {field}; got {[str(d) for d in diags]}"
        assert any(message in d.message for d in found), [d.message for d in found]
        assert found[0].line == line_of(resources[res], field) and found[0].file == name


def test_warmup_rules():
    """validateLoadBalancer: `warmup` needs `duration`; `minimumPercent` > 100 and
    `aggression` <= 0 are errors ("minimumPercent value should be less than or
    equal to 100", "aggression should be greater than 0")."""
    diags, _ = diagnostics("destinationrule-invalid.yaml")
    lb = "spec.trafficPolicy.loadBalancer.warmup"
    assert [d.line for d in find(diags, "warmup-percent", f"{lb}.minimumPercent")] == [13]
    assert [d.line for d in find(diags, "warmup-no-duration", f"{lb}.duration")] == [25]   # the parent's line
    assert [d.line for d in find(diags, "warmup-aggression", f"{lb}.aggression")] == [40]
    # 100 and aggression > 0 are fine (destinationrule-valid.yaml, minimumPercent: 100)
    ok, _ = diagnostics("destinationrule-valid.yaml")
    assert not [d for d in ok if "warmup" in d.field]


def test_http2_keepalive_is_accepted_and_said_not_translated():
    """istio/api destination_rule.proto ConnectionPoolSettings.HTTPSettings
    `http2_keep_alive` (JSON http2KeepAlive {interval, timeout}); validateConnectionPool:
    "http2 keepalive interval/timeout is required". The translator does not
    set Envoy's connection_keepalive, so a warning says so."""
    diags, _ = diagnostics("destinationrule-valid.yaml")
    [w] = find(diags, "reviews-keepalive", "spec.trafficPolicy.connectionPool.http.http2KeepAlive", "warning")
    assert "not translated" in w.message and w.line == 12
    bad, _ = diagnostics("destinationrule-invalid.yaml")
    [e] = find(bad, "keepalive-no-timeout", "spec.trafficPolicy.connectionPool.http.http2KeepAlive.timeout")
    assert e.message == "http2 keepalive timeout is required"


def test_istio_mutual_is_accepted_without_a_warning():
    """ValidateTLS accepts ISTIO_MUTUAL with no certificate fields; the mesh CA
    and SDS translate it (xds-server/translate/transport_sockets.py), so no
    "not translated" warning either."""
    text = ("apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: m, namespace: ns}\n"
            "spec:\n  host: reviews\n  trafficPolicy:\n    tls:\n      mode: ISTIO_MUTUAL\n")
    assert validate(MeshConfig(parse_documents(text, file="dr.yaml"))) == []
    config = load_texts({"dr.yaml": text})
    assert not [d for d in config.warnings if d.field.startswith("spec.trafficPolicy.tls")]


def test_dynamic_dns_service_entry():
    """ValidateServiceEntry, case DYNAMIC_DNS: wildcard hosts only ("host must be
    wildcarded for resolution mode DYNAMIC_DNS"), HTTP/TLS/GRPC/HTTP2 ports only,
    no partial-wildcard warning; accepted, with a warning that it is not translated."""
    diags, _ = diagnostics("serviceentry-valid.yaml")
    assert [d.field for d in diags if d.resource.endswith("/wildcard-dynamic")] == ["spec.resolution"]
    bad, _ = diagnostics("serviceentry-invalid.yaml")
    assert {d.field for d in bad if d.resource.endswith("/dynamic-not-wildcard") and d.severity == "error"} == {
        "spec.hosts[0]", "spec.ports[0].protocol"}


def test_dns_service_entry_rejects_a_unix_endpoint():
    """ValidateServiceEntry, case DNS/DNS_ROUND_ROBIN: an endpoint address must be
    an IP or an FQDN (netutil.IsValidIPAddress, agent.ValidateFQDN), so a
    unix:// socket is "not a valid FQDN or an IP address"; STATIC allows it."""
    diags, _ = diagnostics("serviceentry-invalid.yaml")
    [e] = find(diags, "dns-unix", "spec.endpoints[0].address")
    assert e.line == 14
    static = fixture("serviceentry-invalid.yaml").split("\n---\n")[0].replace("resolution: DNS", "resolution: STATIC")
    assert not [d for d in validate(MeshConfig(parse_documents(static))) if d.severity == "error"]


def test_empty_label_key_in_a_selector():
    """ValidateAlphaWorkloadSelector (ServiceEntry) and validateWorkloadSelector
    (DestinationRule, RequestAuthentication): "empty key is not supported in selector"."""
    for name, res, field in (("serviceentry-invalid.yaml", "empty-key", "spec.workloadSelector.labels"),
                             ("destinationrule-invalid.yaml", "empty-label-key", "spec.workloadSelector.matchLabels"),
                             ("reqauth-invalid.yaml", "empty-key", "spec.selector.matchLabels")):
        diags, _ = diagnostics(name)
        [e] = find(diags, res, field)
        assert e.message.startswith("empty key is not supported in selector")


def test_request_authentication_target_ref():
    """validatePolicyTargetReference: no namespace ("cross namespace referencing
    is not supported"), and group/kind one of allowedTargetRefs (core Service,
    ServiceEntry, Gateway API Gateway and GatewayClass)."""
    diags, _ = diagnostics("reqauth-invalid.yaml")
    assert find(diags, "bad-target-namespace", "spec.targetRef.namespace")[0].line == 12
    assert "but was apps/Service" in find(diags, "bad-target-group", "spec.targetRef")[0].message
    assert "but was /Deployment" in find(diags, "bad-target-kind", "spec.targetRefs[0]")[0].message
    ok, _ = diagnostics("reqauth-valid.yaml")
    assert not find(ok, "jwt-scopes", "spec.targetRef")   # a Gateway API Gateway, same namespace


def test_space_delimited_claims_is_accepted():
    """istio/api request_authentication.proto JWTRule `space_delimited_claims`
    (field 14): a list of claim names; no rule in validateJwtRule. Accepted,
    with a warning that the translator does not pass it to jwt_authn."""
    diags, _ = diagnostics("reqauth-valid.yaml")
    [w] = find(diags, "jwt-scopes", "spec.jwtRules[0].spaceDelimitedClaims", "warning")
    assert w.line == 16


def test_wasm_plugin_rules_run_for_remote_modules():
    """ValidateWasmPlugin accepts http/https/oci URLs (validateWasmPluginURL), so
    they are a warning here, and the other rules still run: the CRD's minLength 1
    for imagePullSecret and pluginName, validateWasmPluginVMConfig's "duplicate
    env" and "value may only be set when valueFrom is INLINE"."""
    diags, _ = diagnostics("wasm-invalid.yaml")
    assert find(diags, "invalid-image-pull-secret", "spec.imagePullSecret")[0].line == 9
    assert find(diags, "duplicate-env", "spec.vmConfig.env[1].name")[0].message == "duplicate env"
    assert find(diags, "value-from-host", "spec.vmConfig.env[0].value")
    assert find(diags, "duplicate-env", "spec.url", "warning")
    ok, _ = diagnostics("wasm-valid.yaml")
    assert not [d for d in ok if d.severity == "error"]   # valueFrom HOST without value; INLINE with value


def test_header_presence_match_is_accepted():
    """istio/api virtual_service.proto HTTPMatchRequest.headers: "If the value is
    empty and only the name of header is specified, presence of the header is
    checked" (`x-canary: {}`); validateHTTPMatch accepts it."""
    diags, resources = diagnostics("virtualservice-valid.yaml")
    assert resources["reviews-presence"].spec["http"][0]["match"][0]["headers"] == {"x-canary": {}}
    assert diags == []


def vs_with_prefixes(*routes: str) -> str:
    http = "".join(f"  - {r}\n    route:\n    - destination: {{host: reviews}}\n" for r in routes)
    return ("apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: r, namespace: ns}\n"
            f"spec:\n  hosts: [reviews]\n  http:\n{http}")


def test_ineffective_overlapping_prefix_match():
    """analyzeUnreachableHTTPRules with genMatchHTTPRoutes/coveredValidation: a
    later prefix match an earlier shorter prefix takes (same port, method,
    authority, headers) is IST0131 "... match #0 of prefix /debugs is not used
    (duplicate/overlapping match in rule #0 of prefix /debug on #0)"."""
    text = vs_with_prefixes("match: [{uri: {prefix: /debug}}]", "match: [{uri: {prefix: /debugs}}]")
    [d] = [d for d in validate(MeshConfig(parse_documents(text, file="vs.yaml"))) if d.code == "IST0131"]
    assert (d.field, d.line, d.severity) == ("spec.http[1].match[0].uri.prefix", 10, "info")
    assert d.message == ("VirtualService rule #1 match #0 of prefix /debugs is not used "
                         "(duplicate/overlapping match in rule #0 of prefix /debug on #0)")
    # A header condition only the later match has: not covered (header counts differ).
    text = vs_with_prefixes("match: [{uri: {prefix: /debug}}]",
                            "match: [{uri: {prefix: /debugs}, headers: {x: {exact: a}}}]")
    assert not [d for d in validate(MeshConfig(parse_documents(text))) if d.code == "IST0131"]


def test_malformed_yaml_is_still_an_error():
    with pytest.raises(ConfigError) as e:
        parse_documents("apiVersion: v1\nkind: X\nmetadata: {name: a}\nspec: {a: [x: y: z]}\n", file="bad.yaml")
    assert e.value.diagnostics[0].file == "bad.yaml" and e.value.diagnostics[0].line == 4


# Analyzer inputs and the (code, resource, field) of every IST message they must give, no more.
ANALYZER_TABLE = [
    ("ist0132-namespace-scoped-gateway-hosts.yaml", [
        ("IST0132", "VirtualService/bookinfo/shop", "spec.gateways[0]")]),
    ("ist0109-exportto-and-wildcards.yaml", [
        ("IST0101", "VirtualService/default/local-wildcard", "spec.http[0].route[0].destination.host"),
        ("IST0101", "VirtualService/other/global-wildcard", "spec.http[0].route[0].destination.host"),
        ("IST0101", "VirtualService/team-a/ratings", "spec.http[0].route[0].destination.host"),
        ("IST0101", "VirtualService/team-b/ratings", "spec.http[0].route[0].destination.host"),
        ("IST0109", "VirtualService/default/local-wildcard", "spec.hosts[0]"),
        ("IST0109", "VirtualService/other/global-wildcard", "spec.hosts[0]")]),
    ("ist0145-selector-subset.yaml", [
        ("IST0145", "Gateway/istio-system/gw-a", "spec.servers[0]"),
        ("IST0145", "Gateway/istio-system/gw-b", "spec.servers[0]")]),
    ("ist0101-exportto-hides-service-entry.yaml", [
        ("IST0101", "VirtualService/bookinfo/api", "spec.tls[0].route[0].destination.host")]),
    ("ist0101-references-of-an-invalid-resource.yaml", [
        ("IST0101", "VirtualService/bookinfo/reviews", "spec.http[0].route[0].destination.subset")]),
]


def analyzed(name: str) -> list:
    from mcp26.mesh.cli_validate import run
    diags, _ = run([os.path.join(DATA, "analyze", name)], analyze=True)
    return diags


@pytest.mark.parametrize("name,expected", ANALYZER_TABLE, ids=[n for n, _ in ANALYZER_TABLE])
def test_analyzer_table(name, expected):
    """Each input gives exactly the IST codes istioctl analyze gives for it."""
    diags = analyzed(name)
    assert sorted((d.code, d.resource, d.field) for d in diags if d.code.startswith("IST")) == sorted(expected)


def test_ist0132_honours_namespace_scoped_gateway_hosts():
    """GatewayAnalyzer.analyzeVirtualService, vsHostInGateway: per gateway in
    spec.gateways; sanitizeServerHostNamespace makes `./h` the Gateway's
    namespace's, host.NamesForNamespace keeps `ns/h` for VirtualServices in ns.
    Message "one or more host %v defined in VirtualService %s not found in Gateway %s."."""
    [d] = [d for d in analyzed("ist0132-namespace-scoped-gateway-hosts.yaml") if d.code == "IST0132"]
    assert (d.line, d.severity) == (26, "warning")
    assert d.message == ("one or more host [shop.example.com] defined in VirtualService bookinfo/shop "
                         "not found in Gateway istio-system/edge.")


def test_ist0109_exportto_and_overlapping_wildcards():
    """ConflictingMeshGatewayHostsAnalyzer: hosts scoped by exportTo
    (initMeshGatewayHosts); a namespace-scoped host conflicts with each host
    exported to all namespaces it Matches (getExportToAllNamespacesVSListForScopedHost):
    `*.productpage.d` (exportTo ".") with `*.d`; one host in two namespaces,
    each exported to ".", does not conflict."""
    found = [d for d in analyzed("ist0109-exportto-and-wildcards.yaml") if d.code == "IST0109"]
    assert {d.resource for d in found} == {"VirtualService/default/local-wildcard", "VirtualService/other/global-wildcard"}
    assert all("VirtualServices default/local-wildcard,other/global-wildcard associated with mesh gateway define "
               "the same host *.productpage.d" in d.message and d.severity == "error" for d in found)


def test_ist0145_selector_subset():
    """ConflictingGatewayAnalyzer.analyzeGateway: selectors equal, or one
    containing the other (and a workload both select), on one port with a host
    in common; message "Conflict with gateways %s (workload selector %s, port %s, hosts %v)."."""
    found = {d.resource: d for d in analyzed("ist0145-selector-subset.yaml") if d.code == "IST0145"}
    assert found["Gateway/istio-system/gw-b"].message == (
        "Conflict with gateways istio-system/gw-a (workload selector app=edge,istio=ingressgateway, port 80, "
        "hosts shop.example.com).")
    assert found["Gateway/istio-system/gw-a"].line == 8


def test_export_to_dot_hides_a_service_entry():
    """util.GetDestinationHost over InitServiceEntryHostMap: a ServiceEntry with
    exportTo ["."] is visible in its own namespace only, so a reference from
    another namespace is IST0101 "Referenced host not found"."""
    [d] = [d for d in analyzed("ist0101-exportto-hides-service-entry.yaml") if d.code == "IST0101"]
    assert (d.resource, d.line, d.message) == ("VirtualService/bookinfo/api", 23,
                                               'Referenced host not found: "api.example.com"')


def test_references_of_an_invalid_resource_are_analyzed():
    """istioctl analyze reports a resource's schema/webhook error and its
    analyzer messages both (the analyzers run over every parsed resource)."""
    diags = analyzed("ist0101-references-of-an-invalid-resource.yaml")
    assert sorted((d.code, d.field, d.line) for d in diags if d.severity == "error") == [
        ("", "spec.http[0].route[0].weight", 10), ("IST0101", "spec.http[0].route[0].destination.subset", 9)]
