"""The benchmark's Lua filter does what the Wasm module does (same Envoy, same requests)."""
import base64
import json
import os
import urllib.request

import pytest
from google.protobuf import json_format

from mcp26.mesh.resources import MeshConfig
from mcp26.mesh.parse import parse_documents
from mcp26.mesh.header_contract import parse_plugin_config
from mcp26.mesh import headers as H
from mcp26.mesh.session import verify_session
from mcp26.demo.stack.envoy import Envoy
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.tokens import Issuer
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.wasm import HEADER_CONTRACT_WASM
from mcp26.wasm.lua import lua_source
from mcp26.xds.translate import Overlay, Phase, authn, wasm_plugins
from mcp26.xds.wasm_modules import WasmModuleStore
from mcp26.xds.model.node import ProxyNode

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not os.path.exists(HEADER_CONTRACT_WASM), reason="run `make wasm` first")]
KEY = b"lua-equivalence-key-0123456789ab"
ROUTER = {"name": "envoy.filters.http.router",
          "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}


def test_lua_and_wasm_produce_the_same_headers():
    issuer = Issuer("k", "iss", "aud")
    plugin = {"sessionKey": base64.b64encode(KEY).decode(),
              "tenants": {"acme": {"allowedHeaders": ["x-tenant-acme-*"]}, "beta": {"allowedHeaders": [], "strict": True}},
              "qos": {"tiers": {"free": "batch"}}, "httpErrorClasses": {"404": "client"}}
    cfg = MeshConfig(parse_documents(f"""apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{name: ra, namespace: default}}
spec:
  jwtRules: [{{issuer: iss, audiences: [aud], jwks: '{issuer.jwks}'}}]
---
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {{name: c, namespace: default}}
spec:
  url: file://{HEADER_CONTRACT_WASM}
  pluginName: mcp-header-contract
  pluginConfig: {json.dumps(plugin)}
"""))
    node = ProxyNode(id="n")
    as_json = lambda m: json.loads(json_format.MessageToJson(m))   # noqa: E731
    jwt_f = [as_json(f) for f in authn.http_filters(cfg, node, 0, Phase.AUTHN)]
    wasm_f = [as_json(wasm_plugins.static_http_filter(cfg.of_kind("WasmPlugin")[0], cfg, node,
                                                   Overlay(wasm_modules=WasmModuleStore().load(cfg))))]
    lua_f = [{"name": "envoy.filters.http.lua", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
        "default_source_code": {"inline_string": lua_source(parse_plugin_config(plugin))}}}]
    ports = {"wasm": free_port(), "lua": free_port()}

    tok = issuer.token

    cases = [
        {},
        {"end-user": "admin", "x-mcp-qos-class": "latency-critical", "x-llm-priority": "high"},
        {"authorization": "Bearer " + tok(sub="jane", tenant="acme"), "x-tenant-acme-a": "1", "x-tenant-b-c": "2"},
        {"authorization": "Bearer " + tok(sub="bob", tenant="beta", tier="free"), "x-custom": "x", "x-llm-priority": "HIGH"},
        {"authorization": "Bearer " + tok(sub="eve", tenant="nobody"), "x-tenant-acme-a": "1", "x-llm-priority": "low"},
        {"authorization": "Bearer " + tok(sub=" jane ", tenant="acme")},   # not carriable: neither writes it
        {"authorization": "Bearer " + tok(sub="jane\t", tenant="acme")},
    ]
    with EchoUpstream("echo") as echo:
        def chain(filters, port):
            return {"name": str(port), "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                    "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "t", "route_config": {"virtual_hosts": [{"name": "a", "domains": ["*"], "routes": [
                            {"match": {"prefix": "/"}, "route": {"cluster": "echo"}}]}]},
                        "http_filters": jwt_f + filters + [ROUTER]}}]}]}
        boot = {"static_resources": {"listeners": [chain(wasm_f, ports["wasm"]), chain(lua_f, ports["lua"])],
                "clusters": [{"name": "echo", "type": "STATIC", "connect_timeout": "1s", "load_assignment": {
                    "cluster_name": "echo", "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                        "address": "127.0.0.1", "port_value": echo.port}}}}]}]}}]}}
        with Envoy(boot):
            for hdrs in cases:
                seen = {}
                for name, port in ports.items():
                    req = urllib.request.Request(f"http://127.0.0.1:{port}/x", headers=hdrs)
                    with urllib.request.urlopen(req, timeout=5) as r:
                        h = json.loads(r.read())["headers"]
                        # The v2 signature binds each request's own x-request-id and issue time, so the
                        # two filters' signatures differ by design: compare what they signed (h=), and
                        # check each one verifies for its own request.
                        sig = h[H.SESSION_SIG].split(";")
                        seen[name] = ({k: v for k, v in h.items() if k not in ("x-request-id", "host", H.SESSION_SIG)},
                                      sig[0], sig[2], r.headers.get("x-mcp-error-class"))
                    verify_session(h, KEY, method="GET")
                assert seen["wasm"] == seen["lua"], hdrs
