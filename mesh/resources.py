"""The mesh model's resources: one Istio-style resource with the line of every
field, and a whole config (one directory's worth).

A `Resource` keeps the spec as the plain dict the YAML gave (Istio's own
camelCase field names), plus the line of every field so that validation can
name `file:line` for the exact field it rejects. mesh.parse builds them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from mcp26.mesh.diagnostics import Diagnostic


@dataclass
class Resource:
    api_version: str
    kind: str
    name: str
    namespace: str
    spec: dict
    file: str = ""
    line: int = 0                       # line of the document's first key
    labels: dict = field(default_factory=dict)
    annotations: dict = field(default_factory=dict)
    lines: dict = field(default_factory=dict, repr=False)  # field path -> line
    status: dict = field(default_factory=dict, repr=False)  # what a Kubernetes object reports (a Pod's podIP)

    @property
    def ref(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"

    @property
    def group(self) -> str:
        return self.api_version.split("/")[0] if "/" in self.api_version else ""

    def line_of(self, path: str) -> int:
        """Line of `path` (e.g. 'spec.http[0].route'), or of its nearest parent."""
        while path:
            if path in self.lines:
                return self.lines[path]
            cut = max(path.rfind("."), path.rfind("["))
            path = path[:cut] if cut > 0 else ""
        return self.line

    def diagnostic(self, field_path: str, message: str, code: str = "",
                   severity: str = "error") -> Diagnostic:
        return Diagnostic(message=message, file=self.file, line=self.line_of(field_path),
                          resource=self.ref, field=field_path, code=code, severity=severity)


def same_except_endpoints(a: Resource, b: Resource, workload_entries: bool = False) -> bool:
    """Equal but for endpoint data: a ServiceEntry's spec.endpoints and, with
    `workload_entries`, a WorkloadEntry's whole spec. File and field lines are
    left out: they only name places in errors, and a translation of equal
    content that succeeded once succeeds again (mesh.analyze.AnalysisCache,
    whose findings name them, compares them as well)."""
    if a is b:
        return True
    if (a.api_version, a.kind, a.name, a.namespace, a.labels, a.annotations) != \
            (b.api_version, b.kind, b.name, b.namespace, b.labels, b.annotations):
        return False
    if a.kind == "ServiceEntry":
        return ({k: v for k, v in a.spec.items() if k != "endpoints"}
                == {k: v for k, v in b.spec.items() if k != "endpoints"})
    return (workload_entries and a.kind == "WorkloadEntry") or a.spec == b.spec


def same_resource(a: Resource, b: Resource) -> bool:
    """Equal in content: kind, name, namespace, metadata, spec and status (not file or lines)."""
    return a is b or ((a.api_version, a.kind, a.name, a.namespace, a.labels, a.annotations, a.spec, a.status)
                      == (b.api_version, b.kind, b.name, b.namespace, b.labels, b.annotations, b.spec, b.status))


@dataclass
class MeshConfig:
    """A whole, consistent set of resources (one directory's worth)."""
    resources: list[Resource] = field(default_factory=list)
    # Non-blocking findings (warnings, notes) from validation and analysis.
    warnings: list[Diagnostic] = field(default_factory=list)

    # of_kind's answers, per kinds asked: translation asks ~10 times a proxy shape, each a
    # walk over every resource (~1 ms at 3,000; 0.2 s of a 20-shape change set). Nothing
    # changes `resources` once a config is built; the length check catches what would.
    _by_kinds: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def of_kind(self, *kinds: str) -> list[Resource]:
        found = self._by_kinds.get(kinds)
        if found is None or found[0] != len(self.resources):
            found = self._by_kinds[kinds] = (len(self.resources), [r for r in self.resources if r.kind in kinds])
        return list(found[1])

    def __iter__(self) -> Iterator[Resource]:
        return iter(self.resources)

    def __len__(self) -> int:
        return len(self.resources)
