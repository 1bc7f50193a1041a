"""What every kind's validator shares: a Report that collects one resource's
diagnostics with their field paths (and the checks common to many kinds:
durations, ports, labels, selectors, exportTo), and `semantic`, which runs a
kind's Istio rules once its schema let the types through."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from mcp26.mesh import hosts
from mcp26.mesh.diagnostics import Diagnostic
from mcp26.mesh.resources import Resource
from mcp26.mesh.validation.schema import SchemaErrors, check, duration_ns


class Report:
    """Collects one resource's diagnostics with their field paths."""

    def __init__(self, res: Resource):
        self.res = res
        self.out: list[Diagnostic] = []
        self.typed = True

    def error(self, path: str, message: str) -> None:
        self.out.append(self.res.diagnostic(path, message))

    def warn(self, path: str, message: str) -> None:
        self.out.append(self.res.diagnostic(path, message, severity="warning"))

    def duration(self, path: str, value: Any, seconds_only: bool = False) -> None:
        """Istio's ValidateDuration: >= 1ms, millisecond precision."""
        if value is None:
            return
        ns = duration_ns(value)
        if ns is None:
            return  # the schema already said why
        if ns < 1_000_000:
            self.error(path, "duration must be greater than 1ms")
        elif ns % 1_000_000:
            self.error(path, "only durations to ms precision are supported")
        elif seconds_only and ns % 1_000_000_000:
            self.error(path, "max_age duration is accurate only to seconds precision")

    def port(self, path: str, number: Any) -> None:
        if isinstance(number, int) and not 1 <= number <= 65535:
            self.error(path, f"port number {number} must be in the range 1..65535")

    def labels(self, path: str, labels: Any) -> None:
        for k, v in (labels or {}).items():
            err = hosts.label_key_error(str(k)) or hosts.label_value_error(str(v))
            if err:
                self.error(f"{path}.{k}" if k != "" else path, err)

    def workload_selector(self, path: str, labels: dict | None) -> None:
        if labels is None:
            return
        for k, v in labels.items():
            if k == "":
                self.error(path, f"empty key is not supported in selector: \"{k}={v}\"")
            if "*" in str(k) or "*" in str(v):
                self.error(f"{path}.{k}", f"wildcard is not supported in selector: \"{k}={v}\"")
        if not labels:
            self.warn(path, "workload selector specified without labels")

    def export_to(self, path: str, export_to: list | None, namespace: str, service_entry: bool = False) -> None:
        seen: set[str] = set()
        for i, e in enumerate(export_to or []):
            key = namespace if e == "." else e
            if key in seen:
                self.error(f"{path}[{i}]", f"duplicate entries in exportTo for entry {e}")
            elif e not in ("*", ".") and not (service_entry and e == "~") and not hosts.is_k8s_name_label(e):
                self.error(f"{path}[{i}]", f"only . or * or a valid DNS-1123 label is allowed as exportTo entry, got {e!r}")
            seen.add(key)
        if "*" in seen and len(export_to or []) > 1:
            self.error(path, "cannot have both public (*) and non-public exportTo values for a resource")
        if "~" in seen and len(export_to or []) > 1:
            self.error(path, "cannot export service entry to no one (~) and someone")


def _without_nulls(value: Any) -> Any:
    """An explicit null is the field unset (protobuf JSON), so rules see it absent."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def semantic(rule: Callable[[Report, Resource], None], rep: Report, res: Resource) -> list[Diagnostic]:
    """Run a kind's semantic rules when the schema let the types through.

    A rule that trips over a shape the schema did not foresee must reject
    the resource, never take the control plane down with it.
    """
    if rep.typed:
        try:
            rule(rep, replace(res, spec=_without_nulls(res.spec)))
        except (KeyError, TypeError, AttributeError, ValueError) as e:  # pragma: no cover - a rule bug
            rep.error("spec", f"cannot validate this {res.kind}: {type(e).__name__}: {e}")
    return rep.out


def schema_report(res: Resource, versions: tuple, schema) -> tuple[Report, SchemaErrors]:
    """A resource's Report after the checks every CRD-shaped kind starts with:
    apiVersion among `versions`, then the CRD schema (unknown fields, types,
    enums, required). The SchemaErrors say whether the semantic rules may run:
    `wrong_type` (a value of the wrong type) or any finding at all (`errors`),
    as each kind chooses."""
    rep = Report(res)
    if res.api_version not in versions:
        rep.error("apiVersion", f"{res.kind} is not served at {res.api_version!r}; expected one of {', '.join(versions)}")
    errs = SchemaErrors()
    check(res.spec, schema, "spec", errs)
    for path, message in errs.errors:
        rep.error(path, message)
    return rep, errs
