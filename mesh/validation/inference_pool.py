"""Validators for InferencePool (inference.networking.k8s.io/v1) and
InferenceObjective (inference.networking.x-k8s.io/v1alpha2), after the Gateway
API Inference Extension's CRDs (their OpenAPI rules and CEL validations)."""
from __future__ import annotations

from typing import Iterator

from mcp26.mesh.diagnostics import Diagnostic
from mcp26.mesh.inference_pool import (FAIL_CLOSE, FAIL_OPEN, OBJECTIVE_API_VERSIONS, OBJECTIVE_KIND, POOL_API_VERSION,
                                 POOL_KIND)
from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.mesh.validation import validator
from mcp26.mesh.validation.report import schema_report
from mcp26.mesh.validation.schema import Enum, Map, Obj

POOL = Obj({
    "selector": Obj({"matchLabels": Map("string")}, required=("matchLabels",)),
    "targetPorts": [Obj({"number": "int32"}, required=("number",))],
    "endpointPickerRef": Obj({
        "group": "string", "kind": "string", "name": "string",
        "port": Obj({"number": "int32"}, required=("number",)),
        "failureMode": Enum(FAIL_OPEN, FAIL_CLOSE),
    }, required=("name",)),
}, required=("selector", "targetPorts", "endpointPickerRef"))
OBJECTIVE = Obj({
    "priority": "int32",
    "poolRef": Obj({"group": "string", "kind": "string", "name": "string"}, required=("name",)),
}, required=("poolRef",))
MAX_TARGET_PORTS = 8          # the CRD's maxItems
MAX_SELECTOR_LABELS = 64


@validator(POOL_KIND)
def validate_inference_pool(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    rep, errs = schema_report(res, (POOL_API_VERSION,), POOL)
    typed = not errs.wrong_type
    spec = res.spec if isinstance(res.spec, dict) else {}
    if typed:
        labels = (spec.get("selector") or {}).get("matchLabels")
        if labels is not None:
            if not labels:
                rep.error("spec.selector.matchLabels", "selector must name at least one label: "
                                                       "an empty selector would select every workload")
            elif len(labels) > MAX_SELECTOR_LABELS:
                rep.error("spec.selector.matchLabels", f"at most {MAX_SELECTOR_LABELS} labels")
            rep.labels("spec.selector.matchLabels", labels)
        ports = spec.get("targetPorts")
        if ports is not None:
            if not 1 <= len(ports) <= MAX_TARGET_PORTS:
                rep.error("spec.targetPorts", f"between 1 and {MAX_TARGET_PORTS} target ports are required")
            seen = set()
            for i, p in enumerate(ports):
                rep.port(f"spec.targetPorts[{i}].number", p.get("number"))
                if p.get("number") in seen:
                    rep.error(f"spec.targetPorts[{i}].number", f"port number {p.get('number')} is listed twice: "
                                                               "port numbers must be unique")
                seen.add(p.get("number"))
        ref = spec.get("endpointPickerRef") or {}
        kind, group = ref.get("kind") or "Service", ref.get("group") or ""
        if kind == "Service" and group == "" and "port" not in ref:
            rep.error("spec.endpointPickerRef.port", "port is required when kind is 'Service' or unspecified")
        if "port" in ref:
            rep.port("spec.endpointPickerRef.port.number", (ref.get("port") or {}).get("number"))
    yield from rep.out


@validator(OBJECTIVE_KIND)
def validate_inference_objective(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    rep, errs = schema_report(res, OBJECTIVE_API_VERSIONS, OBJECTIVE)
    typed = not errs.wrong_type
    if typed:
        ref = (res.spec or {}).get("poolRef") or {}
        if (ref.get("kind") or POOL_KIND) != POOL_KIND:
            rep.error("spec.poolRef.kind", f"poolRef must name an {POOL_KIND}, not {ref.get('kind')!r}")
        names = {r.name for r in config.of_kind(POOL_KIND) if r.namespace == res.namespace}
        if ref.get("name") and ref["name"] not in names:
            rep.warn("spec.poolRef.name", f"no InferencePool {res.namespace}/{ref['name']} in this configuration")
    yield from rep.out
