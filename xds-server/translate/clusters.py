"""CDS and EDS: clusters and their endpoints from ServiceEntry + DestinationRule.

One cluster per service port (outbound|PORT||HOST) and one per DestinationRule
subset (outbound|PORT|SUBSET|HOST). STATIC services become EDS clusters whose
ClusterLoadAssignment holds the endpoints matching the subset's labels; DNS
services become STRICT_DNS (DNS_ROUND_ROBIN: LOGICAL_DNS) clusters with the
endpoints inline; NONE (and loadBalancer PASSTHROUGH) become ORIGINAL_DST.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from envoy.config.cluster.v3 import circuit_breaker_pb2, cluster_pb2, outlier_detection_pb2
from envoy.config.core.v3 import address_pb2, base_pb2, config_source_pb2, protocol_pb2, socket_option_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.extensions.transport_sockets.raw_buffer.v3 import raw_buffer_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from envoy.type.v3 import percent_pb2
from google.protobuf import any_pb2

from mcp26.mesh.resources import Resource
from mcp26.mesh.qos import QosClass, qos_class_for
from mcp26.xds.translate import transport_sockets, values
from mcp26.xds.translate.index import (H2_PROTOCOLS, ROOT_NAMESPACE, TCP_PROTOCOLS, Endpoint, MeshIndex, Service,
                                        ServicePort, labels_match)
from mcp26.xds.translate.names import cluster_name
from mcp26.xds.translate.overlay import endpoint_key

Cluster = cluster_pb2.Cluster
MAX_UINT32 = 4294967295
DEFAULT_CONNECT_TIMEOUT = 10.0        # istiod's default (MeshConfig.connectTimeout)
HTTP_PROTOCOL_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
# setsockopt levels and names for the DSCP byte (Linux).
IPPROTO_IP, IP_TOS = 0, 1
IPPROTO_IPV6, IPV6_TCLASS = 41, 67

_SIMPLE_LB = {
    "ROUND_ROBIN": Cluster.ROUND_ROBIN,
    "LEAST_REQUEST": Cluster.LEAST_REQUEST,
    "LEAST_CONN": Cluster.LEAST_REQUEST,      # deprecated Istio alias
    "RANDOM": Cluster.RANDOM,
    "UNSPECIFIED": Cluster.LEAST_REQUEST,
}
# What proxyless gRPC clients take in Cluster.lb_policy (gRFC A27, A42); grpc
# C-core (grpcio) NACKs LEAST_REQUEST ("LB policy is not supported"), so
# everything else -- Istio's default LEAST_REQUEST included -- is ROUND_ROBIN.
_GRPC_LB = {Cluster.ROUND_ROBIN, Cluster.RING_HASH}


@dataclass(frozen=True)
class ClusterOptions:
    grpc: bool = False                    # proxyless gRPC flavour
    upstream_bind_address: str = "127.0.0.1"
    trust_domain: str = "cluster.local"   # of the SPIFFE ids built from service accounts


# Istio's auto mTLS: an endpoint labelled security.istio.io/tlsMode=istio has a
# sidecar; the label becomes endpoint metadata a cluster's transport_socket_matches select on.
TLS_MODE_LABEL = "security.istio.io/tlsMode"
TRANSPORT_SOCKET_MATCH = "envoy.transport_socket_match"


def service_sans(service: Service, trust_domain: str) -> list[str]:
    """The identities a service's endpoints may present (istiod's ServiceAccounts): the
    ServiceEntry's subjectAltNames plus spiffe://TD/ns/NS/sa/SA of every endpoint with a
    serviceAccount (WorkloadEntries, and through the Kubernetes registry Pods/Deployments)."""
    sans = {str(s) for s in service.source.spec.get("subjectAltNames") or []}
    for ep in service.endpoints:
        if ep.service_account:
            sans.add(f"spiffe://{trust_domain}/ns/{ep.namespace or service.namespace}/sa/{ep.service_account}")
    return sorted(sans)


def _service_mtls_disabled(idx: MeshIndex, service: Service) -> bool:
    """istiod's best-effort service mTLS mode: the namespace-wide PeerAuthentication of the
    service's namespace, else the root namespace's; DISABLE turns auto mTLS off."""
    for ns in (service.namespace, ROOT_NAMESPACE):
        for pa in sorted(idx.config.of_kind("PeerAuthentication"), key=lambda r: r.name):
            if pa.namespace == ns and not (pa.spec.get("selector") or {}).get("matchLabels"):
                mode = str((pa.spec.get("mtls") or {}).get("mode") or "UNSET").upper()
                if mode != "UNSET":
                    return mode == "DISABLE"
    return False


def _auto_mtls(cluster: Cluster, idx: MeshIndex, service: Service, port: ServicePort, endpoints: list,
               h2: bool, subset: str, opts: ClusterOptions) -> None:
    """No DestinationRule tls: ISTIO_MUTUAL to the endpoints labelled tlsMode=istio, plaintext
    to the others (istiod's autoDetected mTLS: matches tlsMode-istio, then tlsMode-disabled).
    Not for MESH_EXTERNAL services nor when the service's namespace DISABLEs mTLS. istiod adds
    the matches to every such cluster; here only where an endpoint carries the label (with none,
    the default raw_buffer match is what Envoy would pick anyway)."""
    if str(service.source.spec.get("location") or "").upper() == "MESH_EXTERNAL" \
            or not any(e.labels.get(TLS_MODE_LABEL) == "istio" for e in endpoints) \
            or _service_mtls_disabled(idx, service):
        return
    ctx = transport_sockets.istio_mutual_upstream(transport_sockets.sni(service.host, port.number, subset),
                                                  service_sans(service, opts.trust_domain), h2)
    istio = cluster.transport_socket_matches.add(name="tlsMode-istio")
    istio.match.update({"tlsMode": "istio"})
    istio.transport_socket.CopyFrom(transport_sockets.transport_socket(ctx))
    plain = cluster.transport_socket_matches.add(name="tlsMode-disabled")
    plain.match.SetInParent()
    plain.transport_socket.name = "envoy.transport_sockets.raw_buffer"
    plain.transport_socket.typed_config.Pack(raw_buffer_pb2.RawBuffer())


def ads_config_source() -> config_source_pb2.ConfigSource:
    src = config_source_pb2.ConfigSource()
    src.ads.SetInParent()
    src.resource_api_version = config_source_pb2.V3
    return src


def traffic_policy(dr: Resource | None, subset: dict | None, port: int) -> dict:
    """The DestinationRule's policy for one port and subset, merged as istiod does:
    top level, its portLevelSettings, the subset's policy, its portLevelSettings;
    each later one replaces whole fields (loadBalancer, connectionPool, ...)."""
    if dr is None:
        return {}
    out: dict = {}
    layers = [dr.spec.get("trafficPolicy") or {}]
    if subset:
        layers.append(subset.get("trafficPolicy") or {})
    for layer in layers:
        for key in ("loadBalancer", "connectionPool", "outlierDetection", "tls", "proxyProtocol"):
            if layer.get(key) is not None:
                out[key] = layer[key]
        for pls in layer.get("portLevelSettings") or []:
            if int((pls.get("port") or {}).get("number") or -1) == port:
                for key in ("loadBalancer", "connectionPool", "outlierDetection", "tls"):
                    if pls.get(key) is not None:
                        out[key] = pls[key]
    return out


def _address(host: str, port: int) -> address_pb2.Address:
    addr = address_pb2.Address()
    if host.startswith("unix://"):
        addr.pipe.path = host[len("unix://"):]
    else:
        addr.socket_address.address = host
        addr.socket_address.port_value = port
    return addr


def load_assignment(name: str, service: Service, port: ServicePort,
                    endpoints: list[Endpoint]) -> endpoint_pb2.ClusterLoadAssignment:
    cla = endpoint_pb2.ClusterLoadAssignment(cluster_name=name)
    by_locality: dict[str, endpoint_components_pb2.LocalityLbEndpoints] = {}
    for ep in endpoints:
        host = ep.address or service.host
        loc = by_locality.get(ep.locality)
        if loc is None:
            loc = by_locality[ep.locality] = cla.endpoints.add()
            region, zone, subzone = (ep.locality.split("/") + ["", "", ""])[:3]
            loc.locality.SetInParent()       # gRPC NACKs an assignment without one
            loc.locality.region, loc.locality.zone, loc.locality.sub_zone = region, zone, subzone
        lb = loc.lb_endpoints.add()
        lb.endpoint.address.CopyFrom(_address(host, ep.port_for(port)))
        if ep.weight:
            lb.load_balancing_weight.value = ep.weight
        if ep.labels.get(TLS_MODE_LABEL):      # what transport_socket_matches select on
            lb.metadata.filter_metadata[TRANSPORT_SOCKET_MATCH].update({"tlsMode": ep.labels[TLS_MODE_LABEL]})
    # As istiod: a locality weighs the sum of its endpoints' weights. Envoy uses
    # it only with locality-weighted LB; gRPC drops a locality without one.
    for loc in cla.endpoints:
        loc.load_balancing_weight.value = sum(e.load_balancing_weight.value or 1 for e in loc.lb_endpoints)
    return cla


def with_endpoint_weights(assignments: dict, weights: dict[str, dict[str, int]]) -> dict:
    """`assignments` with the decision loop's endpoint weights ({cluster: {ADDRESS:PORT: weight}},
    Overlay.endpoint_weights) laid over copies of the assignments they name; every other
    assignment is the same message object (those given are shared: never changed here), so
    only the weighted clusters' EDS versions move. A cluster or endpoint that is not (or no
    longer) in `assignments` is passed over. Locality weights follow, as load_assignment sums them."""
    if not weights:
        return assignments
    out = None
    for name, by_endpoint in weights.items():
        cla = assignments.get(name)
        if cla is None:
            continue
        copy = endpoint_pb2.ClusterLoadAssignment()
        copy.CopyFrom(cla)
        hit = False
        for loc in copy.endpoints:
            for lb in loc.lb_endpoints:
                sa = lb.endpoint.address.socket_address
                w = by_endpoint.get(endpoint_key(sa.address, sa.port_value)) if sa.address else None
                if w:
                    lb.load_balancing_weight.value, hit = w, True
            loc.load_balancing_weight.value = sum(e.load_balancing_weight.value or 1 for e in loc.lb_endpoints)
        if hit:
            out = dict(assignments) if out is None else out
            out[name] = copy
    return assignments if out is None else out


def _lb_policy(cluster: Cluster, lb: dict, opts: ClusterOptions) -> bool:
    """Sets the lb policy; True when PASSTHROUGH (original destination) was asked."""
    simple = str(lb.get("simple") or "").upper()
    hashing = lb.get("consistentHash")
    if simple == "PASSTHROUGH":
        return True
    if hashing:
        if hashing.get("maglev") is not None:
            cluster.lb_policy = Cluster.MAGLEV
        else:
            cluster.lb_policy = Cluster.RING_HASH
            ring = hashing.get("ringHash") or {}
            size = ring.get("minimumRingSize") or hashing.get("minimumRingSize")
            if size:
                cluster.ring_hash_lb_config.minimum_ring_size.value = int(size)
    else:
        cluster.lb_policy = _SIMPLE_LB.get(simple, Cluster.LEAST_REQUEST)
    if opts.grpc and cluster.lb_policy not in _GRPC_LB:
        cluster.lb_policy = Cluster.ROUND_ROBIN
    return False


def _circuit_breakers(cluster: Cluster, dr: Resource, pool: dict, path: str) -> None:
    t = cluster.circuit_breakers.thresholds.add()
    tcp, http = pool.get("tcp") or {}, pool.get("http") or {}
    # istiod's defaults: effectively unlimited, remaining capacity tracked.
    t.max_connections.value = int(tcp.get("maxConnections") or MAX_UINT32)
    t.max_pending_requests.value = int(http.get("http1MaxPendingRequests") or MAX_UINT32)
    t.max_requests.value = int(http.get("http2MaxRequests") or MAX_UINT32)
    t.max_retries.value = int(http.get("maxRetries") or MAX_UINT32)
    t.track_remaining = True
    if tcp.get("connectTimeout"):
        cluster.connect_timeout.CopyFrom(values.duration(dr, f"{path}.tcp.connectTimeout", tcp["connectTimeout"]))
    keepalive = tcp.get("tcpKeepalive")
    if keepalive is not None:
        ka = cluster.upstream_connection_options.tcp_keepalive
        if keepalive.get("probes"):
            ka.keepalive_probes.value = int(keepalive["probes"])
        if keepalive.get("time"):
            ka.keepalive_time.value = int(values.seconds(dr, f"{path}.tcp.tcpKeepalive.time", keepalive["time"]))
        if keepalive.get("interval"):
            ka.keepalive_interval.value = int(values.seconds(dr, f"{path}.tcp.tcpKeepalive.interval", keepalive["interval"]))


def _http_options(cluster: Cluster, dr: Resource | None, pool: dict, port: ServicePort, path: str) -> None:
    http = pool.get("http") or {}
    opts = http_protocol_options_pb2.HttpProtocolOptions()
    common = opts.common_http_protocol_options
    if http.get("maxRequestsPerConnection"):
        common.max_requests_per_connection.value = int(http["maxRequestsPerConnection"])
    if http.get("idleTimeout"):
        common.idle_timeout.CopyFrom(values.duration(dr, f"{path}.http.idleTimeout", http["idleTimeout"]))
    upgrade = str(http.get("h2UpgradePolicy") or "").upper() == "UPGRADE"
    if http.get("useClientProtocol") or (not port.protocol and not upgrade):
        # Unknown protocol: speak to the upstream what the client spoke to us.
        opts.use_downstream_protocol_config.http_protocol_options.SetInParent()
        opts.use_downstream_protocol_config.http2_protocol_options.SetInParent()
    elif port.protocol in H2_PROTOCOLS or upgrade:
        opts.explicit_http_config.http2_protocol_options.SetInParent()
    else:
        opts.explicit_http_config.http_protocol_options.SetInParent()
    packed = any_pb2.Any()
    packed.Pack(opts)
    cluster.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS].CopyFrom(packed)


def _outlier_detection(cluster: Cluster, dr: Resource, od: dict, path: str) -> None:
    out = cluster.outlier_detection
    out.enforcing_success_rate.value = 0          # istiod: success-rate ejection off
    for field, count, enforcing in (
            ("consecutive5xxErrors", out.consecutive_5xx, out.enforcing_consecutive_5xx),
            ("consecutiveGatewayErrors", out.consecutive_gateway_failure, out.enforcing_consecutive_gateway_failure)):
        value = od.get(field)
        if field == "consecutive5xxErrors" and value is None:
            value = od.get("consecutiveErrors")      # deprecated name
        if value is not None:
            count.value = int(value)
            enforcing.value = 100 if int(value) > 0 else 0
    if od.get("interval"):
        out.interval.CopyFrom(values.duration(dr, f"{path}.interval", od["interval"]))
    if od.get("baseEjectionTime"):
        out.base_ejection_time.CopyFrom(values.duration(dr, f"{path}.baseEjectionTime", od["baseEjectionTime"]))
    if od.get("maxEjectionPercent"):
        out.max_ejection_percent.value = int(od["maxEjectionPercent"])
    if od.get("splitExternalLocalOriginErrors"):
        out.split_external_local_origin_errors = True
        local = int(od.get("consecutiveLocalOriginFailures") or 0)
        if local:
            out.consecutive_local_origin_failure.value = local
            out.enforcing_consecutive_local_origin_failure.value = 100
        out.enforcing_local_origin_success_rate.value = 0
    # istiod sets the panic threshold from minHealthPercent (0 disables panic mode).
    cluster.common_lb_config.healthy_panic_threshold.value = float(od.get("minHealthPercent") or 0)


def _qos_bind(cluster: Cluster, qos: QosClass, opts: ClusterOptions) -> None:
    """DSCP without eBPF: bind upstream sockets and set IP_TOS/IPV6_TCLASS before connect."""
    bind = cluster.upstream_bind_config
    bind.source_address.address = opts.upstream_bind_address
    bind.source_address.port_value = 0
    v6 = ipaddress.ip_address(opts.upstream_bind_address).version == 6
    so = bind.socket_options.add()
    so.level, so.name = (IPPROTO_IPV6, IPV6_TCLASS) if v6 else (IPPROTO_IP, IP_TOS)
    so.int_value = qos.tos
    so.state = socket_option_pb2.SocketOption.STATE_PREBIND


def _upstream_tls(cluster: Cluster, tls: dict, port: ServicePort, h2: bool,
                  service: Service | None = None, subset: str = "", trust_domain: str = "cluster.local") -> None:
    """DestinationRule `tls`: SIMPLE/MUTUAL with certificate files originate TLS;
    ISTIO_MUTUAL the mesh's mTLS over SDS (transport_sockets.py: SNI
    outbound_.PORT_.SUBSET_.HOST, the server's SAN checked against the rule's
    subjectAltNames, else the service's identities: service_sans); DISABLE is plain."""
    mode = str(tls.get("mode") or "").upper()
    if mode == "ISTIO_MUTUAL" and service is not None:
        sans = [str(s) for s in tls.get("subjectAltNames") or []] or service_sans(service, trust_domain)
        ctx = transport_sockets.istio_mutual_upstream(
            str(tls.get("sni") or transport_sockets.sni(service.host, port.number, subset)), sans, h2)
        cluster.transport_socket.CopyFrom(transport_sockets.transport_socket(ctx))
        return
    if mode not in ("SIMPLE", "MUTUAL"):
        return
    ctx = tls_pb2.UpstreamTlsContext()
    if tls.get("sni"):
        ctx.sni = str(tls["sni"])
    common = ctx.common_tls_context
    if h2:
        common.alpn_protocols.append("h2")
    if tls.get("caCertificates") and not tls.get("insecureSkipVerify"):
        vc = common.validation_context
        vc.trusted_ca.filename = str(tls["caCertificates"])
        for san in tls.get("subjectAltNames") or []:
            m = vc.match_typed_subject_alt_names.add()
            m.san_type = common_pb2.SubjectAltNameMatcher.DNS
            m.matcher.exact = str(san)
    if mode == "MUTUAL" and tls.get("clientCertificate") and tls.get("privateKey"):
        cert = common.tls_certificates.add()
        cert.certificate_chain.filename = str(tls["clientCertificate"])
        cert.private_key.filename = str(tls["privateKey"])
    cluster.transport_socket.name = "envoy.transport_sockets.tls"
    cluster.transport_socket.typed_config.Pack(ctx)


def _istio_metadata(cluster: Cluster, service: Service, dr: Resource | None) -> None:
    """As istiod: filter_metadata `istio` names the service and the
    DestinationRule a cluster was built from (what `proxy-config cluster`'s
    DESTINATION RULE column and other istioctl-era tools read)."""
    md = {"services": [{"host": service.host, "name": service.host.split(".")[0], "namespace": service.namespace}]}
    if dr is not None:
        md["config"] = f"/apis/networking.istio.io/v1/namespaces/{dr.namespace}/destination-rule/{dr.name}"
    cluster.metadata.filter_metadata["istio"].update(md)


def build_cluster(idx: MeshIndex, service: Service, port: ServicePort, subset: dict | None,
                  opts: ClusterOptions) -> tuple[Cluster, endpoint_pb2.ClusterLoadAssignment | None]:
    subset_name = str(subset.get("name")) if subset else ""
    name = cluster_name(service.host, port.number, subset_name)
    dr = idx.destination_rule(service.host)
    policy = traffic_policy(dr, subset, port.number)
    endpoints = service.endpoints
    if subset:
        selector = subset.get("labels") or {}
        endpoints = [e for e in endpoints if labels_match(selector, e.labels)]
    cluster = Cluster(name=name)
    _istio_metadata(cluster, service, dr)
    cluster.connect_timeout.FromSeconds(int(DEFAULT_CONNECT_TIMEOUT))
    passthrough = _lb_policy(cluster, policy.get("loadBalancer") or {}, opts)
    pool = policy.get("connectionPool") or {}
    base = "spec.trafficPolicy"
    _circuit_breakers(cluster, dr, pool, f"{base}.connectionPool")
    if policy.get("outlierDetection") is not None:
        _outlier_detection(cluster, dr, policy["outlierDetection"], f"{base}.outlierDetection")
    cla = None
    resolution = service.resolution
    if opts.grpc:
        # Proxyless clients take EDS and LOGICAL_DNS only (gRFC A27, A37).
        resolution = "DNS_ROUND_ROBIN" if resolution in ("DNS", "DNS_ROUND_ROBIN") else "STATIC"
    elif passthrough or (resolution == "NONE" and not endpoints):
        resolution = "NONE"
    if resolution in ("DNS", "DNS_ROUND_ROBIN"):
        cluster.type = Cluster.STRICT_DNS if resolution == "DNS" else Cluster.LOGICAL_DNS
        cluster.dns_lookup_family = Cluster.V4_ONLY
        dns_endpoints = endpoints or ([] if subset else [Endpoint(service.host, {}, {})])
        if resolution == "DNS_ROUND_ROBIN":
            dns_endpoints = dns_endpoints[:1]      # LOGICAL_DNS takes exactly one host
        cluster.load_assignment.CopyFrom(load_assignment(name, service, port, dns_endpoints))
    elif resolution == "NONE":
        cluster.type = Cluster.ORIGINAL_DST
        cluster.lb_policy = Cluster.CLUSTER_PROVIDED
    else:
        cluster.type = Cluster.EDS
        cluster.eds_cluster_config.service_name = name
        cluster.eds_cluster_config.eds_config.CopyFrom(ads_config_source())
        cla = load_assignment(name, service, port, endpoints)
    if not opts.grpc:
        if port.protocol not in TCP_PROTOCOLS:
            _http_options(cluster, dr, pool, port, f"{base}.connectionPool")
        upgrade = str((pool.get("http") or {}).get("h2UpgradePolicy") or "").upper() == "UPGRADE"
        h2 = port.protocol in H2_PROTOCOLS or upgrade
        if policy.get("tls"):
            _upstream_tls(cluster, policy["tls"], port, h2, service, subset_name, opts.trust_domain)
        else:
            _auto_mtls(cluster, idx, service, port, endpoints, h2, subset_name, opts)
        qos = None
        if dr is not None:
            try:
                qos = qos_class_for(dr.annotations, subset_name)
            except ValueError as e:
                raise values.fail(dr, "metadata.annotations", str(e)) from None
        if qos is not None:
            _qos_bind(cluster, qos, opts)
    return cluster, cla


def _subsets(idx: MeshIndex, service: Service) -> list[dict]:
    dr = idx.destination_rule(service.host)
    return [s for s in (dr.spec.get("subsets") or []) if isinstance(s, dict) and s.get("name")] if dr else []


def build_clusters(idx: MeshIndex, opts: ClusterOptions) -> tuple[dict, dict]:
    """Every cluster (and EDS assignment) of the mesh: {name: Cluster}, {name: CLA}."""
    clusters, assignments = {}, {}
    for service in idx.services.values():
        subsets = _subsets(idx, service)
        for port in service.ports:
            for subset in [None, *subsets]:
                cluster, cla = build_cluster(idx, service, port, subset, opts)
                clusters[cluster.name] = cluster
                if cla is not None:
                    assignments[cluster.name] = cla
    return clusters, assignments


def _identities(service: Service) -> tuple:
    """What of a service's endpoints its clusters are built from: service accounts, tlsMode labels."""
    return (tuple(sorted({(e.namespace, e.service_account) for e in service.endpoints})),
            tuple(sorted({e.labels.get(TLS_MODE_LABEL, "") for e in service.endpoints})))


def reassign(old: MeshIndex, new: MeshIndex, assignments: dict) -> dict | None:
    """EDS after an endpoint-only change: `assignments` (built from `old`) with
    the ClusterLoadAssignments of every service whose endpoints differ in
    `new` rebuilt, every other one the same message object. None when the
    change is not EDS-only: a host added or gone, or changed endpoints on a
    service that is not STATIC (DNS endpoints sit inside the Cluster; NONE
    turns ORIGINAL_DST or EDS by whether it has endpoints).

    The caller guarantees that everything else the clusters are built from
    (ports, resolution, DestinationRules and their subsets' labels) is
    unchanged, so the set of EDS clusters, which subsets exist and whether a
    cluster is EDS at all are those of `old`; as build_cluster does, a
    subset's assignment holds the endpoints its labels select."""
    if old.services.keys() != new.services.keys():
        return None
    out = None
    for host, svc in new.services.items():
        before = old.services[host]
        if before.endpoints == svc.endpoints:
            continue
        if svc.resolution != "STATIC" or before.resolution != "STATIC":
            return None
        if _identities(before) != _identities(svc):
            return None     # the clusters' SAN checks and auto mTLS follow the endpoints' identities
        if out is None:
            out = dict(assignments)
        subsets = _subsets(new, svc)
        for port in svc.ports:
            for subset in [None, *subsets]:
                name = cluster_name(svc.host, port.number, str(subset.get("name")) if subset else "")
                if name not in assignments:          # not EDS (PASSTHROUGH): no assignment
                    continue
                endpoints, had = svc.endpoints, before.endpoints
                if subset:
                    selector = subset.get("labels") or {}
                    endpoints = [e for e in endpoints if labels_match(selector, e.labels)]
                    had = [e for e in had if labels_match(selector, e.labels)]
                if endpoints != had:                 # a subset the change missed keeps its message
                    out[name] = load_assignment(name, svc, port, endpoints)
    return assignments if out is None else out
