"""`mcpctl validate PATH...` and `mcpctl analyze PATH...`, after istioctl.

validate: each resource on its own (schema + Istio's rules). analyze: the
whole set, cross-resource (IST0101, IST0109, ...), after validation. Both
skip kinds mesh does not model (a CRD, a Deployment) with a note, as
istioctl does; the control plane's config directory rejects them instead
(mesh.change_set.load_config). Exit 0 when clean (warnings allowed), 1 on errors.

`-o log|json|yaml` print istioctl analyze's `--output` formats (and exit as
istioctl does) so that CI scripts written for istioctl work unchanged; `-o text`
(the default) is mesh's `file:line: severity: Kind/ns/name: field: message`.
Every finding goes to standard output, in every format (summaries and files that
do not parse go to standard error, as istioctl's). `analyze --output-threshold`
and `--failure-threshold` (Info, Warning, Error) are istioctl's: which findings
are printed, and from which level the exit code is non-zero.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

import yaml

from mcp26.mesh import analyze as analyzers
from mcp26.mesh import validation
from mcp26.mesh.resources import MeshConfig
from mcp26.mesh.parse import MAX_FILE_BYTES, parse_documents, read_config_file
from mcp26.mesh.diagnostics import ConfigError, Diagnostic
from mcp26.mesh.change_set import expand_paths, ordered, partition, synthesized
from mcp26.mesh.resources import Resource
from mcp26.mesh.validation.networking_schema import SPECS
from mcp26.mesh.validation.schema import SchemaErrors, check

# istioctl's exit codes (istioctl/cmd/sysexits.go) for the istioctl formats.
EXIT_DATA_ERROR = 65            # a file did not parse
EXIT_ANALYZER_FOUND_ISSUES = 79  # an error-level message
ISTIOCTL_FORMATS = ("log", "json", "yaml")
LEVELS = ("Info", "Warning", "Error")          # istioctl's threshold values, lowest first
_RANK = {"info": 0, "warning": 1, "error": 2}
DOCS = "https://istio.io/latest/docs/reference/config/analysis"


def register(subparsers) -> None:
    for name, helptext in (("validate", "check resources against Istio's validation rules"),
                           ("analyze", "validate, then check references across resources (istioctl analyze codes)")):
        p = subparsers.add_parser(name, help=helptext, description=helptext)
        p.add_argument("paths", nargs="+", metavar="PATH",
                       help="YAML files or directories (recursive); - reads standard input")
        p.add_argument("-o", "--output", choices=("text", *ISTIOCTL_FORMATS), default="text",
                       help="text (default): file:line: severity: resource: field: message; "
                            + ("log, json, yaml: istioctl analyze's --output formats and exit codes"
                               if name == "analyze" else "json, yaml: a summary and every diagnostic; "
                               "log: as istioctl analyze prints it"))
        p.add_argument("--strict", action="store_true",
                       help="reject kinds mesh does not model, as the control plane does")
        if name == "analyze":
            p.add_argument("--failure-threshold", choices=LEVELS, default="Error", type=str.capitalize,
                           help="the level from which findings make the exit code non-zero (istioctl's; "
                                "default Error; exit 79 with -o log, 1 with -o text)")
            p.add_argument("--output-threshold", choices=LEVELS, default="Info", type=str.capitalize,
                           help="the level from which findings are printed (istioctl's; default Info)")
        p.set_defaults(func=_run, analyze=(name == "analyze"), failure_threshold="Error", output_threshold="Info")


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
    kept, skipped = partition(resources, strict)    # the control plane's rule, so both agree
    found.extend(skipped)
    diags = validation.validate(MeshConfig(kept))
    found.extend(diags)
    if analyze:
        # istioctl analyze reports a resource's schema errors and its references
        # both: the analyzers read every resource whose values have the types
        # they expect (a string where a list belongs would only add noise).
        readable = [r for r in kept if _readable(r)]
        # Kubernetes objects and Gateway API as the control plane reads them; the
        # conversion takes only resources that passed validation, as it does there.
        broken = {d.resource for d in diags if d.severity == "error"}
        extra, notes = synthesized(MeshConfig([r for r in readable if r.ref not in broken]))
        found.extend(notes)
        found.extend(analyzers.analyze(MeshConfig([*readable, *extra])))
    return ordered(found), len(kept)


def _readable(res: Resource) -> bool:
    """Whether the analyzers can read `res`: no value of the wrong type in its spec."""
    schema = SPECS.get(res.kind)
    if schema is None:
        return True   # kinds the analyzers read by name only
    if not isinstance(res.spec, dict):
        return False
    errs = SchemaErrors()
    check(res.spec, schema, "spec", errs)
    return not errs.wrong_type


def istioctl_message(d: Diagnostic) -> dict | None:
    """A diagnostic as istioctl's diag.Message.Unstructured: code, level, origin,
    reference, message, documentationUrl. A rule with no IST code is Istio's
    schema/webhook rule: IST0106 SchemaValidationError, or IST0133 SchemaWarning
    for a warning; a note (info) with no code has no istioctl twin."""
    code = d.code or {"error": "IST0106", "warning": "IST0133"}.get(d.severity)
    if code is None or not d.resource:
        return None
    message = d.message
    if not d.code:
        message = f"Schema validation {d.severity}: " + (f"{d.field}: {d.message}" if d.field else d.message)
    kind, _, name = d.resource.partition("/")
    out = {"code": code, "level": d.severity.capitalize(), "origin": f"{kind} {name}"}
    if d.file:
        out["reference"] = d.file if d.file.endswith(".json") or not d.line else f"{d.file}:{d.line}"
    out["message"] = message
    out["documentationUrl"] = f"{DOCS}/{code.lower()}/?ref=istioctl-analyze"
    return out


def istioctl_log_line(m: dict) -> str:
    """istioctl's log format: `Error [IST0101] (VirtualService ns/name file:line) message`."""
    where = m["origin"] + (f" {m['reference']}" if m.get("reference") else "")
    return f"{m['level']} [{m['code']}] ({where}) {m['message']}"


def _at_least(severity: str, level: str) -> bool:
    return _RANK.get(severity.lower(), 0) >= _RANK[level.lower()]


def _print_istioctl(args: argparse.Namespace, diags: list[Diagnostic]) -> int:
    messages, unparsed = [], []
    failing = any(_at_least(d.severity, args.failure_threshold) for d in diags if istioctl_message(d))
    diags = [d for d in diags if _at_least(d.severity, args.output_threshold) or (not d.resource
                                                                                  and d.severity == "error")]
    for d in diags:
        m = istioctl_message(d)
        if m is not None:
            messages.append(m)
        elif not d.resource and d.severity == "error":
            unparsed.append(d)
    for d in unparsed:   # istioctl: "Error(s) adding files", on stderr
        print(d, file=sys.stderr)
    if args.output == "json":
        print(json.dumps(messages, indent="\t", sort_keys=True))
    elif args.output == "yaml":
        sys.stdout.write(yaml.safe_dump(messages, sort_keys=True) if messages else "[]\n")
    else:
        if messages:
            print("\n".join(istioctl_log_line(m) for m in messages))
        else:
            print("\u2714 No validation issues found when analyzing "
                  + ", ".join(args.paths) + ".", file=sys.stderr)
    if args.output != "log":
        return 0   # istioctl decides its exit code from the log format only
    if failing:    # from every finding, printed or not (istioctl keeps the two thresholds apart)
        return EXIT_ANALYZER_FOUND_ISSUES
    return EXIT_DATA_ERROR if unparsed else 0


def _run(args: argparse.Namespace) -> int:
    diags, checked = run(args.paths, args.analyze, args.strict)
    if args.output == "log" or (args.analyze and args.output in ISTIOCTL_FORMATS):
        return _print_istioctl(args, diags)
    errors = sum(d.severity == "error" for d in diags)
    warnings = sum(d.severity == "warning" for d in diags)
    failing = any(_at_least(d.severity, args.failure_threshold) for d in diags)
    diags = [d for d in diags if _at_least(d.severity, args.output_threshold)]
    if args.output in ("json", "yaml"):   # validate: mesh's summary document
        doc = {"resources": checked, "errors": errors, "warnings": warnings,
               "diagnostics": [asdict(d) for d in diags]}
        if args.output == "yaml":
            sys.stdout.write(yaml.safe_dump(doc, sort_keys=False))
            return 1 if failing else 0
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for d in diags:
            print(d)
        verb = "analyzed" if args.analyze else "validated"
        if errors:
            print(f"Error: {errors} error(s), {warnings} warning(s) in {checked} resource(s) {verb}", file=sys.stderr)
        elif warnings:
            print(f"{checked} resource(s) {verb}: no errors, {warnings} warning(s)")
        else:
            print(f"\u2714 No validation issues found when {'analyzing' if args.analyze else 'validating'} "
                  f"{checked} resource(s).")
    return 1 if failing else 0
