"""Load a whole config change set: parse, validate, analyze; all or nothing.

`load_config(directory)` is what the control plane calls for every change
set. It either returns a `MeshConfig` that passed every check (warnings kept
on `config.warnings`) or raises `ConfigError` listing every error found, so a
change set with one bad resource is rejected whole and the last good config
keeps being served.
"""
from __future__ import annotations

import os
from typing import Iterable, Mapping

from mcp26.mesh import analyze as analyzers
from mcp26.mesh import gateway_api, kube, validation
from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.mesh.parse import load_dir, parse_documents, yaml_files
from mcp26.mesh.diagnostics import ConfigError, Diagnostic

# API groups mesh models (validators are registered for their kinds). A
# resource of any other group is "foreign": `mcpctl validate` skips it with a
# note, as istioctl does for non-Istio kinds; load_config (the control plane)
# rejects it as an unknown kind.
MESH_GROUPS = (
    "networking.istio.io", "security.istio.io", "extensions.istio.io",
    "telemetry.istio.io", "scheduling.mcp-mesh.io",
    "gateway.networking.k8s.io", "inference.networking.k8s.io", "inference.networking.x-k8s.io",
)


# Istio kinds that mesh does not model: valid on an Istio cluster, so
# `mcpctl validate` passes over them with a warning (no validator here),
# while the control plane rejects them as unknown kinds.
ISTIO_KINDS = {
    "networking.istio.io": {"Sidecar", "EnvoyFilter", "WorkloadGroup", "ProxyConfig"},
    "security.istio.io": {"AuthorizationPolicy", "PeerAuthentication", "RequestAuthentication"},
    "telemetry.istio.io": {"Telemetry"},
    "extensions.istio.io": {"WasmPlugin"},
}


def is_unmodelled_istio_kind(res: Resource) -> bool:
    if res.kind not in ISTIO_KINDS.get(res.group, ()):
        return False
    validation._load_validators()   # the registry fills as validator modules import
    return res.kind not in validation.VALIDATORS


# Core (v1) kinds mesh models: a kubernetes.io/tls Secret is what a Gateway's
# credentialName names (xds.sds serves it).
CORE_KINDS = {"Secret"}


def is_foreign(res: Resource) -> bool:
    """A kind mesh does not model (a CRD, a ConfigMap ...): the Kubernetes
    registry's kinds (Service, Pod, Deployment ...) are modelled."""
    if res.group == "" and res.kind in CORE_KINDS:
        return False
    if kube.is_registry_kind(res):
        return False
    return res.group not in MESH_GROUPS


def partition(resources: Iterable[Resource], strict: bool = False) -> tuple[list[Resource], list[Diagnostic]]:
    """(the resources mesh checks, a note for each one passed over). Kinds
    neither Istio nor the registry use are skipped with an info line, Istio
    kinds mesh does not model with a warning -- in `mcpctl validate` and in
    the control plane alike, so both give the same verdict on the same files;
    `strict` keeps them all (and so rejects them as unknown kinds)."""
    kept, notes = [], []
    for res in resources:
        if strict:
            kept.append(res)
        elif is_foreign(res):
            notes.append(res.diagnostic("kind", f"skipping {res.api_version} {res.kind}: not a kind mesh validates",
                                        severity="info"))
        elif is_unmodelled_istio_kind(res):
            notes.append(res.diagnostic("kind", f"{res.kind} is an Istio kind mcp-mesh does not model: "
                                        "not validated and not translated here", severity="warning"))
        else:
            kept.append(res)
    return kept, notes


def synthesized(config: MeshConfig) -> tuple[list[Resource], list[Diagnostic]]:
    """What the Kubernetes objects and Gateway API resources of `config` stand
    for in Istio's terms (ServiceEntries, WorkloadEntries, Gateways,
    VirtualServices: mesh.kube, mesh.gateway_api), and the conversion's notes.
    The conversion trusts its input: give it validated resources only."""
    registry = kube.registry_resources(config)
    routes, notes = gateway_api.gateway_api_resources(MeshConfig([*config.resources, *registry]))
    return [*registry, *routes], notes


def expand(config: MeshConfig) -> tuple[MeshConfig, list[Diagnostic]]:
    """`config` (validated) plus what it stands for in Istio's terms (synthesized)."""
    extra, notes = synthesized(config)
    return (MeshConfig([*config.resources, *extra]) if extra else config), notes


def check_config(config: MeshConfig, cache: "validation.ValidationCache | None" = None,
                 strict: bool = False, analysis: "analyzers.AnalysisCache | None" = None) -> MeshConfig:
    """Validate and analyze `config`; raise ConfigError on any error.

    With `cache` (the control plane's, across change sets) only resources it
    has not validated before are validated again; with `analysis`, after a
    change of endpoint data only the analyzers that read endpoints run again,
    and after a change of VirtualServices alone the per-route analyzers run
    on the changed ones only.
    The result is the same either way."""
    kept, found = partition(config.resources, strict)
    if len(kept) != len(config.resources):
        config = MeshConfig(kept)
    found += validation.validate(config, cache)
    errors = [d for d in found if d.severity == "error"]
    # Cross-resource analysis needs each resource to be well formed first;
    # running it on broken specs would only add noise to the real error.
    if not errors:
        config, notes = expand(config)
        found += notes
        found += analyzers.analyze(config, analysis)
        errors = [d for d in found if d.severity == "error"]
    if errors:
        raise ConfigError(ordered(errors))
    config.warnings = ordered(d for d in found if d.severity != "error")
    return config


def load_config(directory: str, strict: bool = False) -> MeshConfig:
    """The control plane's entry: one directory (kinds mesh does not model are
    skipped with a note, or with `strict` rejected as unknown)."""
    return check_config(load_dir(directory), strict=strict)


def load_texts(texts: Mapping[str, str]) -> MeshConfig:
    """Like load_config, from {filename: YAML text} (tests, API callers)."""
    resources, errors = [], []
    for name, text in texts.items():
        try:
            resources.extend(parse_documents(text, file=name))
        except ConfigError as e:
            errors.extend(e.diagnostics)
    if errors:
        raise ConfigError(errors)
    return check_config(MeshConfig(resources))


def expand_paths(paths: Iterable[str]) -> list[str]:
    """Files and directories (recursively) -> YAML files, in a stable order."""
    out: list[str] = []
    for p in paths:
        out.extend(yaml_files(p) if os.path.isdir(p) else [p])
    return out


def ordered(diags: Iterable[Diagnostic]) -> list[Diagnostic]:
    return sorted(diags, key=lambda d: (d.file, d.line, d.resource, d.field, d.message))
