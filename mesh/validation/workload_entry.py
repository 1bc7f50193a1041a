"""WorkloadEntry (networking.istio.io), and the endpoint rules a ServiceEntry's
inline endpoints share with it, after Istio's ValidateWorkloadEntry."""
from __future__ import annotations

from typing import Iterator

from mcp26.mesh import hosts
from mcp26.mesh.diagnostics import Diagnostic
from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.mesh.validation import validator
from mcp26.mesh.validation.networking import check_kind
from mcp26.mesh.validation.report import Report, semantic


def workload_entry(rep: Report, p: str, we: dict, service_ports: set[str] | None, allow_fqdn: bool) -> None:
    addr = we.get("address") or ""
    unix = addr.startswith("unix://")
    if not addr:
        if not we.get("network"):
            rep.error(f"{p}.address", "address is required")
            return
        rep.warn(f"{p}.address", f"address is unset with network {we.get('network')!r}")
    if unix:
        path = addr[len("unix://"):]
        if not path.startswith("@") and (not path.startswith("/") or path.endswith("/")):
            rep.error(f"{p}.address", f"{path} is not an absolute path to a file")
        if we.get("ports"):
            rep.error(f"{p}.ports", f"unix endpoint {addr} must not include ports")
    elif addr and not hosts.is_ip(addr):
        if not allow_fqdn:
            rep.error(f"{p}.address", f"endpoint address {addr!r} is not a valid IP address")
        elif hosts.fqdn_error(addr):
            rep.error(f"{p}.address", f"endpoint address {addr!r} is not a valid FQDN or an IP address")
    for name, port in (we.get("ports") or {}).items():
        if service_ports is not None and name not in service_ports:
            rep.error(f"{p}.ports.{name}", f"endpoint port {port} is not defined by the service entry")
        if not hosts.is_k8s_name_label(name):
            rep.error(f"{p}.ports.{name}", f"invalid port name: {name}")
        rep.port(f"{p}.ports.{name}", port)
    rep.labels(f"{p}.labels", we.get("labels"))
    if unix and service_ports is not None and len(service_ports) != 1:
        rep.error(p, "exactly 1 service port required for unix endpoints")


@validator("WorkloadEntry")
def validate_workload_entry(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    yield from semantic(lambda rep, r: workload_entry(rep, "spec", r.spec, None, allow_fqdn=True), check_kind(res), res)
