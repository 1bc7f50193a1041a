"""mcp26.mesh.change_set.load_config: the control plane's all-or-nothing load of one directory."""
import os

import pytest

from mcp26.mesh.resources import MeshConfig
from mcp26.mesh.diagnostics import ConfigError
from mcp26.mesh.change_set import load_config, load_texts

GOOD = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: api, namespace: prod}
spec:
  hosts: [api.example.com]
  resolution: DNS
  ports: [{number: 443, name: tls, protocol: TLS}]
"""


def write(tmp_path, files):
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path)


def test_a_good_directory_loads_every_file(tmp_path):
    d = write(tmp_path, {"a.yaml": GOOD, "sub/b.yml": GOOD.replace("name: api", "name: api2").replace("api.example", "b.example")})
    config = load_config(d)
    assert isinstance(config, MeshConfig)
    assert sorted(r.name for r in config) == ["api", "api2"]
    assert {os.path.basename(r.file) for r in config} == {"a.yaml", "b.yml"}


def test_malformed_yaml_names_file_and_line_and_loads_nothing(tmp_path):
    d = write(tmp_path, {"a.yaml": GOOD, "z.yaml": "apiVersion: v1\nkind: [unclosed\nmetadata: {}\n"})
    with pytest.raises(ConfigError) as exc:
        load_config(d)
    [diag] = exc.value.diagnostics
    assert diag.file.endswith("z.yaml") and diag.line in (2, 3) and "malformed YAML" in diag.message


def test_unknown_kind_is_rejected_by_the_control_plane(tmp_path):
    d = write(tmp_path, {"a.yaml": GOOD + "---\napiVersion: networking.istio.io/v1\nkind: VirtualSrvice\n"
                                           "metadata: {name: typo}\nspec: {}\n"})
    with pytest.raises(ConfigError) as exc:
        load_config(d)
    [diag] = exc.value.diagnostics
    assert (diag.line, diag.resource, diag.field) == (10, "VirtualSrvice/default/typo", "kind")
    assert "unknown kind 'VirtualSrvice'" in diag.message


def test_kinds_mesh_does_not_model_are_skipped_with_a_note_and_strict_rejects_them(tmp_path):
    # The same verdict as `mcpctl validate`: a CRD or ConfigMap is passed over, said once.
    crd = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: x.example.com}\nspec: {}\n"
    d = write(tmp_path, {"a.yaml": GOOD, "crd.yaml": crd})
    config = load_config(d)
    assert [r.kind for r in config] == ["ServiceEntry"]
    [note] = [w for w in config.warnings if w.resource == "CustomResourceDefinition/default/x.example.com"]
    assert note.severity == "info" and "skipping" in note.message
    with pytest.raises(ConfigError) as exc:
        load_config(d, strict=True)
    assert [d.resource for d in exc.value.diagnostics] == ["CustomResourceDefinition/default/x.example.com"]


def test_one_bad_resource_rejects_the_whole_change_set_listing_every_error(tmp_path):
    bad_a = GOOD.replace("number: 443", "number: 0")
    bad_b = GOOD.replace("name: api,", "name: other,").replace("resolution: DNS", "resolution: MAGIC")
    d = write(tmp_path, {"a.yaml": bad_a, "b.yaml": bad_b, "c.yaml": GOOD.replace("name: api,", "name: c,")})
    with pytest.raises(ConfigError) as exc:
        load_config(d)
    got = sorted((os.path.basename(x.file), x.line, x.field) for x in exc.value.diagnostics)
    assert got == [("a.yaml", 7, "spec.ports[0].number"), ("b.yaml", 6, "spec.resolution")]
    # The exception's text is the list the control plane logs.
    assert "a.yaml:7: error: ServiceEntry/prod/api: spec.ports[0].number: port number 0" in str(exc.value)


def test_missing_directory(tmp_path):
    with pytest.raises(ConfigError) as exc:
        load_config(str(tmp_path / "nope"))
    assert "does not exist" in str(exc.value)


def test_a_document_without_metadata_name(tmp_path):
    d = write(tmp_path, {"a.yaml": "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {}\nspec: {}\n"})
    with pytest.raises(ConfigError) as exc:
        load_config(d)
    assert [x.field for x in exc.value.diagnostics] == ["metadata.name"]


def test_warnings_are_kept_not_raised():
    vs = ("apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: r, namespace: prod}\n"
          "spec:\n  hosts: [ratings]\n  http:\n  - route: [{destination: {host: ratings}}]\n")
    config = load_texts({"vs.yaml": vs})
    assert [(w.code, w.severity) for w in config.warnings] == [("IST0101", "warning")]


def test_load_texts_reports_every_file():
    with pytest.raises(ConfigError) as exc:
        load_texts({"a.yaml": "kind: [", "b.yaml": "- just a list\n"})
    assert sorted(d.file for d in exc.value.diagnostics) == ["a.yaml", "b.yaml"]


def test_empty_documents_and_comments_are_fine():
    config = load_texts({"a.yaml": "# nothing yet\n---\n---\n" + GOOD + "---\n"})
    assert len(config) == 1


def test_a_key_given_twice_is_an_error_not_the_last_one_silently():
    text = GOOD.replace("  resolution: DNS\n", "  resolution: DNS\n  resolution: STATIC\n")
    with pytest.raises(ConfigError) as exc:
        load_texts({"a.yaml": text})
    [d] = exc.value.diagnostics
    assert (d.file, d.line, d.field) == ("a.yaml", 7, "spec.resolution")
    assert d.message == "malformed YAML: key 'resolution' already set in this mapping (line 6)"
