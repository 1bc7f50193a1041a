"""YAML that go-yaml (the API server's parser) accepts parses here the same way
(mesh/parse.py: _GoResolver, _GoFlowScanner)."""
from __future__ import annotations

import os

from mcp26.mesh.change_set import load_texts
from mcp26.mesh.parse import parse_documents
from harness.paths import TEST_DATA

DATA = os.path.join(TEST_DATA, "istio_verdict")


def fixture(name: str) -> str:
    with open(os.path.join(DATA, name)) as f:
        return f.read()


def test_go_yaml_ipv6_in_a_flow_sequence():
    """go-yaml (scannerc.go yaml_parser_scan_plain_scalar) ends a plain scalar in a
    flow collection at ':' only before a blank, so `[2001:db8::1, 001:db8::]` is
    two strings; and it has no sexagesimal ints, so `1:20` stays a string."""
    config = load_texts({"se.yaml": fixture("goyaml-valid.yaml")})
    [se] = [r for r in config if r.name == "ipv6-static"]
    assert se.spec["addresses"] == ["2001:db8::1", "001:db8::"]
    assert se.lines["spec.addresses[1]"] == 9
    [doc] = parse_documents("apiVersion: v1\nkind: X\nmetadata: {name: a}\nspec: {a: [1:20], b: 1:20, c: 0x1f}\n")
    assert doc.spec == {"a": ["1:20"], "b": "1:20", "c": 31}


def test_a_document_without_kind_or_name_is_named_by_what_it_lacks():
    import pytest
    from mcp26.mesh.diagnostics import ConfigError
    with pytest.raises(ConfigError) as e:
        parse_documents("apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {}\n---\n"
                        "apiVersion: v1\nmetadata: {name: x}\n", file="d.yaml")
    refs = sorted({d.resource for d in e.value.diagnostics})
    assert refs == ["(no kind)/default/x", "VirtualService/default/(no name)"], refs
