"""`mcpctl validate` / `mcpctl analyze` as an operator runs them: exit codes and output."""
import json

from harness.paths import checkout_examples

GOOD_VS = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: bookinfo}
spec:
  hosts: [reviews]
  http:
  - route:
    - destination: {host: reviews, subset: v1}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: bookinfo}
spec:
  host: reviews
  subsets: [{name: v1, labels: {version: v1}}]
"""
CRD = """apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: things.example.com}
spec: {group: example.com}
"""


def lines(out, marker):
    return [line for line in out.splitlines() if marker in line]


def test_examples_validate_and_analyze_clean(mcpctl, tmp_path):
    examples = str(checkout_examples(tmp_path / "examples"))   # the module url pointed at this checkout's build
    for cmd in ("validate", "analyze"):
        r = mcpctl(cmd, examples)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "No validation issues found" in r.stdout


def test_bad_input_exits_non_zero_with_file_line_resource_field(mcpctl, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD_VS.replace("subset: v1}", "subset: v1}\n      weight: -3"))
    r = mcpctl("validate", str(bad))
    assert r.returncode == 1
    assert lines(r.stderr, "weight") == [
        f"{bad}:9: error: VirtualService/bookinfo/reviews: spec.http[0].route[0].weight: weight -3 < 0"]
    assert "Error: 1 error(s), 0 warning(s) in 2 resource(s) validated" in r.stderr


def test_validate_checks_resources_alone_and_analyze_checks_references(mcpctl, tmp_path):
    f = tmp_path / "vs.yaml"
    f.write_text(GOOD_VS.replace("subset: v1}", "subset: v2}"))
    assert mcpctl("validate", str(f)).returncode == 0
    r = mcpctl("analyze", str(f))
    assert r.returncode == 1
    assert lines(r.stderr, "IST0101") == [
        f"{f}:8: error IST0101: VirtualService/bookinfo/reviews: spec.http[0].route[0].destination.subset: "
        'Referenced host+subset in destinationrule not found: "reviews+v2"']


def test_warnings_do_not_fail_the_command(mcpctl, tmp_path):
    f = tmp_path / "vs.yaml"
    f.write_text(GOOD_VS)   # reviews has no ServiceEntry: IST0101 host warning
    r = mcpctl("analyze", str(f))
    assert r.returncode == 0
    assert lines(r.stdout, "warning IST0101") and "no errors, 1 warning(s)" in r.stdout


def test_non_istio_kinds_are_skipped_with_a_note_unless_strict(mcpctl, tmp_path):
    (tmp_path / "crd.yaml").write_text(CRD)
    (tmp_path / "vs.yaml").write_text(GOOD_VS)
    r = mcpctl("validate", str(tmp_path))
    assert r.returncode == 0
    assert lines(r.stdout, "info: CustomResourceDefinition/default/things.example.com: kind: skipping")
    strict = mcpctl("validate", "--strict", str(tmp_path))
    assert strict.returncode == 1 and "unknown kind 'CustomResourceDefinition'" in strict.stderr


def test_malformed_file_is_reported_and_the_others_still_checked(mcpctl, tmp_path):
    (tmp_path / "a.yaml").write_text("kind: [oops\n")
    (tmp_path / "b.yaml").write_text(GOOD_VS.replace("host: reviews, subset", "host: '*', subset"))
    r = mcpctl("validate", str(tmp_path))
    assert r.returncode == 1
    assert lines(r.stderr, "malformed YAML") and lines(r.stderr, "invalid destination host *")


def test_json_output(mcpctl, tmp_path):
    f = tmp_path / "vs.yaml"
    f.write_text(GOOD_VS.replace("subset: v1}", "subset: v1}\n      weight: -3"))
    r = mcpctl("validate", "-o", "json", str(f))
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert (doc["resources"], doc["errors"]) == (2, 1)
    [d] = doc["diagnostics"]
    assert (d["file"], d["line"], d["resource"], d["field"], d["severity"]) == (
        str(f), 9, "VirtualService/bookinfo/reviews", "spec.http[0].route[0].weight", "error")


def test_missing_path_is_an_error(mcpctl, tmp_path):
    r = mcpctl("validate", str(tmp_path / "nope.yaml"))
    assert r.returncode == 1 and "no such file or directory" in r.stderr


def test_istio_kinds_mesh_does_not_model_warn_and_typos_fail(mcpctl, tmp_path):
    authz = ("apiVersion: telemetry.istio.io/v1\nkind: Telemetry\nmetadata: {name: deny, namespace: prod}\n"
             "spec: {accessLogging: [{}]}\n")
    (tmp_path / "authz.yaml").write_text(authz)
    r = mcpctl("validate", str(tmp_path))
    assert r.returncode == 0
    assert lines(r.stdout, "warning: Telemetry/prod/deny: kind: Telemetry is an Istio kind")
    (tmp_path / "typo.yaml").write_text(GOOD_VS.replace("kind: VirtualService", "kind: VirtualServce"))
    r = mcpctl("validate", str(tmp_path))
    assert r.returncode == 1 and lines(r.stderr, "unknown kind 'VirtualServce'")


def test_standard_input(mcpctl):
    r = mcpctl("validate", "-", stdin=GOOD_VS.replace("subset: v1}", "subset: v1}\n      weight: -3"))
    assert r.returncode == 1
    assert lines(r.stderr, "<stdin>:9: error: VirtualService/bookinfo/reviews: spec.http[0].route[0].weight")
    assert mcpctl("analyze", "-", stdin=GOOD_VS).returncode == 0
