"""Validation of a whole MeshConfig, as Istio validates (and then some).

Per-kind validators live in the modules of this package and register with
`@validator("Kind", ...)`; `validate()` runs them all and returns diagnostics
naming file, line, resource and field. Cross-resource checks (a subset no
DestinationRule defines, ...) are analyzers in `mesh.analyze`.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Callable, Iterable

from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.mesh.diagnostics import ConfigError, Diagnostic

# kind -> validators; a validator yields Diagnostics for one resource.
Validator = Callable[[Resource, MeshConfig], Iterable[Diagnostic]]
VALIDATORS: dict[str, list[Validator]] = {}


# (API group, kind) -> validators, for kinds whose name another group uses too
# (Gateway API's Gateway is not Istio's); looked up before VALIDATORS.
GROUP_VALIDATORS: dict[tuple[str, str], list[Validator]] = {}


def validator(*kinds: str, group: str | None = None) -> Callable[[Validator], Validator]:
    def register(fn: Validator) -> Validator:
        for kind in kinds:
            if group is None:
                VALIDATORS.setdefault(kind, []).append(fn)
            else:
                GROUP_VALIDATORS.setdefault((group, kind), []).append(fn)
        return fn
    return register


def _load_validators() -> None:
    for mod in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{mod.name}")


def validate_resource(res: Resource, config: MeshConfig) -> list[Diagnostic]:
    """One resource's diagnostics. Every registered validator reads only `res`
    (none looks at other resources through `config`; cross-resource checks are
    mesh.analyze's), so this is a pure function of the resource."""
    fns = GROUP_VALIDATORS.get((res.group, res.kind)) or VALIDATORS.get(res.kind)
    if not fns:
        return [res.diagnostic("kind", f"unknown kind {res.kind!r} ({res.api_version})")]
    out: list[Diagnostic] = []
    for fn in fns:
        try:
            out.extend(fn(res, config))
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            # A shape no validator foresaw must reject the resource, never take the
            # control plane (or `mcpctl validate`) down with a traceback.
            out.append(res.diagnostic("spec", f"cannot validate this {res.kind}: {type(e).__name__}: {e}"))
    return out


class ValidationCache:
    """Per-resource diagnostics kept between successive change sets.

    Keyed by the identity of the parsed Resource object, held strongly so its
    id() cannot be reused: the control plane's loader (xds.incremental_load)
    hands back the same objects for files it did not re-parse, and a
    re-parsed file gives new objects, so a resource is re-validated exactly
    when its file changed. Sound because a Resource's diagnostics depend only
    on the resource (its spec, metadata, file and field lines: see
    validate_resource) and resources are never mutated after parsing.
    Entries not in the latest config are dropped.
    """

    def __init__(self):
        self._by_id: dict[int, tuple[Resource, list[Diagnostic]]] = {}
        self.validated = 0     # resources the last validate() actually ran validators on

    def validate(self, config: MeshConfig) -> list[Diagnostic]:
        _load_validators()
        kept: dict[int, tuple[Resource, list[Diagnostic]]] = {}
        out: list[Diagnostic] = []
        self.validated = 0
        for res in config:
            hit = kept.get(id(res)) or self._by_id.get(id(res))
            if hit is None or hit[0] is not res:
                hit = (res, validate_resource(res, config))
                self.validated += 1
            kept[id(res)] = hit
            out.extend(hit[1])
        self._by_id = kept
        return out


def validate(config: MeshConfig, cache: ValidationCache | None = None) -> list[Diagnostic]:
    """Every resource's diagnostics, in config order (with `cache`: only the
    resources not seen by the cache's previous call are validated again)."""
    if cache is not None:
        return cache.validate(config)
    _load_validators()
    out: list[Diagnostic] = []
    for res in config:
        out.extend(validate_resource(res, config))
    return out


def check(config: MeshConfig) -> MeshConfig:
    """Raise ConfigError when any error-severity diagnostic is found."""
    errors = [d for d in validate(config) if d.severity == "error"]
    if errors:
        raise ConfigError(errors)
    return config
