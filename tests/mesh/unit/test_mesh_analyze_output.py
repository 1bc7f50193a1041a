"""`mcpctl analyze -o log|json|yaml`: istioctl analyze's `--output` formats
(istioctl/pkg/util/formatting/formatter.go; each message is
diag.Message.Unstructured: code, level, origin, reference, message,
documentationUrl) and its exit codes (istioctl/cmd/sysexits.go), so CI scripts
written for istioctl work."""
from __future__ import annotations

import json

import yaml

BROKEN = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: bookinfo}
spec:
  hosts: [reviews]
  http:
  - route:
    - destination: {host: reviews, subset: v9}
      weight: -1
"""
CLEAN = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: api, namespace: egress}
spec:
  hosts: [api.example.com]
  location: MESH_EXTERNAL
  resolution: DNS
  ports:
  - {number: 443, name: tls, protocol: TLS}
"""


def test_json_is_istioctls_message_list(mcpctl, tmp_path):
    f = tmp_path / "vs.yaml"
    f.write_text(BROKEN)
    r = mcpctl("analyze", "-o", "json", str(f))
    assert r.returncode == 0      # istioctl decides its exit code from the log format only
    messages = json.loads(r.stdout)
    assert [(m["code"], m["level"], m["reference"]) for m in messages] == [
        ("IST0101", "Warning", f"{f}:8"), ("IST0101", "Error", f"{f}:8"), ("IST0106", "Error", f"{f}:9")]
    subset = messages[1]
    assert sorted(subset) == ["code", "documentationUrl", "level", "message", "origin", "reference"]
    assert subset["origin"] == "VirtualService bookinfo/reviews"
    assert subset["message"] == 'Referenced host+subset in destinationrule not found: "reviews+v9"'
    assert subset["documentationUrl"] == \
        "https://istio.io/latest/docs/reference/config/analysis/ist0101/?ref=istioctl-analyze"
    # A rule with no analyzer code is Istio's webhook rule: IST0106 SchemaValidationError.
    assert messages[2]["message"] == "Schema validation error: spec.http[0].route[0].weight: weight -1 < 0"


def test_yaml_is_the_same_list(mcpctl, tmp_path):
    f = tmp_path / "vs.yaml"
    f.write_text(BROKEN)
    as_yaml = yaml.safe_load(mcpctl("analyze", "-o", "yaml", str(f)).stdout)
    assert as_yaml == json.loads(mcpctl("analyze", "-o", "json", str(f)).stdout)
    assert len(as_yaml) == 3


def test_log_is_istioctls_text_and_exit_79_on_errors(mcpctl, tmp_path):
    f = tmp_path / "vs.yaml"
    f.write_text(BROKEN)
    r = mcpctl("analyze", "-o", "log", str(f))
    assert r.returncode == 79
    assert r.stdout.splitlines()[1] == (f'Error [IST0101] (VirtualService bookinfo/reviews {f}:8) '
                                        'Referenced host+subset in destinationrule not found: "reviews+v9"')
    assert r.stdout.splitlines()[0].startswith("Warning [IST0101] (VirtualService bookinfo/reviews ")


def test_clean_input(mcpctl, tmp_path):
    f = tmp_path / "se.yaml"
    f.write_text(CLEAN)
    r = mcpctl("analyze", "-o", "log", str(f))
    assert (r.returncode, r.stdout) == (0, "") and "No validation issues found" in r.stderr
    r = mcpctl("analyze", "-o", "json", str(f))
    assert (r.returncode, json.loads(r.stdout)) == (0, [])
    assert yaml.safe_load(mcpctl("analyze", "-o", "yaml", str(f)).stdout) == []


def test_a_file_that_does_not_parse_is_exit_65_and_named_on_stderr(mcpctl, tmp_path):
    (tmp_path / "bad.yaml").write_text("kind: [oops\n")
    (tmp_path / "se.yaml").write_text(CLEAN)
    r = mcpctl("analyze", "-o", "log", str(tmp_path))
    assert r.returncode == 65
    assert "bad.yaml:" in r.stderr and "malformed YAML" in r.stderr


def test_text_stays_mesh_format_and_validate_json_its_summary(mcpctl, tmp_path):
    f = tmp_path / "vs.yaml"
    f.write_text(BROKEN)
    r = mcpctl("analyze", str(f))
    assert r.returncode == 1 and f"{f}:9: error: VirtualService/bookinfo/reviews: spec.http[0].route[0].weight" in r.stdout
    doc = yaml.safe_load(mcpctl("validate", "-o", "yaml", str(f)).stdout)
    assert (doc["errors"], doc["diagnostics"][0]["field"]) == (1, "spec.http[0].route[0].weight")


def test_istioctl_thresholds_choose_what_is_printed_and_what_fails(mcpctl, tmp_path):
    f = tmp_path / "vs.yaml"
    f.write_text(BROKEN)                 # an IST0101 warning (host) and errors
    errors_only = mcpctl("analyze", "-o", "log", "--output-threshold", "Error", str(f))
    assert errors_only.returncode == 79
    assert errors_only.stdout and all(line.startswith("Error [") for line in errors_only.stdout.splitlines())
    # a warning fails once the failure threshold is Warning, in log and text alike
    warn = tmp_path / "warn.yaml"
    warn.write_text(BROKEN.replace("{host: reviews, subset: v9}", "{host: reviews}").replace("      weight: -1\n", ""))
    assert mcpctl("analyze", "-o", "log", str(warn)).returncode == 0             # warnings only
    assert mcpctl("analyze", "-o", "log", "--failure-threshold", "Warning", str(warn)).returncode == 79
    assert mcpctl("analyze", "--failure-threshold", "warning", str(warn)).returncode == 1
    quiet = mcpctl("analyze", "-o", "log", "--output-threshold", "Error", str(warn))
    assert (quiet.returncode, quiet.stdout) == (0, "")
    # text: every finding on stdout, warnings and errors both
    text = mcpctl("analyze", str(f))
    assert " warning IST0101" in text.stdout and ": error" in text.stdout
