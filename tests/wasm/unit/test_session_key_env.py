"""The header contract's session key from Envoy's environment (sessionKeyFrom.env),
so that neither Envoy's config dump nor the control plane's holds it."""
import base64
import hashlib
import json
import os

import pytest
from envoy.extensions.filters.http.wasm.v3 import wasm_pb2 as http_wasm

from mcp26.mesh.header_contract import ContractError, parse_plugin_config
from mcp26.mesh.parse import parse_documents
from mcp26.mesh.resources import MeshConfig
from mcp26.mesh.session import verify_session
from mcp26.mesh.validation import validate
from mcp26.wasm import HEADER_CONTRACT_WASM
from mcp26.wasm.host import ProxyWasmHost
from mcp26.xds.model import type_urls
from mcp26.xds.cli import session_key_environ
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.translate import Overlay, wasm_plugins
from mcp26.xds.wasm_modules import WasmModuleStore

KEY = hashlib.sha256(b"unit session key from env").digest()
GW = ProxyNode(id="gw", namespace="default", labels={"istio": "ingressgateway"})
BASE = [(":method", "GET"), (":path", "/x"), (":authority", "mesh")]
needs_wasm = pytest.mark.skipif(not os.path.exists(HEADER_CONTRACT_WASM), reason="run `make wasm` first")


def _secrets(text: str) -> list[str]:
    return [s for s in (KEY.hex(), base64.b64encode(KEY).decode()) if s in text]


def test_key_from_env_names_the_variable_and_holds_no_key():
    c = parse_plugin_config({"sessionKeyFrom": {"env": "MESH_KEY"}})
    assert c.session_key == b"" and c.host_env_keys == ["MESH_KEY"]
    session = json.loads(c.filter_json())["session"]
    assert session["key_env"] == "MESH_KEY" and "key" not in session
    # the inline key still works, and names no variable
    inline = parse_plugin_config({"sessionKeyHex": KEY.hex()})
    assert inline.host_env_keys == [] and json.loads(inline.filter_json())["session"]["key"] == KEY.hex()


@pytest.mark.parametrize("cfg, field, words", [
    ({"sessionKeyFrom": {"env": "1BAD"}}, "spec.pluginConfig.sessionKeyFrom.env", "environment variable name"),
    ({"sessionKeyFrom": {"env": "A" * 65}}, "spec.pluginConfig.sessionKeyFrom.env", "environment variable name"),
    ({"sessionKeyFrom": {"env": "K", "file": "/k"}}, "spec.pluginConfig.sessionKeyFrom", "{env: NAME}"),
    ({"sessionKeyFrom": "K"}, "spec.pluginConfig.sessionKeyFrom", "{env: NAME}"),
    ({"sessionKeyFrom": {"env": "K"}, "sessionKeyHex": KEY.hex()}, "spec.pluginConfig.sessionKeyFrom", "one of"),
    ({}, "spec.pluginConfig.sessionKey", "sessionKeyFrom"),
])
def test_bad_key_sources_are_rejected(cfg, field, words):
    with pytest.raises(ContractError) as e:
        parse_plugin_config(cfg)
    assert any(f == field and words in m for f, m in e.value.problems), e.value.problems


def _plugin(plugin_config: dict, extra: str = "") -> str:
    sha = hashlib.sha256(open(HEADER_CONTRACT_WASM, "rb").read()).hexdigest()
    return f"""apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {{name: contract, namespace: default}}
spec:
  selector: {{matchLabels: {{istio: ingressgateway}}}}
  url: file://{os.path.abspath(HEADER_CONTRACT_WASM)}
  sha256: "{sha}"
  phase: AUTHZ
  pluginName: mcp-header-contract
{extra}  pluginConfig: {json.dumps(plugin_config)}
"""


def _errors(text):
    return [d for d in validate(MeshConfig(parse_documents(text, file="w.yaml"))) if d.severity == "error"]


@needs_wasm
def test_validation_accepts_env_and_refuses_an_inline_value_of_that_variable():
    assert _errors(_plugin({"sessionKeyFrom": {"env": "MESH_KEY"}})) == []
    assert _errors(_plugin({"sessionKeyFrom": {"env": "MESH_KEY"}},
                           "  vmConfig:\n    env:\n    - {name: MESH_KEY, valueFrom: HOST}\n")) == []
    errs = _errors(_plugin({"sessionKeyFrom": {"env": "MESH_KEY"}},
                           f"  vmConfig:\n    env:\n    - {{name: MESH_KEY, value: '{KEY.hex()}'}}\n"))
    assert [d.field for d in errs] == ["spec.vmConfig.env[0]"] and "config dump" in errs[0].message, errs
    errs = _errors(_plugin({"sessionKeyFrom": {"env": "9"}}))
    assert [d.field for d in errs] == ["spec.pluginConfig.sessionKeyFrom.env"], errs


@needs_wasm
def test_translation_passes_the_variable_by_name_and_the_key_nowhere():
    config = MeshConfig(parse_documents(_plugin({"sessionKeyFrom": {"env": "MESH_KEY"}},
                                                "  vmConfig:\n    env:\n    - {name: MESH_KEY, valueFrom: HOST}\n"),
                                        file="w.yaml"))
    overlay = Overlay(wasm_modules=WasmModuleStore().load(config))      # read when the config is loaded
    tec = wasm_plugins.resources(config, GW, overlay)[type_urls.EXTENSION_CONFIG]["default.contract"]
    w = http_wasm.Wasm()
    tec.typed_config.Unpack(w)
    env = w.config.vm_config.environment_variables
    assert list(env.host_env_keys) == ["MESH_KEY"] and dict(env.key_values) == {}   # once, not twice
    from google.protobuf import wrappers_pb2
    sv = wrappers_pb2.StringValue()
    w.config.configuration.Unpack(sv)
    assert json.loads(sv.value)["session"]["key_env"] == "MESH_KEY"
    assert _secrets(sv.value) == []


@needs_wasm
def test_the_filter_reads_the_key_from_its_environment_and_signs_with_it():
    cfg = parse_plugin_config({"sessionKeyFrom": {"env": "MESH_KEY"}}).filter_json()
    h = ProxyWasmHost(environ={"OTHER": "x", "MESH_KEY": KEY.hex()})
    assert h.configure(cfg), h.logs
    r = h.request(BASE, metadata={"sub": "jane"})
    assert verify_session(r.headers, KEY).end_user == "jane"
    with pytest.raises(Exception):
        verify_session(r.headers, b"another key of 32 bytes.........")


@needs_wasm
@pytest.mark.parametrize("environ, words", [
    ({}, "not set"),
    ({"MESH_KEY": "zz" * 32}, "hex"),
    ({"MESH_KEY": "ab" * 4}, "16..64 bytes"),
])
def test_the_filter_fails_closed_without_a_good_key_in_its_environment(environ, words):
    h = ProxyWasmHost(environ=environ)
    assert not h.configure(parse_plugin_config({"sessionKeyFrom": {"env": "MESH_KEY"}}).filter_json())
    assert any(words in msg for _, msg in h.logs), h.logs


def test_envoy_run_reads_a_0600_key_file_and_refuses_a_readable_one(tmp_path):
    f = tmp_path / "session.key"
    f.write_bytes(KEY)
    os.chmod(f, 0o600)
    assert session_key_environ(str(f)) == {"MCP_SESSION_KEY": KEY.hex()}
    assert session_key_environ(str(f), "MESH_KEY") == {"MESH_KEY": KEY.hex()}
    os.chmod(f, 0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        session_key_environ(str(f))
    os.chmod(f, 0o600)
    f.write_bytes(b"short")
    with pytest.raises(ValueError, match="5 bytes"):
        session_key_environ(str(f))
    with pytest.raises(ValueError, match="not an environment variable name"):
        session_key_environ(str(f), "A-B")
