"""Validators for PeerAuthentication (security.istio.io), after istio/istio
pkg/config/validation (ValidatePeerAuthentication): mTLS mode per workload and
per port."""
from __future__ import annotations

from typing import Iterator

from mcp26.mesh.diagnostics import Diagnostic
from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.mesh.validation import validator
from mcp26.mesh.validation.report import schema_report
from mcp26.mesh.validation.schema import Enum, Map, Obj

SECURITY_VERSIONS = ("security.istio.io/v1", "security.istio.io/v1beta1")
ROOT_NAMESPACE = "istio-system"
MTLS = {"mode": Enum("UNSET", "DISABLE", "PERMISSIVE", "STRICT")}
PEER_AUTHENTICATION = Obj({"selector": {"matchLabels": Map("string")}, "mtls": MTLS,
                           "portLevelMtls": Map(MTLS)})


@validator("PeerAuthentication")
def validate_peer_authentication(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    rep, errs = schema_report(res, SECURITY_VERSIONS, PEER_AUTHENTICATION)
    if not errs.errors:
        labels = (res.spec.get("selector") or {}).get("matchLabels")
        rep.workload_selector("spec.selector.matchLabels", labels)
        ports = res.spec.get("portLevelMtls") or {}
        if ports and not labels:
            rep.error("spec.portLevelMtls", "portLevelMtls requires a workload selector (selector.matchLabels)")
        for port in ports:
            if not str(port).isdigit() or not 1 <= int(port) <= 65535:
                rep.error(f"spec.portLevelMtls.{port}", f"port must be a number in 1..65535, got {port!r}")
        if res.namespace == ROOT_NAMESPACE and labels:
            rep.warn("spec.selector", "a PeerAuthentication with a selector in the root namespace applies "
                                      "only to workloads of the root namespace")
    yield from rep.out
