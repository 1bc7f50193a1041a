"""`mcpctl validate` on RequestAuthentication and WasmPlugin: file:line, resource, field."""
import base64
import hashlib
import os

import pytest

from mcp26.mesh.resources import MeshConfig
from mcp26.mesh.parse import parse_documents
from mcp26.mesh.validation import validate
from mcp26.wasm import HEADER_CONTRACT_WASM

WASM = os.path.abspath(str(HEADER_CONTRACT_WASM))
KEY = base64.b64encode(b"k" * 32).decode()


def errors(text):
    return [d for d in validate(MeshConfig(parse_documents(text, file="sec.yaml"))) if d.severity == "error"]


def wasm_plugin(plugin_config: str, extra: str = "", sha: str | None = None) -> str:
    sha = sha or (hashlib.sha256(open(WASM, "rb").read()).hexdigest() if os.path.exists(WASM) else "0" * 64)
    return f"""apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata:
  name: contract
  namespace: default
spec:
  url: file://{WASM}
  sha256: "{sha}"
  pluginName: mcp-header-contract
{extra}  pluginConfig:
{plugin_config}"""


needs_wasm = pytest.mark.skipif(not os.path.exists(WASM), reason="run `make wasm` first")


@needs_wasm
def test_a_good_plugin_is_accepted():
    assert errors(wasm_plugin(f"    sessionKey: {KEY}\n    tenants:\n      acme: {{allowedHeaders: [x-tenant-acme-*]}}\n")) == []


@needs_wasm
@pytest.mark.parametrize("body, line, field, words", [
    ("    sessionKey: c2hvcnQ=\n", 11, "spec.pluginConfig.sessionKey", "5 bytes"),
    ("    sessionKey: '@@'\n", 11, "spec.pluginConfig.sessionKey", "base64"),
    (f"    sessionKey: {KEY}\n    tenants:\n      acme:\n        allowedHeaders:\n        - x-tenant-acme-a\n        - 'Bad Header'\n",
     16, "spec.pluginConfig.tenants.acme.allowedHeaders[1]", "RFC 7230"),
    (f"    sessionKey: {KEY}\n    tenants:\n      acme: {{allowedHeaders: ['x-tenant-*']}}\n",
     13, "spec.pluginConfig.tenants.acme.allowedHeaders[0]", "every tenant"),
    (f"    sessionKey: {KEY}\n    qos:\n      tiers:\n        gold: platinum\n", 14, "spec.pluginConfig.qos.tiers.gold", "unknown QoS class"),
    (f"    sessionKey: {KEY}\n    errorClasses:\n      UNAVAILBLE: overload\n", 13, "spec.pluginConfig.errorClasses.UNAVAILBLE", "gRPC status"),
    (f"    sessionKey: {KEY}\n    errorClasses:\n      UNAVAILABLE: meltdown\n", 13, "spec.pluginConfig.errorClasses.UNAVAILABLE", "error class"),
    (f"    sessionKey: {KEY}\n    claims:\n    - {{claim: role, header: x-mcp-qos-class}}\n", 13, "spec.pluginConfig.claims[0].header", "set by the mesh"),
    (f"    sessionKey: {KEY}\n    sesionKey: x\n", 12, "spec.pluginConfig.sesionKey", "unknown field"),
])
def test_bad_plugin_config_is_named_by_file_line_and_field(body, line, field, words):
    errs = errors(wasm_plugin(body))
    match = [d for d in errs if d.field == field]
    assert match, [str(d) for d in errs]
    d = match[0]
    assert (d.file, d.line, d.resource) == ("sec.yaml", line, "WasmPlugin/default/contract")
    assert words in d.message


@needs_wasm
def test_header_contract_must_run_after_authn_and_fail_closed():
    errs = errors(wasm_plugin(f"    sessionKey: {KEY}\n", extra="  phase: AUTHN\n  failStrategy: FAIL_OPEN\n"))
    assert {d.field for d in errs} == {"spec.phase", "spec.failStrategy"}


def test_module_problems_are_named():
    errs = errors(wasm_plugin(f"    sessionKey: {KEY}\n", sha="1" * 64))
    assert any(d.field == "spec.sha256" for d in errs) or any(d.field == "spec.url" for d in errs)
    # An oci:// module is valid for Istio (ValidateWasmPlugin accepts the scheme):
    # a warning that says the control plane does not fetch it, and no error.
    oci = wasm_plugin(f"    sessionKey: {KEY}\n").replace(f"file://{WASM}", "oci://registry/x:1")
    assert errors(oci) == []
    warned = [d for d in validate(MeshConfig(parse_documents(oci, file="sec.yaml"))) if d.severity == "warning"]
    assert [d.field for d in warned] == ["spec.url"] and "file://" in warned[0].message
    errs = errors(wasm_plugin(f"    sessionKey: {KEY}\n").replace(f"file://{WASM}", "file:///nonexistent.wasm"))
    assert [d.field for d in errs] == ["spec.url"]


RA = """apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: ra, namespace: default}
spec:
  jwtRules:
  - issuer: https://a.test
%s"""


@pytest.mark.parametrize("rule, field, words", [
    ("    jwksUri: ftp://keys\n", "spec.jwtRules[0].jwksUri", "http or https"),
    ("    jwks: 'not json'\n", "spec.jwtRules[0].jwks", "JSON Web Key Set"),
    ("    audiences: []\n", "spec.jwtRules[0]", "jwks or jwksUri"),
    ("    jwks: '{\"keys\":[{}]}'\n    outputClaimToHeaders:\n    - {header: x-mcp-session-sig, claim: sub}\n",
     "spec.jwtRules[0].outputClaimToHeaders[0].header", "set by the mesh"),
    ("    jwks: '{\"keys\":[{}]}'\n    outputClaimToHeaders:\n    - {header: 'a b', claim: sub}\n",
     "spec.jwtRules[0].outputClaimToHeaders[0].header", "RFC 7230"),
    ("    jwks: '{\"keys\":[{}]}'\n    fromHeaders: [{name: 'x y'}]\n", "spec.jwtRules[0].fromHeaders[0].name", "RFC 7230"),
    ("    jwks: '{\"keys\":[{}]}'\n    bogus: 1\n", "spec.jwtRules[0].bogus", ""),
])
def test_bad_request_authentication_fields(rule, field, words):
    errs = errors(RA % rule)
    match = [d for d in errs if d.field == field]
    assert match, [str(d) for d in errs]
    assert words in match[0].message and match[0].line > 0


def test_a_good_request_authentication_is_accepted():
    assert errors(RA % "    jwksUri: https://keys.a.test/jwks.json\n    audiences: [mesh]\n") == []


@needs_wasm
@pytest.mark.parametrize("sha, error, warning", [
    ("xyz", True, False),                  # malformed: the error, not also "no sha256"
    ("", False, True),                     # absent: only the warning
])
def test_a_malformed_sha256_is_an_error_and_not_also_reported_missing(sha, error, warning):
    text = wasm_plugin(f"    sessionKey: {KEY}\n", sha="@").replace('sha256: "@"', f'sha256: "{sha}"')
    found = [d for d in validate(MeshConfig(parse_documents(text, file="sec.yaml"))) if d.field == "spec.sha256"]
    assert any(d.severity == "error" and "64 lower-case hex" in d.message for d in found) == error, found
    assert any(d.severity == "warning" and "not pinned" in d.message for d in found) == warning, found
