"""ServiceEntry (networking.istio.io), after Istio's ValidateServiceEntry."""
from __future__ import annotations

from typing import Iterator

from mcp26.mesh import hosts
from mcp26.mesh.diagnostics import Diagnostic
from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.mesh.validation import validator
from mcp26.mesh.validation.networking import HTTP_PROTOCOLS, PROTOCOLS, TLS_PROTOCOLS, check_kind
from mcp26.mesh.validation.report import Report, semantic
from mcp26.mesh.validation.workload_entry import workload_entry


@validator("ServiceEntry")
def validate_service_entry(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    yield from semantic(_service_entry, check_kind(res), res)


def _service_entry(rep: Report, res: Resource) -> None:
    spec = res.spec
    selector = spec.get("workloadSelector")
    endpoints = spec.get("endpoints")
    if selector is not None:
        labels = selector.get("labels") or {}
        for k, v in labels.items():
            if k == "":   # Istio's ValidateAlphaWorkloadSelector
                rep.error("spec.workloadSelector.labels", f"empty key is not supported in selector: \"{k}={v}\"")
            if "*" in k or "*" in str(v):
                rep.error(f"spec.workloadSelector.labels.{k}", f"wildcard is not supported in selector: \"{k}={v}\"")
        if not labels:
            rep.warn("spec.workloadSelector", "service entry: workload selector specified without labels, "
                                              "will be applied to all services in namespace")
    if selector is not None and endpoints is not None:
        rep.error("spec.workloadSelector", "only one of WorkloadSelector or Endpoints is allowed in Service Entry")
    se_hosts = spec.get("hosts") or []
    resolution = spec.get("resolution") or "NONE"
    if not se_hosts:
        rep.error("spec.hosts", "service entry must have at least one host")
    for i, h in enumerate(se_hosts):
        if h == "*":
            rep.error(f"spec.hosts[{i}]", f"invalid host {h}")
            continue
        err = hosts.wildcard_domain_error(h)
        if err:
            rep.error(f"spec.hosts[{i}]", err)
        # Partial wildcards are only a warning, and none at all for DYNAMIC_DNS.
        partial = hosts.partial_wildcard_error(h) if resolution != "DYNAMIC_DNS" else None
        if partial:
            rep.warn(f"spec.hosts[{i}]", partial)
    cidr = False
    for i, a in enumerate(spec.get("addresses") or []):
        cidr = cidr or "/" in a
        err = hosts.ip_subnet_error(a)
        if err:
            rep.error(f"spec.addresses[{i}]", err)
    if cidr and resolution not in ("NONE", "STATIC"):
        rep.error("spec.addresses", "CIDR addresses are allowed only for NONE/STATIC resolution types")

    port_names: set[str] = set()
    port_numbers: set[int] = set()
    for i, port in enumerate(spec.get("ports") or []):
        p = f"spec.ports[{i}]"
        name, number = port.get("name", ""), port.get("number", 0)
        if name in port_names:
            rep.error(f"{p}.name", f"service entry port name {name!r} already defined")
        if number in port_numbers:
            rep.error(f"{p}.number", f"service entry port {number} already defined")
        port_names.add(name)
        port_numbers.add(number)
        if not hosts.is_k8s_name_label(name):
            rep.error(f"{p}.name", f"invalid port name: {name}")
        proto = port.get("protocol")
        if proto and proto.lower() not in PROTOCOLS:
            rep.error(f"{p}.protocol", f"unsupported protocol: {proto}")
        rep.port(f"{p}.number", number)
        if port.get("targetPort"):
            rep.port(f"{p}.targetPort", port["targetPort"])
            if resolution == "NONE":
                rep.warn(f"{p}.targetPort", "targetPort has no effect when resolution mode is NONE")

    if resolution == "NONE":
        if endpoints:
            rep.error("spec.endpoints", "no endpoints should be provided for resolution type none")
        if selector is not None:
            rep.warn("spec.workloadSelector", "workloadSelector should not be set when resolution mode is NONE")
    elif resolution == "STATIC":
        for i, ep in enumerate(endpoints or []):
            workload_entry(rep, f"spec.endpoints[{i}]", ep, port_names, allow_fqdn=False)
    elif resolution == "DYNAMIC_DNS":
        _dynamic_dns(rep, res, se_hosts)
    else:  # DNS, DNS_ROUND_ROBIN
        if not endpoints:
            for i, h in enumerate(se_hosts):
                if hosts.fqdn_error(h):
                    rep.error(f"spec.hosts[{i}]", f"hosts must be FQDN if no endpoints are provided for resolution mode {resolution}")
        if resolution == "DNS_ROUND_ROBIN" and len(endpoints or []) > 1:
            rep.error("spec.endpoints", f"there must only be 0 or 1 endpoint for resolution mode {resolution}")
        for i, ep in enumerate(endpoints or []):
            addr = ep.get("address") or ""
            if addr.startswith("unix://"):
                # Istio checks a DNS endpoint as an IP or an FQDN only: a unix
                # socket cannot be resolved.
                rep.error(f"spec.endpoints[{i}].address", f"endpoint address {addr!r} is not a valid FQDN or an IP address"
                          .replace("'", '"'))
                continue
            workload_entry(rep, f"spec.endpoints[{i}]", ep, port_names, allow_fqdn=True)
        if selector is not None:
            rep.warn("spec.workloadSelector", f"workloadSelector should not be set when resolution mode is {resolution}")
    if resolution != "NONE" and len(se_hosts) > 1:
        for i, port in enumerate(spec.get("ports") or []):
            proto = str(port.get("protocol") or "").lower()
            if proto not in HTTP_PROTOCOLS and proto not in TLS_PROTOCOLS:
                rep.error(f"spec.ports[{i}].protocol", "multiple hosts provided with non-HTTP, non-TLS ports")
                break
    rep.export_to("spec.exportTo", spec.get("exportTo"), res.namespace, service_entry=True)


def _dynamic_dns(rep: Report, res: Resource, se_hosts: list) -> None:
    """Istio's ValidateServiceEntry, case DYNAMIC_DNS: wildcard hosts resolved
    per request (dynamic forward proxy), so no addresses, no endpoints, and
    only protocols that carry the host name (Host header or SNI)."""
    spec, mode = res.spec, "DYNAMIC_DNS"
    if not se_hosts:
        rep.error("spec.hosts", f"at least one wildcard host must be provided for resolution type {mode}")
    for i, h in enumerate(se_hosts):
        if not str(h).startswith("*"):
            rep.error(f"spec.hosts[{i}]", f"host must be wildcarded for resolution mode {mode}")
    if spec.get("addresses"):
        rep.error("spec.addresses", f"addresses cannot be set for resolution type {mode}. HTTP route domains will "
                                    "only be generatedfrom the hosts field values")
    if spec.get("endpoints"):
        rep.error("spec.endpoints", f"endpoints cannot be set for resolution type {mode}. Destination IP address "
                                    "determined from hostsfield values")
    for i, port in enumerate(spec.get("ports") or []):
        if str(port.get("protocol") or "").lower() not in ("http", "tls", "grpc", "http2"):
            rep.error(f"spec.ports[{i}].protocol", f"only HTTP, TLS, GRPC, and HTTP2 protocols are supported for "
                                                   f"resolution type {mode}")
    rep.warn("spec.resolution", f"resolution {mode} is not translated by this control plane: "
                                "no cluster resolves these hosts per request")
