"""Kubernetes objects as the service registry, read from files as istiod reads
them from the API server.

Istio's hosts are Kubernetes Services; here a directory may hold the same
kubectl YAML a cluster has, and `registry_resources(config)` turns it into
what the rest of the mesh model already understands -- a ServiceEntry per
Service, a WorkloadEntry per workload instance -- the way istiod's Kubernetes
controller builds its service registry:

- `v1` Service -> ServiceEntry `NAME.NS.svc.cluster.local` (location
  MESH_INTERNAL, resolution STATIC, the clusterIP as address); ports keep
  their number and name, `targetPort` by number or by name (resolved per
  workload from its containers' named ports), the protocol chosen as Istio
  does (`appProtocol`, else the port name's prefix `http-`, `grpc-`, ...).
  `type: ExternalName` becomes a DNS ServiceEntry for the external name.
- Endpoints come from EndpointSlices (`discovery.k8s.io/v1`, by the
  `kubernetes.io/service-name` label; only ready ones) or `v1` Endpoints when
  the directory has any for the Service; otherwise from the workloads the
  Service's selector matches.
- Workloads: a Pod (`status.podIP`), and the Pod template of a Deployment,
  StatefulSet, ReplicaSet or DaemonSet. A Pod without `status.podIP`, or a
  template, has addresses only when named by the annotation
  `mcp-mesh.io/addresses: "127.0.0.2,127.0.0.3"` (on the Pod, or on the
  workload or its template: one instance per address, as replicas are);
  without it a workload still lends its labels (subsets, analysis) but serves
  no endpoint -- a file has no scheduler to give Pods addresses.
- Namespace and ServiceAccount are kept as they are (identity reads them).

Synthesized resources carry the file and line of the object they come from,
so a diagnostic about one names the user's file.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mcp26.mesh.resources import MeshConfig, Resource

CORE = "v1"
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "ReplicaSet", "DaemonSet")
REGISTRY_KINDS = ("Service", "Pod", "EndpointSlice", "Endpoints", "Namespace", "ServiceAccount", *WORKLOAD_KINDS)
ADDRESSES_ANNOTATION = "mcp-mesh.io/addresses"
SYNTHESIZED_FROM = "mcp-mesh.io/synthesized-from"
CLUSTER_DOMAIN = "svc.cluster.local"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"

# Istio's protocol selection: appProtocol values it knows, and port-name prefixes.
_APP_PROTOCOLS = {
    "http": "HTTP", "http2": "HTTP2", "https": "HTTPS", "grpc": "GRPC", "grpc-web": "GRPC-WEB",
    "tcp": "TCP", "tls": "TLS", "udp": "UDP", "mongo": "Mongo", "mysql": "MySQL", "redis": "Redis",
    "kubernetes.io/h2c": "HTTP2", "kubernetes.io/ws": "HTTP", "kubernetes.io/wss": "HTTPS",
}
_NAME_PREFIXES = ("grpc-web", "http2", "https", "http", "grpc", "tcp", "tls", "udp", "mongo", "mysql", "redis")


def is_registry_kind(res: Resource) -> bool:
    return res.kind in REGISTRY_KINDS and res.api_version in (
        "v1", "apps/v1", "discovery.k8s.io/v1")


def service_host(name: str, namespace: str) -> str:
    return f"{name}.{namespace}.{CLUSTER_DOMAIN}"


def port_protocol(port: dict) -> str:
    """Istio's rule: appProtocol, else the name's `PROTOCOL[-suffix]`, else
    UDP for UDP ports, else "" (unspecified: Istio sniffs the protocol)."""
    app = str(port.get("appProtocol") or "").lower()
    if app in _APP_PROTOCOLS:
        return _APP_PROTOCOLS[app]
    if str(port.get("protocol") or "TCP").upper() == "UDP":
        return "UDP"
    name = str(port.get("name") or "").lower()
    for prefix in _NAME_PREFIXES:
        if name == prefix or name.startswith(prefix + "-"):
            return _APP_PROTOCOLS[prefix]
    return ""


@dataclass
class Workload:
    """One instance's labels, addresses and named container ports."""
    source: Resource
    name: str
    namespace: str
    labels: dict
    addresses: list[str]
    named_ports: dict = field(default_factory=dict)    # container port name -> number
    service_account: str = "default"


def _annotation_addresses(*annotation_maps: dict) -> list[str]:
    for m in annotation_maps:
        value = (m or {}).get(ADDRESSES_ANNOTATION)
        if value:
            return [a.strip() for a in str(value).split(",") if a.strip()]
    return []


def _pod_spec_ports(pod_spec: dict) -> dict:
    out = {}
    for c in (pod_spec or {}).get("containers") or []:
        for p in (c or {}).get("ports") or []:
            if isinstance(p, dict) and p.get("name") and p.get("containerPort"):
                out[str(p["name"])] = int(p["containerPort"])
    return out


def workloads(config: MeshConfig) -> list[Workload]:
    out = []
    for res in config.of_kind("Pod", *WORKLOAD_KINDS):
        if not is_registry_kind(res):
            continue
        spec = res.spec or {}
        if res.kind == "Pod":
            ip = res.status.get("podIP")
            addresses = [ip] if ip else _annotation_addresses(res.annotations)
            out.append(Workload(res, res.name, res.namespace, dict(res.labels), addresses,
                                _pod_spec_ports(spec), str(spec.get("serviceAccountName") or "default")))
            continue
        template = spec.get("template") or {}
        meta = template.get("metadata") or {}
        pod_spec = template.get("spec") or {}
        addresses = _annotation_addresses(meta.get("annotations"), res.annotations)
        out.append(Workload(res, res.name, res.namespace, {str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
                            addresses, _pod_spec_ports(pod_spec),
                            str(pod_spec.get("serviceAccountName") or "default")))
    return out


def _selects(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == str(v) for k, v in selector.items())


def synthesized(source: Resource, kind: str, name: str, spec: dict, labels: dict | None = None) -> Resource:
    """An Istio resource standing for `source`: its namespace, file and line,
    marked SYNTHESIZED_FROM (also what mesh.gateway_api builds)."""
    return Resource(api_version="networking.istio.io/v1", kind=kind, name=name, namespace=source.namespace,
                    spec=spec, file=source.file, line=source.line, labels=labels or {},
                    annotations={SYNTHESIZED_FROM: source.ref})


def _pods_by_ip(instances: list[Workload]) -> dict[tuple[str, str], Workload]:
    return {(w.namespace, a): w for w in instances if w.source.kind == "Pod" for a in w.addresses}


def _endpoint(address: str, ports: dict, pod: Workload | None) -> dict:
    """One inline endpoint; with the Pod behind it (istiod's endpoint -> Pod lookup) its labels,
    so DestinationRule subsets select it, and its service account, the identity mTLS checks."""
    ep = {"address": address, "ports": ports}
    if pod is not None:
        if pod.labels:
            ep["labels"] = dict(pod.labels)
        ep["serviceAccount"] = pod.service_account
    return ep


def _slices_by_service(config: MeshConfig) -> dict[tuple[str, str], list[Resource]]:
    """EndpointSlices and Endpoints by (namespace, Service name): looked up per Service, not
    searched (1,000 Services x 1,000 slices was 0.4 s of every change set)."""
    out: dict[tuple[str, str], list[Resource]] = {}
    for es in config.of_kind("EndpointSlice"):
        out.setdefault((es.namespace, es.labels.get(SERVICE_NAME_LABEL)), []).append(es)
    for ep in config.of_kind("Endpoints"):
        out.setdefault((ep.namespace, ep.name), []).append(ep)
    return out


def _slice_endpoints(config: MeshConfig, svc: Resource, pods: dict | None = None,
                     slices: dict | None = None) -> list[dict] | None:
    """Inline ServiceEntry endpoints from the Service's EndpointSlices or
    Endpoints (ready addresses only); None when the directory has neither."""
    found = False
    out = []
    pods = pods or {}
    mine = (slices if slices is not None else _slices_by_service(config)).get((svc.namespace, svc.name), [])
    for es in mine:
        if es.kind != "EndpointSlice":
            continue
        found = True
        ports = {str(p.get("name") or ""): int(p["port"]) for p in es.spec.get("ports") or [] if p.get("port")}
        for ep in es.spec.get("endpoints") or []:
            if (ep.get("conditions") or {}).get("ready") is False:
                continue
            for address in ep.get("addresses") or []:
                out.append(_endpoint(address, {k: v for k, v in ports.items() if k}, pods.get((svc.namespace, address))))
    for ep in mine:
        if ep.kind != "Endpoints":
            continue
        found = True
        for subset in ep.spec.get("subsets") or []:
            ports = {str(p.get("name") or ""): int(p["port"]) for p in subset.get("ports") or [] if p.get("port")}
            for a in subset.get("addresses") or []:
                if a.get("ip"):
                    out.append(_endpoint(a["ip"], {k: v for k, v in ports.items() if k}, pods.get((svc.namespace, a["ip"]))))
    if not found:
        return None
    # A Service port without a name maps by its targetPort/number (the ServiceEntry's).
    return out


def registry_resources(config: MeshConfig) -> list[Resource]:
    """The ServiceEntries and WorkloadEntries the Kubernetes objects of `config` stand for."""
    out: list[Resource] = []
    instances = workloads(config)
    pods = _pods_by_ip(instances)
    slices = _slices_by_service(config)
    for svc in config.of_kind("Service"):
        if not is_registry_kind(svc):
            continue
        spec = svc.spec or {}
        host = service_host(svc.name, svc.namespace)
        if spec.get("type") == "ExternalName":
            ports = [{"number": int(p["port"]), "name": str(p.get("name") or f"port-{p['port']}"),
                      **({"protocol": port_protocol(p)} if port_protocol(p) else {})}
                     for p in spec.get("ports") or [] if p.get("port")]
            out.append(synthesized(svc, "ServiceEntry", f"{svc.name}-k8s", {
                "hosts": [host], "location": "MESH_EXTERNAL", "resolution": "DNS", "ports": ports or
                [{"number": 80, "name": "http", "protocol": "HTTP"}],
                "endpoints": [{"address": str(spec.get("externalName"))}]}))
            continue
        ports = []
        for p in spec.get("ports") or []:
            if not isinstance(p, dict) or not p.get("port"):
                continue
            entry = {"number": int(p["port"]), "name": str(p.get("name") or f"port-{p['port']}")}
            if port_protocol(p):
                entry["protocol"] = port_protocol(p)
            target = p.get("targetPort")
            if isinstance(target, int) and target != entry["number"]:
                entry["targetPort"] = target
            ports.append(entry)
        se = {"hosts": [host], "location": "MESH_INTERNAL", "resolution": "STATIC", "ports": ports}
        ip = spec.get("clusterIP")
        if ip and ip != "None":
            se["addresses"] = [ip]
        endpoints = _slice_endpoints(config, svc, pods, slices)
        selector = {str(k): str(v) for k, v in (spec.get("selector") or {}).items()}
        if endpoints is not None:
            se["endpoints"] = endpoints
        elif selector:
            se["workloadSelector"] = {"labels": selector}
        out.append(synthesized(svc, "ServiceEntry", f"{svc.name}-k8s", se))
    # One WorkloadEntry per workload instance with an address; a named targetPort
    # of any Service selecting it becomes that Service port's entry in `ports`.
    # Only a Service with a named targetPort adds to a workload's entry: match just those (every
    # workload against every Service was 2 s of every change set at 2,000 Pods x 1,000 Services).
    named_services: dict[str, list[Resource]] = {}
    for svc in config.of_kind("Service"):
        if is_registry_kind(svc) and any(isinstance(p.get("targetPort"), str)
                                         for p in svc.spec.get("ports") or [] if isinstance(p, dict)):
            named_services.setdefault(svc.namespace, []).append(svc)
    for w in instances:
        named = {}
        for svc in named_services.get(w.namespace, ()):
            if not _selects(svc.spec.get("selector") or {}, w.labels):
                continue
            for p in svc.spec.get("ports") or []:
                target = p.get("targetPort")
                if isinstance(target, str) and target in w.named_ports:
                    named[str(p.get("name") or f"port-{p['port']}")] = w.named_ports[target]
        for i, address in enumerate(w.addresses):
            name = w.name if len(w.addresses) == 1 and w.source.kind == "Pod" else f"{w.name}-{i}"
            spec = {"address": address, "labels": dict(w.labels), "serviceAccount": w.service_account}
            if named:
                spec["ports"] = named
            out.append(synthesized(w.source, "WorkloadEntry", f"{name}-k8s", spec, labels=dict(w.labels)))
    return out
