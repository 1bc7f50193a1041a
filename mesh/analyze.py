"""Cross-resource analyzers, after istioctl analyze (codes and wording kept).

Each analyzer takes a validated MeshConfig and yields Diagnostics. Severity
decides what a finding does: "error" blocks a config push (the control plane
rejects the change set), "warning"/"info" are reported and kept on
`MeshConfig.warnings`.
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator

from mesh.config import MeshConfig
from mesh.errors import Diagnostic

Analyzer = Callable[[MeshConfig], Iterable[Diagnostic]]
ANALYZERS: list[Analyzer] = []


def analyzer(fn: Analyzer) -> Analyzer:
    ANALYZERS.append(fn)
    return fn


def analyze(config: MeshConfig) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    for fn in ANALYZERS:
        out.extend(fn(config))
    return out


@analyzer
def virtual_service_subsets(config: MeshConfig) -> Iterator[Diagnostic]:
    """IST0101: a VirtualService destination names a subset no DestinationRule defines."""
    subsets: dict[str, set[str]] = {}
    for dr in config.of_kind("DestinationRule"):
        host = str(dr.spec.get("host", ""))
        for s in dr.spec.get("subsets") or []:
            if isinstance(s, dict) and s.get("name"):
                subsets.setdefault(host, set()).add(str(s["name"]))
    for vs in config.of_kind("VirtualService"):
        for proto in ("http", "tcp", "tls"):
            for i, route in enumerate(vs.spec.get(proto) or []):
                for j, dest in enumerate(route.get("route") or []):
                    d = dest.get("destination") or {}
                    subset = d.get("subset")
                    if subset and subset not in subsets.get(str(d.get("host", "")), set()):
                        yield vs.diagnostic(
                            f"spec.{proto}[{i}].route[{j}].destination.subset",
                            f"Referenced host+subset in destinationrule not found: \"{d.get('host')}+{subset}\"",
                            code="IST0101")
