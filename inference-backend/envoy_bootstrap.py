"""Envoy in front of the replicas: a static bootstrap for the pool (demo, tests).

In the mesh, the xDS server builds the same from the ServiceEntry and
WorkloadEntries of istio-manifests/examples/inference-pool.yaml; this is the
hand-written equivalent for running the pool without a control plane. Both
clusters balance with client-side weighted round robin, whose weights come
from the ORCA `endpoint-load-metrics` each replica returns
(application_utilization: the compute thread's busy fraction).
"""
from __future__ import annotations

from mcp26.mesh import headers as H
from mcp26.inference.priority_worker import SERVE_CLASS

GRPC_PREFIX = "/inference.GRPCInferenceService/"

CSWRR = {"policies": [{"typed_extension_config": {
    "name": "envoy.load_balancing_policies.client_side_weighted_round_robin",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies."
                 "client_side_weighted_round_robin.v3.ClientSideWeightedRoundRobin",
        "blackout_period": "0.5s", "weight_update_period": "0.5s", "weight_expiration_period": "60s"}}}]}


def replica_ports(http_port: int, grpc_port: int, replicas: int, admin_port: int | None = None,
                  priority_http_port: int | None = None, priority_grpc_port: int | None = None) -> list[dict]:
    """Ports of each replica of `mcpctl serve --replicas N`: replica i on every base
    port + i * stride, stride = the span of the base ports + 1 (8080/8081 -> 8082/8083;
    with priority workers on 8082/8083: 8084-8087)."""
    base = {"http": http_port, "grpc": grpc_port}
    for name, port in (("admin", admin_port), ("priority_http", priority_http_port),
                       ("priority_grpc", priority_grpc_port)):
        if port:
            base[name] = port
    stride = max(base.values()) - min(base.values()) + 1
    return [{k: v + i * stride for k, v in base.items()} for i in range(replicas)]


def cluster(name: str, ports: list[int], http2: bool, host: str = "127.0.0.1") -> dict:
    c = {"name": name, "type": "STATIC", "connect_timeout": "2s", "load_balancing_policy": CSWRR,
         "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
             {"endpoint": {"address": {"socket_address": {"address": host, "port_value": p}}}} for p in ports]}]}}
    if http2:
        c["typed_extension_protocol_options"] = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}}
    return c


def envoy_bootstrap(listen_port: int, http_ports: list[int], grpc_ports: list[int],
                    admin_port: int | None = None, host: str = "127.0.0.1",
                    priority_http_ports: list[int] | None = None, priority_grpc_ports: list[int] | None = None) -> dict:
    """One listener (HTTP/1.1 and HTTP/2): gRPC to the replicas' gRPC ports, /v2/ to their REST ports;
    with priority workers, x-mcp-qos-class: latency-critical to theirs first."""
    top = [{"name": H.QOS_CLASS, "string_match": {"exact": SERVE_CLASS.header_value}}]
    routes, clusters = [], []
    for prefix, kind, ports, http2 in ((GRPC_PREFIX, "grpc", priority_grpc_ports, True),
                                       ("/v2/", "http", priority_http_ports, False)):
        if ports:
            routes.append({"match": {"prefix": prefix, "headers": top},
                           "route": {"cluster": f"inference-pool-priority-{kind}", "timeout": "30s"}})
            clusters.append(cluster(f"inference-pool-priority-{kind}", ports, http2, host))
    hcm = {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
           "stat_prefix": "inference_pool", "codec_type": "AUTO",
           "route_config": {"virtual_hosts": [{"name": "inference-pool", "domains": ["*"], "routes": [
               *routes,
               {"match": {"prefix": GRPC_PREFIX}, "route": {"cluster": "inference-pool-grpc", "timeout": "30s"}},
               {"match": {"prefix": "/v2/"}, "route": {"cluster": "inference-pool-http", "timeout": "30s"}}]}]},
           "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
               "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}
    out = {"static_resources": {
        "listeners": [{"name": "inference-pool", "address": {"socket_address": {"address": host, "port_value": listen_port}},
                       "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                       "typed_config": hcm}]}]}],
        "clusters": [cluster("inference-pool-http", http_ports, False, host),
                     cluster("inference-pool-grpc", grpc_ports, True, host), *clusters]}}
    if admin_port:
        out["admin"] = {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}}
    return out
