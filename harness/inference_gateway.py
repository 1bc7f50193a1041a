"""A static Envoy gateway in front of an InferencePool, wired as the Gateway
API Inference Extension wires one: the ext_proc filter asks the Endpoint
Picker (request headers, then the buffered body), and the pool's cluster
balances with Envoy's override_host policy, which takes the picked endpoint
(and its fallbacks, in order) from the `envoy.lb` metadata the picker set,
and falls back to round robin when there is none (FailOpen with the picker
down). For tests and benchmarks of the picker."""
from __future__ import annotations

from mesh import endpoint_picker as epp

ROUTER = {"name": "envoy.filters.http.router", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}


def _address(host: str, port: int) -> dict:
    return {"socket_address": {"address": host, "port_value": port}}


def ext_proc_filter(fail_open: bool, timeout_s: float = 1.0) -> dict:
    return {"name": "envoy.filters.http.ext_proc", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": "endpoint-picker"}, "timeout": f"{timeout_s}s"},
        "failure_mode_allow": fail_open,
        "message_timeout": f"{timeout_s}s",
        "processing_mode": {"request_header_mode": "SEND", "request_body_mode": "BUFFERED",
                            "response_header_mode": "SEND", "response_body_mode": "NONE",
                            "request_trailer_mode": "SKIP", "response_trailer_mode": "SKIP"},
        # Envoy keeps dynamic metadata from the processor only in namespaces listed here.
        "metadata_options": {"receiving_namespaces": {"untyped": [epp.DESTINATION_NAMESPACE]}},
    }}


def pool_cluster(endpoints: list[tuple[str, int]], name: str = "inference-pool") -> dict:
    round_robin = {"policies": [{"typed_extension_config": {
        "name": "envoy.load_balancing_policies.round_robin",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies."
                                  "round_robin.v3.RoundRobin"}}}]}
    override = {"policies": [{"typed_extension_config": {
        "name": "envoy.load_balancing_policies.override_host",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
            "override_host_sources": [{"metadata": {"key": epp.DESTINATION_NAMESPACE,
                                                    "path": [{"key": epp.DESTINATION_ENDPOINT}]}}],
            "fallback_policy": round_robin}}}]}
    return {"name": name, "type": "STATIC", "connect_timeout": "1s",
            "load_balancing_policy": override,
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": _address(h, p)}} for h, p in endpoints]}]}}


def gateway_bootstrap(listeners: dict[int, bool], pool: list[tuple[str, int]], picker_port: int,
                      route_timeout_s: float = 10.0) -> dict:
    """{gateway port: fail_open} -> an Envoy bootstrap with one listener per entry."""
    out = []
    for port, fail_open in listeners.items():
        hcm = {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
                        "HttpConnectionManager",
               "stat_prefix": f"gw{port}",
               "route_config": {"virtual_hosts": [{"name": "pool", "domains": ["*"], "routes": [
                   {"match": {"prefix": "/"}, "route": {"cluster": "inference-pool",
                                                       "timeout": f"{route_timeout_s}s"}}]}]},
               "http_filters": [ext_proc_filter(fail_open), ROUTER]}
        out.append({"name": f"gateway-{port}", "address": _address("127.0.0.1", port),
                    "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                    "typed_config": hcm}]}]})
    picker = {"name": "endpoint-picker", "type": "STATIC", "connect_timeout": "1s",
              "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                  "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                  "explicit_http_config": {"http2_protocol_options": {}}}},
              "load_assignment": {"cluster_name": "endpoint-picker", "endpoints": [{"lb_endpoints": [
                  {"endpoint": {"address": _address("127.0.0.1", picker_port)}}]}]}}
    return {"static_resources": {"listeners": out, "clusters": [pool_cluster(pool), picker]}}
