"""Validators for the Kubernetes objects the service registry reads
(mesh/kube.py): Service, Pod, the workload kinds, EndpointSlice, Endpoints,
Namespace, ServiceAccount. Only the fields the registry reads are checked,
as the API server would reject them; the rest of a Kubernetes object is
passed over (a Deployment's strategy, a container's image ...)."""
from __future__ import annotations

from typing import Iterator

from mcp26.mesh import hosts
from mcp26.mesh.diagnostics import Diagnostic
from mcp26.mesh.kube import ADDRESSES_ANNOTATION, WORKLOAD_KINDS
from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.mesh.validation import validator
from mcp26.mesh.validation.report import Report

SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")
API_VERSIONS = {"Service": "v1", "Pod": "v1", "Endpoints": "v1", "Namespace": "v1", "ServiceAccount": "v1",
                "EndpointSlice": "discovery.k8s.io/v1", **{k: "apps/v1" for k in WORKLOAD_KINDS}}


def _common(res: Resource) -> Report:
    rep = Report(res)
    want = API_VERSIONS[res.kind]
    if res.api_version != want:
        rep.error("apiVersion", f"{res.kind} is served at {want!r} here, not {res.api_version!r}")
    if not hosts.is_k8s_subdomain(res.name):
        rep.error("metadata.name", f"invalid name {res.name!r}: must be a lower-case DNS-1123 subdomain")
    if not hosts.is_k8s_name_label(res.namespace):
        rep.error("metadata.namespace", f"invalid namespace {res.namespace!r}: must be a DNS-1123 label")
    rep.labels("metadata.labels", res.labels)
    if not isinstance(res.spec, dict):
        rep.error("spec", "spec must be a mapping")
        rep.typed = False
    return rep


def _addresses(rep: Report, path: str, annotations: dict) -> None:
    value = (annotations or {}).get(ADDRESSES_ANNOTATION)
    if value is None:
        return
    for a in str(value).split(","):
        if not hosts.is_ip(a.strip()):
            rep.error(f"{path}.{ADDRESSES_ANNOTATION}", f"{a.strip()!r} is not an IP address")


def _port_number(rep: Report, path: str, value, what: str = "port") -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
        rep.error(path, f"{what} must be a number in 1..65535, got {value!r}")


@validator("Service")
def validate_service(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    rep = _common(res)
    spec = res.spec if rep.typed else {}
    if spec.get("type", "ClusterIP") not in SERVICE_TYPES:
        rep.error("spec.type", f"unsupported value {spec.get('type')!r}: expected one of {', '.join(SERVICE_TYPES)}")
    if not hosts.is_k8s_name_label(res.name):
        rep.error("metadata.name", f"invalid Service name {res.name!r}: must be a DNS-1035 label")
    ports = spec.get("ports") or []
    if not isinstance(ports, list):
        rep.error("spec.ports", "ports must be a list")
        ports = []
    if not ports and spec.get("type") != "ExternalName":
        rep.error("spec.ports", "a Service needs at least one port")
    names = set()
    for i, p in enumerate(ports):
        path = f"spec.ports[{i}]"
        if not isinstance(p, dict):
            rep.error(path, "a port must be a mapping")
            continue
        _port_number(rep, f"{path}.port", p.get("port"))
        target = p.get("targetPort")
        if isinstance(target, str):
            if not hosts.is_k8s_name_label(target) or len(target) > 15:
                rep.error(f"{path}.targetPort", f"invalid port name {target!r}: an IANA service name "
                                                "(at most 15 lower-case letters, digits, '-')")
        elif target is not None:
            _port_number(rep, f"{path}.targetPort", target, "targetPort")
        if len(ports) > 1 and not p.get("name"):
            rep.error(f"{path}.name", "name is required when a Service has more than one port")
        if p.get("name") in names:
            rep.error(f"{path}.name", f"duplicate port name {p.get('name')!r}")
        names.add(p.get("name"))
        if str(p.get("protocol") or "TCP").upper() not in ("TCP", "UDP", "SCTP"):
            rep.error(f"{path}.protocol", f"unsupported value {p.get('protocol')!r}: expected TCP, UDP or SCTP")
    selector = spec.get("selector")
    if selector is not None and not isinstance(selector, dict):
        rep.error("spec.selector", "selector must be a mapping of labels")
    elif selector:
        rep.labels("spec.selector", selector)
    if spec.get("type") == "ExternalName" and hosts.fqdn_error(str(spec.get("externalName") or "")):
        rep.error("spec.externalName", f"invalid externalName {spec.get('externalName')!r}: must be a DNS name")
    yield from rep.out


def _mapping(rep: Report, path: str, value) -> dict:
    """`value` when it is a mapping (or absent: {}); else an error naming the field."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        rep.error(path, f"must be a mapping, got {type(value).__name__}")
        return {}
    return value


def _mappings(rep: Report, path: str, value) -> list[tuple[str, dict]]:
    """(path, item) for each item of a list of mappings; an error for anything else."""
    if value is None:
        return []
    if not isinstance(value, list):
        rep.error(path, f"must be a list, got {type(value).__name__}")
        return []
    out = []
    for i, item in enumerate(value):
        if isinstance(item, dict):
            out.append((f"{path}[{i}]", item))
        else:
            rep.error(f"{path}[{i}]", f"must be a mapping, got {type(item).__name__}")
    return out


def _pod_spec(rep: Report, path: str, spec) -> None:
    spec = _mapping(rep, path, spec)
    for cp, c in _mappings(rep, f"{path}.containers", spec.get("containers")):
        for pp, p in _mappings(rep, f"{cp}.ports", c.get("ports")):
            _port_number(rep, f"{pp}.containerPort", p.get("containerPort"), "containerPort")


@validator("Pod")
def validate_pod(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    rep = _common(res)
    if rep.typed:
        _pod_spec(rep, "spec", res.spec)
        ip = res.status.get("podIP")
        if ip is not None and not hosts.is_ip(str(ip)):
            rep.error("status.podIP", f"{ip!r} is not an IP address")
        _addresses(rep, "metadata.annotations", res.annotations)
    yield from rep.out


def _validate_workload(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    rep = _common(res)
    if rep.typed:
        template = _mapping(rep, "spec.template", res.spec.get("template"))
        meta = _mapping(rep, "spec.template.metadata", template.get("metadata"))
        labels = _mapping(rep, "spec.template.metadata.labels", meta.get("labels"))
        rep.labels("spec.template.metadata.labels", labels)
        selector = _mapping(rep, "spec.selector.matchLabels",
                            _mapping(rep, "spec.selector", res.spec.get("selector")).get("matchLabels"))
        if selector and not all(labels.get(k) == v for k, v in selector.items()):
            rep.error("spec.template.metadata.labels", "`selector` does not match template `labels`")
        _pod_spec(rep, "spec.template.spec", template.get("spec"))
        _addresses(rep, "spec.template.metadata.annotations",
                   _mapping(rep, "spec.template.metadata.annotations", meta.get("annotations")))
        _addresses(rep, "metadata.annotations", res.annotations)
    yield from rep.out


for _kind in WORKLOAD_KINDS:
    validator(_kind)(_validate_workload)


@validator("EndpointSlice")
def validate_endpoint_slice(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    rep = _common(res)
    if rep.typed:
        if res.spec.get("addressType") not in ("IPv4", "IPv6", "FQDN"):
            rep.error("spec.addressType", "addressType must be IPv4, IPv6 or FQDN")
        for ep_path, ep in _mappings(rep, "spec.endpoints", res.spec.get("endpoints")):
            _mapping(rep, f"{ep_path}.conditions", ep.get("conditions"))
            addresses = ep.get("addresses") or []
            if not isinstance(addresses, list):
                rep.error(f"{ep_path}.addresses", f"must be a list, got {type(addresses).__name__}")
                continue
            for j, a in enumerate(addresses):
                if res.spec.get("addressType") in ("IPv4", "IPv6") and not hosts.is_ip(str(a)):
                    rep.error(f"{ep_path}.addresses[{j}]", f"{a!r} is not an IP address")
        for pp, p in _mappings(rep, "spec.ports", res.spec.get("ports")):
            if p.get("port") is not None:
                _port_number(rep, f"{pp}.port", p.get("port"))
        if "kubernetes.io/service-name" not in res.labels:
            rep.warn("metadata.labels", "no kubernetes.io/service-name label: this slice belongs to no Service")
    yield from rep.out


@validator("Endpoints")
def validate_endpoints(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    rep = _common(res)
    if rep.typed:
        for sp, subset in _mappings(rep, "spec.subsets", res.spec.get("subsets")):
            for ap, a in _mappings(rep, f"{sp}.addresses", subset.get("addresses")):
                if not hosts.is_ip(str(a.get("ip"))):
                    rep.error(f"{ap}.ip", f"{a.get('ip')!r} is not an IP address")
            for pp, p in _mappings(rep, f"{sp}.ports", subset.get("ports")):
                if p.get("port") is not None:
                    _port_number(rep, f"{pp}.port", p.get("port"))
    yield from rep.out


@validator("Namespace")
def validate_namespace(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    rep = _common(res)
    if not hosts.is_k8s_name_label(res.name):
        rep.error("metadata.name", f"invalid Namespace name {res.name!r}: must be a DNS-1123 label")
    yield from rep.out


@validator("ServiceAccount")
def validate_service_account(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    yield from _common(res).out
