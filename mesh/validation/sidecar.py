"""Validator for Sidecar (networking.istio.io), after istio/istio
pkg/config/validation (ValidateSidecar): egress hosts as NAMESPACE/HOST,
ingress ports with a defaultEndpoint the proxy forwards to."""
from __future__ import annotations

from typing import Iterator

from mcp26.mesh.diagnostics import Diagnostic
from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.mesh.validation import validator
from mcp26.mesh.validation.report import Report, schema_report
from mcp26.mesh.validation.schema import Enum, Map, Obj

VERSIONS = ("networking.istio.io/v1", "networking.istio.io/v1beta1", "networking.istio.io/v1alpha3")
PORT = Obj({"number": "uint32", "protocol": "string", "name": "string", "targetPort": "uint32"})
CAPTURE = Enum("DEFAULT", "IPTABLES", "NONE")
SIDECAR = Obj({
    "workloadSelector": {"labels": Map("string")},
    "ingress": [Obj({"port": PORT, "bind": "string", "captureMode": CAPTURE, "defaultEndpoint": "string",
                     "tls": "any", "connectionPool": "any"}, required=("port",))],
    "egress": [Obj({"port": PORT, "bind": "string", "captureMode": CAPTURE, "hosts": ["string"]},
                   required=("hosts",))],
    "outboundTrafficPolicy": {"mode": Enum("REGISTRY_ONLY", "ALLOW_ANY"), "egressProxy": "any"},
    "inboundConnectionPool": "any",
})


@validator("Sidecar")
def validate_sidecar(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    rep, errs = schema_report(res, VERSIONS, SIDECAR)
    if not errs.errors:
        _semantic(rep, res.spec)
    yield from rep.out


def _semantic(rep: Report, spec: dict) -> None:
    if spec.get("workloadSelector") is not None:
        labels = spec["workloadSelector"].get("labels")
        if not labels:
            rep.error("spec.workloadSelector", "sidecar: workloadSelector must have at least one label")
        rep.workload_selector("spec.workloadSelector.labels", labels)
    seen = set()
    for i, ing in enumerate(spec.get("ingress") or []):
        p = f"spec.ingress[{i}]"
        port = ing.get("port") or {}
        number = port.get("number")
        if not number:
            rep.error(f"{p}.port.number", "sidecar: ingress listener port number is required")
        else:
            rep.port(f"{p}.port.number", number)
            if number in seen:
                rep.error(f"{p}.port.number", f"sidecar: ports on IP bound listeners must be unique ({number})")
            seen.add(number)
        ep = ing.get("defaultEndpoint") or ""
        if not ep:
            rep.error(f"{p}.defaultEndpoint", "sidecar: defaultEndpoint is required here (no iptables capture: "
                                              "the proxy forwards to it, e.g. 127.0.0.1:8080)")
        elif not ep.startswith("unix://"):
            host, _, ep_port = ep.rpartition(":")
            if host not in ("127.0.0.1", "0.0.0.0", "[::1]", "[::]", "") or not ep_port.isdigit() \
                    or not 1 <= int(ep_port) <= 65535:
                rep.error(f"{p}.defaultEndpoint", f"sidecar: defaultEndpoint must be 127.0.0.1:PORT, 0.0.0.0:PORT, "
                                                  f":PORT or unix:///path, got {ep!r}")
    for i, eg in enumerate(spec.get("egress") or []):
        p = f"spec.egress[{i}]"
        if eg.get("port"):
            rep.port(f"{p}.port.number", eg["port"].get("number"))
        hosts = eg.get("hosts") or []
        if not hosts:
            rep.error(f"{p}.hosts", "sidecar: egress listener must contain at least one host")
        for j, h in enumerate(hosts):
            ns, sep, host = str(h).partition("/")
            if not sep or not ns or not host:
                rep.error(f"{p}.hosts[{j}]", f"sidecar: host must be of the form NAMESPACE/DNSNAME "
                                             f"(namespace ., *, ~ or a name), got {h!r}")
            elif "/" in host:
                rep.error(f"{p}.hosts[{j}]", f"sidecar: host {h!r} has more than one /")
