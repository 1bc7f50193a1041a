"""`mcpctl wasm inspect|config|run` on the built module and a WasmPlugin file."""
import base64
import json
import os
import re

import pytest

from mcp26.mesh.cli import main
from mcp26.wasm import HEADER_CONTRACT_WASM

pytestmark = pytest.mark.skipif(not os.path.exists(HEADER_CONTRACT_WASM), reason="run `make wasm` first")


def plugin_file(tmp_path, config: dict) -> str:
    p = tmp_path / "wasm.yaml"
    p.write_text(f"""apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {{name: contract, namespace: default}}
spec:
  url: file://{HEADER_CONTRACT_WASM}
  pluginName: mcp-header-contract
  pluginConfig: {json.dumps(config)}
""")
    return str(p)


GOOD = {"sessionKey": base64.b64encode(b"k" * 32).decode(), "tenants": {"acme": {"allowedHeaders": ["x-tenant-acme-*"]}}}


def test_inspect_reports_the_abi_and_size(capsys):
    assert main(["wasm", "inspect"]) == 0
    out = capsys.readouterr().out
    assert "proxy_abi_version_0_2_1" in out and f"{os.path.getsize(HEADER_CONTRACT_WASM)} bytes" in out


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_inspect_as_json_and_yaml_is_what_the_text_says(fmt, capsys):
    import hashlib

    import yaml
    assert main(["wasm", "inspect", "-o", fmt]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)          # JSON is YAML too
    with open(HEADER_CONTRACT_WASM, "rb") as f:
        data = f.read()
    assert doc["size"] == len(data) and doc["sha256"] == hashlib.sha256(data).hexdigest()
    assert "proxy_abi_version_0_2_1" in doc["abi"] and "proxy_on_request_headers" in doc["exports"]


def test_inspect_rejects_a_non_module(tmp_path, capsys):
    bad = tmp_path / "x.wasm"
    bad.write_bytes(b"not wasm")
    assert main(["wasm", "inspect", str(bad)]) == 1


def test_config_prints_the_pushed_json(tmp_path, capsys):
    assert main(["wasm", "config", plugin_file(tmp_path, GOOD)]) == 0
    doc = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert doc["tenant"]["tenants"][0]["name"] == "acme"


def test_config_names_the_bad_field(tmp_path, capsys):
    assert main(["wasm", "config", plugin_file(tmp_path, {**GOOD, "qos": {"ceiling": "gold"}})]) == 1
    err = capsys.readouterr().err
    assert "wasm.yaml:7" in err and "spec.pluginConfig.qos.ceiling" in err


def test_run_shows_what_the_module_does_to_a_request(tmp_path, capsys):
    f = plugin_file(tmp_path, GOOD)
    assert main(["wasm", "run", f, "-H", "end-user:admin", "-H", "x-tenant-evil-a:1", "-c", "sub=jane", "-c", "tenant=acme"]) == 0
    out = capsys.readouterr().out
    assert "end-user: jane" in out and "admin" not in out and "x-tenant-evil-a" not in out
    assert re.search(r"x-mcp-session-sig: v2;t=\d+;h=end-user,x-mcp-tenant,x-mcp-qos-class;s=[0-9a-f]{64}\n", out)
