"""`mcpctl validate PATH...` and `mcpctl analyze PATH...`, after istioctl.

validate: each resource on its own (schema + Istio's rules). analyze: the
whole set, cross-resource (IST0101, IST0109, ...), after validation. Both
skip kinds mesh does not model (a CRD, a Deployment) with a note, as
istioctl does; the control plane's config directory rejects them instead
(mesh.change_set.load_config). Exit 0 when clean (warnings allowed), 1 on errors.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

from mesh import analyze as analyzers
from mesh import validation
from mesh.resources import MeshConfig
from mesh.parse import MAX_FILE_BYTES, parse_documents, read_config_file
from mesh.diagnostics import ConfigError, Diagnostic
from mesh.change_set import expand_paths, is_foreign, is_unmodelled_istio_kind, ordered


def register(subparsers) -> None:
    for name, helptext in (("validate", "check resources against Istio's validation rules"),
                           ("analyze", "validate, then check references across resources (istioctl analyze codes)")):
        p = subparsers.add_parser(name, help=helptext, description=helptext)
        p.add_argument("paths", nargs="+", metavar="PATH",
                       help="YAML files or directories (recursive); - reads standard input")
        p.add_argument("-o", "--output", choices=("text", "json"), default="text", help="output format (default text)")
        p.add_argument("--strict", action="store_true",
                       help="reject kinds mesh does not model, as the control plane does")
        p.set_defaults(func=_run, analyze=(name == "analyze"))


def run(paths: list[str], analyze: bool, strict: bool = False) -> tuple[list[Diagnostic], int]:
    """(diagnostics, number of resources checked). A file that does not parse
    is reported and the others are still checked, as istioctl does."""
    found: list[Diagnostic] = []
    resources = []
    if "-" in paths:   # `kubectl get vs -o yaml | mcpctl validate -`
        try:
            text = sys.stdin.read(MAX_FILE_BYTES + 1)
            if len(text) > MAX_FILE_BYTES:
                raise ConfigError([Diagnostic(f"cannot read: over the limit of {MAX_FILE_BYTES} bytes",
                                              file="<stdin>")])
            resources.extend(parse_documents(text, file="<stdin>"))
        except ConfigError as e:
            found.extend(e.diagnostics)
    for p in paths:
        if p != "-" and not os.path.exists(p):
            found.append(Diagnostic(f"no such file or directory: {p}", file=p))
    for path in expand_paths(p for p in paths if p != "-" and os.path.exists(p)):
        try:
            resources.extend(parse_documents(read_config_file(path), file=path))
        except ConfigError as e:
            found.extend(e.diagnostics)
    kept = []
    for res in resources:
        if strict:
            kept.append(res)
        elif is_foreign(res):
            found.append(res.diagnostic("kind", f"skipping {res.api_version} {res.kind}: not a kind mesh validates",
                                        severity="info"))
        elif is_unmodelled_istio_kind(res):
            found.append(res.diagnostic("kind", f"{res.kind} is an Istio kind mcp-mesh does not model: not validated "
                                        "here, and the mcp-mesh control plane rejects it", severity="warning"))
        else:
            kept.append(res)
    diags = validation.validate(MeshConfig(kept))
    found.extend(diags)
    if analyze:
        # Cross-resource checks over the resources that are well formed;
        # istioctl analyze likewise reports both schema errors and analysis.
        broken = {d.resource for d in diags if d.severity == "error"}
        found.extend(analyzers.analyze(MeshConfig([r for r in kept if r.ref not in broken])))
    return ordered(found), len(kept)


def _run(args: argparse.Namespace) -> int:
    diags, checked = run(args.paths, args.analyze, args.strict)
    errors = sum(d.severity == "error" for d in diags)
    warnings = sum(d.severity == "warning" for d in diags)
    if args.output == "json":
        json.dump({"resources": checked, "errors": errors, "warnings": warnings,
                   "diagnostics": [asdict(d) for d in diags]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for d in diags:
            print(d, file=sys.stderr if d.severity == "error" else sys.stdout)
        verb = "analyzed" if args.analyze else "validated"
        if errors:
            print(f"Error: {errors} error(s), {warnings} warning(s) in {checked} resource(s) {verb}", file=sys.stderr)
        elif warnings:
            print(f"{checked} resource(s) {verb}: no errors, {warnings} warning(s)")
        else:
            print(f"\u2714 No validation issues found when {'analyzing' if args.analyze else 'validating'} "
                  f"{checked} resource(s).")
    return 1 if errors else 0
