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

from mesh.config import MeshConfig, Resource
from mesh.errors import ConfigError, Diagnostic

# kind -> validators; a validator yields Diagnostics for one resource.
Validator = Callable[[Resource, MeshConfig], Iterable[Diagnostic]]
VALIDATORS: dict[str, list[Validator]] = {}


def validator(*kinds: str) -> Callable[[Validator], Validator]:
    def register(fn: Validator) -> Validator:
        for kind in kinds:
            VALIDATORS.setdefault(kind, []).append(fn)
        return fn
    return register


def _load_validators() -> None:
    for mod in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{mod.name}")


def validate(config: MeshConfig) -> list[Diagnostic]:
    _load_validators()
    out: list[Diagnostic] = []
    for res in config:
        fns = VALIDATORS.get(res.kind)
        if not fns:
            out.append(res.diagnostic("kind", f"unknown kind {res.kind!r} ({res.api_version})"))
            continue
        for fn in fns:
            out.extend(fn(res, config))
    return out


def check(config: MeshConfig) -> MeshConfig:
    """Raise ConfigError when any error-severity diagnostic is found."""
    errors = [d for d in validate(config) if d.severity == "error"]
    if errors:
        raise ConfigError(errors)
    return config
