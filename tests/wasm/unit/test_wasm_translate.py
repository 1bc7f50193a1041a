"""RequestAuthentication -> jwt_authn and WasmPlugin -> ECDS Wasm filter translation."""
import base64
import hashlib
import json
import os

import pytest
from google.protobuf import wrappers_pb2
from envoy.extensions.filters.http.jwt_authn.v3 import config_pb2 as jwt
from envoy.extensions.filters.http.wasm.v3 import wasm_pb2 as http_wasm
from envoy.extensions.wasm.v3 import wasm_pb2

from mcp26.mesh.resources import MeshConfig
from mcp26.mesh.parse import parse_documents
from mcp26.mesh.diagnostics import ConfigError
from mcp26.mesh.header_contract import JWT_PAYLOAD_METADATA_KEY
from mcp26.xds.model import type_urls
from mcp26.xds.translate import NO_OVERLAY, Overlay, Phase, authn, http_filters, wasm_plugins
from mcp26.xds.wasm_modules import WasmModuleStore
from mcp26.xds.model.node import ProxyNode
from mcp26.wasm import HEADER_CONTRACT_WASM

GW = ProxyNode(id="gw", namespace="default", labels={"istio": "ingressgateway"})
JWKS = '{"keys": [{"kty": "RSA", "kid": "k", "n": "AQAB", "e": "AQAB"}]}'


def cfg(text: str) -> MeshConfig:
    return MeshConfig(parse_documents(text, file="t.yaml"))


def _loaded(config: MeshConfig) -> Overlay:
    """The config's Wasm modules, read as the control plane reads them when it loads a config."""
    return Overlay(wasm_modules=WasmModuleStore().load(config))


RA = f"""apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{name: ra, namespace: default}}
spec:
  selector: {{matchLabels: {{istio: ingressgateway}}}}
  jwtRules:
  - issuer: https://a.test
    audiences: [mesh]
    jwks: '{JWKS}'
    forwardOriginalToken: true
    fromHeaders: [{{name: x-token, prefix: "Bearer "}}]
    outputClaimToHeaders: [{{header: x-email, claim: email}}]
  - issuer: https://b.test
    jwksUri: https://keys.b.test/jwks.json
  - issuer: https://c.test
    jwksUri: http://127.0.0.1:8123/jwks
"""


def _wasm_filters(config, node, port) -> list:
    """Every phase's Wasm filters, in chain order."""
    return [f for phase in Phase for f in wasm_plugins.http_filters(config, node, port, phase)]


def _jwt_config(filters) -> jwt.JwtAuthentication:
    (f,) = [f for f in filters if f.name == "envoy.filters.http.jwt_authn"]
    out = jwt.JwtAuthentication()
    f.typed_config.Unpack(out)
    return out


def test_jwt_rules_become_providers_with_istio_requirements():
    c = _jwt_config(authn.http_filters(cfg(RA), GW, 8080, Phase.AUTHN))
    assert sorted(c.providers) == ["default/ra/0", "default/ra/1", "default/ra/2"]
    a = c.providers["default/ra/0"]
    assert a.issuer == "https://a.test" and list(a.audiences) == ["mesh"] and a.forward
    assert a.local_jwks.inline_string == JWKS
    assert (a.from_headers[0].name, a.from_headers[0].value_prefix) == ("x-token", "Bearer ")
    assert (a.claim_to_headers[0].header_name, a.claim_to_headers[0].claim_name) == ("x-email", "email")
    assert a.payload_in_metadata == JWT_PAYLOAD_METADATA_KEY and a.clear_route_cache
    b = c.providers["default/ra/1"]
    assert b.remote_jwks.http_uri.cluster == "jwks|keys.b.test|443"
    assert b.remote_jwks.HasField("async_fetch")
    (rule,) = c.rules
    reqs = rule.requires.requires_any.requirements
    assert [r.provider_name for r in reqs[:-1]] == sorted(c.providers)
    assert reqs[-1].HasField("allow_missing")   # no token passes; a bad one does not


def test_jwks_uri_clusters_are_added_to_the_snapshot():
    clusters = authn.resources(cfg(RA), GW, NO_OVERLAY)[type_urls.CLUSTER]
    tls = clusters["jwks|keys.b.test|443"]
    assert tls.type == tls.LOGICAL_DNS and tls.transport_socket.name == "envoy.transport_sockets.tls"
    ip = clusters["jwks|127.0.0.1|8123"]
    assert ip.type == ip.STATIC
    ep = ip.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address
    assert (ep.address, ep.port_value) == ("127.0.0.1", 8123)


@pytest.mark.parametrize("node, applies", [
    (GW, True),
    (ProxyNode(id="x", namespace="default", labels={"app": "reviews"}), False),
    (ProxyNode(id="y", namespace="other", labels={"istio": "ingressgateway"}), False),
])
def test_selector_and_namespace_decide_which_proxies_get_jwt_authn(node, applies):
    names = [f.name for f in authn.http_filters(cfg(RA), node, 80, Phase.AUTHN)]
    assert ("envoy.filters.http.jwt_authn" in names) == applies
    root = cfg(RA.replace("namespace: default", "namespace: istio-system"))
    assert bool(authn.http_filters(root, node, 80, Phase.AUTHN)) == (node.labels.get("istio") == "ingressgateway")


WASM = str(HEADER_CONTRACT_WASM)


def plugin(name="contract", phase="AUTHZ", priority=0, fail="FAIL_CLOSE", sha=None, plugin_name="mcp-header-contract",
           extra=""):
    data = open(WASM, "rb").read()
    sha = sha or hashlib.sha256(data).hexdigest()
    key = base64.b64encode(b"k" * 32).decode()
    return f"""apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {{name: {name}, namespace: default}}
spec:
  selector: {{matchLabels: {{istio: ingressgateway}}}}
  url: file://{os.path.abspath(WASM)}
  sha256: "{sha}"
  phase: {phase}
  priority: {priority}
  failStrategy: {fail}
  pluginName: {plugin_name}
  pluginConfig: {{sessionKey: {key}}}
{extra}"""


needs_wasm = pytest.mark.skipif(not os.path.exists(WASM), reason="run `make wasm` first")


@needs_wasm
def test_wasm_plugin_is_an_ecds_filter_and_a_typed_extension_config():
    c = cfg(RA + "---\n" + plugin())
    (f,) = _wasm_filters(c, GW, 8080)
    assert f.name == "default.contract" and not f.HasField("typed_config")
    assert list(f.config_discovery.type_urls) == [wasm_plugins.WASM_TYPE_URL]
    assert f.config_discovery.config_source.HasField("ads")
    tec = wasm_plugins.resources(c, GW, _loaded(c))[type_urls.EXTENSION_CONFIG]["default.contract"]
    w = http_wasm.Wasm()
    tec.typed_config.Unpack(w)
    assert w.config.vm_config.runtime == "envoy.wasm.runtime.v8"
    assert w.config.vm_config.code.local.inline_bytes == open(WASM, "rb").read()
    assert w.config.failure_policy == wasm_pb2.FAIL_CLOSED
    sv = wrappers_pb2.StringValue()
    w.config.configuration.Unpack(sv)
    pushed = json.loads(sv.value)
    assert {"claim": "email", "header": "x-email"} in pushed["claims"]    # outputClaimToHeaders merged in
    assert "x-email" in pushed["strip"]
    assert pushed["session"]["key"] == (b"k" * 32).hex()


@needs_wasm
def test_phase_then_priority_order_and_authn_phase_before_jwt_authn():
    c = cfg(RA + "---\n" + plugin("low", priority=1, plugin_name="other") + "---\n"
            + plugin("high", priority=10, plugin_name="other") + "---\n"
            + plugin("stats", phase="STATS", priority=99, plugin_name="other") + "---\n"
            + plugin("early", phase="AUTHN", plugin_name="other"))
    chain = [f.name for f in http_filters.phase_filters(c, GW, 80)]
    assert [n for n in chain if n.startswith("default.") or n == "envoy.filters.http.jwt_authn"] == [
        "default.early", "envoy.filters.http.jwt_authn", "default.high", "default.low", "default.stats"]


@needs_wasm
def test_fail_open_and_port_match():
    c = cfg(plugin(fail="FAIL_OPEN", plugin_name="other", extra="  match: [{ports: [{number: 9090}]}]\n"))
    assert _wasm_filters(c, GW, 8080) == []
    assert [f.name for f in _wasm_filters(c, GW, 9090)] == ["default.contract"]
    w = http_wasm.Wasm()
    wasm_plugins.resources(c, GW, _loaded(c))[type_urls.EXTENSION_CONFIG]["default.contract"].typed_config.Unpack(w)
    assert w.config.failure_policy == wasm_pb2.FAIL_OPEN


@needs_wasm
def test_a_module_whose_sha256_does_not_match_is_not_translated():
    c = cfg(plugin(sha="0" * 64))
    with pytest.raises(ConfigError, match="sha256"):
        wasm_plugins.resources(c, GW, _loaded(c))


@needs_wasm
def test_an_empty_sha256_is_unset_as_istio_reads_it():
    """proto3: "" is no sha256; validation warns the module is not pinned, and it is translated."""
    c = cfg(plugin(sha="@").replace('sha256: "@"', 'sha256: ""'))
    assert wasm_plugins.resources(c, GW, _loaded(c))


@needs_wasm
def test_target_ref_resources_apply_to_no_proxy_and_vm_env_is_passed():
    ra = RA.replace("  selector: {matchLabels: {istio: ingressgateway}}\n", "  targetRef: {kind: Gateway, name: gw}\n")
    assert authn.http_filters(cfg(ra), GW, 80, Phase.AUTHN) == []
    wp = plugin(plugin_name="other", extra="  vmConfig:\n    env:\n    - {name: MODE, value: strict}\n    - {name: HOME, valueFrom: HOST}\n")
    w = http_wasm.Wasm()
    wasm_plugins.resources(cfg(wp), GW, _loaded(cfg(wp)))[type_urls.EXTENSION_CONFIG]["default.contract"].typed_config.Unpack(w)
    env = w.config.vm_config.environment_variables
    assert dict(env.key_values) == {"MODE": "strict"} and list(env.host_env_keys) == ["HOME"]
    tr = plugin(plugin_name="other").replace("  selector: {matchLabels: {istio: ingressgateway}}\n", "  targetRefs: [{kind: Gateway, name: gw}]\n")
    assert _wasm_filters(cfg(tr), GW, 80) == []
