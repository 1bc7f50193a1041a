"""tests/data/manifests/, the Istio shapes e2e stacks share (harness.manifests): each file, filled
in, is a resource mesh validates, and a placeholder a caller misses or misspells is refused
naming the file, before any stack starts."""
import base64
import os

import pytest

from harness.manifests import MANIFESTS, documents, manifest, wasm_module
from mcp26.wasm import HEADER_CONTRACT_WASM
from mcp26.demo.stack.tokens import Issuer
from mcp26.mesh.change_set import load_texts

VALUES = {"gw_port": 8080, "name": "echo", "number": 80, "port_name": "http", "protocol": "HTTP",
          "upstream": 9090, "host": "echo.mesh.local", "issuer": "https://issuer.test", "audience": "mesh",
          "jwks": Issuer("k1", "https://issuer.test", "mesh").jwks,
          "plugin_config": {"sessionKey": base64.b64encode(b"k" * 32).decode()}}


def test_every_shared_manifest_filled_in_is_a_valid_config():
    if not os.path.exists(HEADER_CONTRACT_WASM):
        pytest.skip(f"{HEADER_CONTRACT_WASM} is not built (make wasm): the WasmPlugin names it")
    values = {**VALUES, **wasm_module(HEADER_CONTRACT_WASM)}
    files = sorted(p.name for p in MANIFESTS.glob("*.yaml"))
    assert files, MANIFESTS
    texts = {}
    for name in files:
        text = (MANIFESTS / name).read_text()
        texts[name] = manifest(name, **{k: v for k, v in values.items() if "$" + k in text})
    config = load_texts({"stack.yaml": documents(*texts.values())})
    kinds = sorted(r.kind for r in config.resources)
    assert kinds == ["Gateway", "RequestAuthentication", "ServiceEntry", "VirtualService", "WasmPlugin"], kinds


def test_a_placeholder_without_a_value_names_the_file_and_the_placeholder():
    with pytest.raises(KeyError) as e:
        manifest("service_entry.yaml", name="echo", number=80, port_name="http", protocol="HTTP")
    assert str(MANIFESTS / "service_entry.yaml") in str(e.value) and "$upstream" in str(e.value)


def test_a_value_no_placeholder_takes_is_refused():
    with pytest.raises(KeyError) as e:
        manifest("gateway.yaml", gw_port=8080, gw_prot=8081)
    assert str(MANIFESTS / "gateway.yaml") in str(e.value) and "gw_prot" in str(e.value)


def test_a_dict_is_written_as_json_and_documents_are_joined():
    text = manifest("header_contract_plugin.yaml", wasm="/x.wasm", sha256="ab", plugin_config={"a": [1, "b"]})
    assert 'pluginConfig: {"a": [1, "b"]}' in text and "url: file:///x.wasm" in text
    assert documents("a: 1", "b: 2\n") == "a: 1\n---\nb: 2\n"
