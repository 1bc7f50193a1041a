"""The Istio manifests e2e stacks share, one file per shape in tests/data/manifests/.

    manifest("gateway.yaml", gw_port=8080)                  # the text, placeholders filled
    documents(manifest(...), manifest(...), "...inline YAML...")  # joined with ---

A file's `$name` placeholders (string.Template, so the YAML's own braces stay as written) take
the keyword arguments: a dict or list is written as JSON (flow YAML), anything else with str().
A placeholder left without a value, or a value no placeholder takes, is an error naming the
file, so a renamed placeholder cannot pass silently. What only one test needs stays inline in
that test, beside the files it names.
"""
from __future__ import annotations

import hashlib
import json
import string

from harness.paths import TEST_DATA

MANIFESTS = TEST_DATA / "manifests"


def manifest(file: str, **values) -> str:
    path = MANIFESTS / file
    template = string.Template(path.read_text())
    wanted = {m.group("named") or m.group("braced") for m in template.pattern.finditer(template.template)} - {None}
    if missing := wanted - values.keys():
        raise KeyError(f"{path}: no value for {', '.join(sorted('$' + m for m in missing))}")
    if unused := values.keys() - wanted:
        raise KeyError(f"{path}: no placeholder for {', '.join(sorted(unused))}")
    return template.substitute({k: json.dumps(v) if isinstance(v, (dict, list)) else str(v)
                                for k, v in values.items()})


def documents(*texts: str) -> str:
    """One multi-document YAML text: each document ends with a newline and is followed by ---."""
    return "---\n".join(t if t.endswith("\n") else t + "\n" for t in texts)


def wasm_module(path) -> dict:
    """`wasm` and `sha256` for header_contract_plugin.yaml: the module's path and digest."""
    with open(path, "rb") as f:
        return {"wasm": str(path), "sha256": hashlib.sha256(f.read()).hexdigest()}
