"""Errors that say how to fix them: a field one level too shallow, a misspelt field (and no
derived "X is required" beside it), YAML syntax with column, caret and the tab hint, a host
close to one the registry has, a missing path named without a line."""
from mcp26.mesh.cli_validate import run

VS = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: default}
spec:
  hosts: [reviews]
  http:
  - route:
    - host: reviews
      subset: v1
"""
DR = """apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: default}
spec:
  hots: reviews
"""
SE = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews, namespace: default}
spec:
  hosts: [reviews.default.svc.cluster.local]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.1}]
---
"""


def _texts(tmp_path, text, analyze=False):
    f = tmp_path / "x.yaml"
    f.write_text(text)
    return [str(d) for d in run([str(f)], analyze)[0]]


def test_a_field_one_level_too_shallow_says_where_it_goes(tmp_path):
    out = _texts(tmp_path, VS)
    assert [t.split(": ", 4)[-1] for t in out if "route[0].host" in t] == [
        "unknown field 'host' (indent it under 'destination': it is a field of destination, not of this object)"]
    assert any("route[0].subset: unknown field 'subset' (indent it under 'destination'" in t for t in out)
    assert not [t for t in out if "is required" in t], out


def test_did_you_mean_suppresses_the_derived_required(tmp_path):
    out = _texts(tmp_path, DR)
    assert any("spec.hots: unknown field 'hots' (did you mean 'host'?)" in t for t in out), out
    assert not [t for t in out if "host is required" in t], out


def test_yaml_syntax_error_has_column_caret_and_tab_hint(tmp_path):
    (text,) = _texts(tmp_path, "apiVersion: v1\nkind: VirtualService\nmetadata:\n\tname: r\n")
    head, line, caret = text.split("\n")
    assert head.endswith("x.yaml:4: error: malformed YAML at column 1: found character that cannot start any "
                         "token (a tab: YAML indents with spaces only)")
    assert (line, caret) == ("    →name: r", "    ^")
    (text,) = _texts(tmp_path, "kind: VirtualService\nmetadata: {name: r\nspec: {}\n")
    assert "x.yaml:3: error: malformed YAML at column 5:" in text and text.endswith("\n    spec: {}\n        ^")


def test_an_unknown_host_gets_the_registrys_closest(tmp_path):
    out = _texts(tmp_path, SE + VS.replace("    - host: reviews\n      subset: v1\n",
                                             "    - destination: {host: reviewz}\n"), analyze=True)
    assert any('Referenced host not found: "reviewz" (did you mean "reviews.default.svc.cluster.local"?)' in t
               for t in out), out


def test_a_missing_path_is_named_without_a_line(tmp_path):
    (text,) = [str(d) for d in run([str(tmp_path / "nope.yaml")], False)[0]]
    assert text == f"{tmp_path / 'nope.yaml'}: error: no such file or directory: {tmp_path / 'nope.yaml'}"
