"""A static Envoy gateway in front of an InferencePool, wired as the Gateway
API Inference Extension wires one: the ext_proc filter asks the Endpoint
Picker (request headers, then the buffered body; other modes as named in
mesh/endpoint_picker.py), and the pool's cluster
balances with Envoy's override_host policy, which takes the picked endpoint
(and its fallbacks, in order) from the `envoy.lb` metadata the picker set,
and falls back to round robin when there is none (FailOpen with the picker
down). For tests and benchmarks of the picker.

`balanced_gateway_bootstrap` is the same gateway without the picker: the same
listener and pool cluster, balanced by Envoy alone (LEAST_REQUEST, or
client-side weighted round robin on the replicas' ORCA reports) -- what the
picker is compared with."""
from __future__ import annotations

from mcp26.mesh import endpoint_picker as epp

ROUTER = {"name": "envoy.filters.http.router", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}


def _address(host: str, port: int) -> dict:
    return {"socket_address": {"address": host, "port_value": port}}


def ext_proc_filter(fail_open: bool, timeout_s: float = 1.0, mode: dict | None = None) -> dict:
    """`mode`: the processing mode (mesh.endpoint_picker: LEAN_MODE, the gateway's and the default,
    ANSWER_MODE, DUPLEX_MODE)."""
    return {"name": "envoy.filters.http.ext_proc", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": "endpoint-picker"}, "timeout": f"{timeout_s}s",
                         # as the control plane tells the picker of a route in ANSWER_MODE
                         "initial_metadata": [{"key": epp.PICKER_MODE_METADATA, "value": "answer"}]
                         if mode == epp.ANSWER_MODE else []},
        "failure_mode_allow": fail_open,
        "message_timeout": f"{timeout_s}s",
        "processing_mode": dict(mode or epp.LEAN_MODE),
        # ANSWER_MODE: the picker switches the answer of a `"stream": true` request to pass through it
        "allow_mode_override": True,
        "allowed_override_modes": [epp.STREAMED_RESPONSE_MODE, epp.SESSION_MODE],
        # Envoy keeps dynamic metadata from the processor only in namespaces listed here.
        "metadata_options": {"receiving_namespaces": {"untyped": [epp.DESTINATION_NAMESPACE]}},
        # the downstream address: the picker upgrades flows the decision loop marked (scheduler/loop/marks.py)
        "request_attributes": ["source.address"],
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


def _listener(port: int, http_filters: list[dict], route_timeout_s: float) -> dict:
    hcm = {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
                    "HttpConnectionManager",
           "stat_prefix": f"gw{port}",
           "route_config": {"virtual_hosts": [{"name": "pool", "domains": ["*"], "routes": [
               {"match": {"prefix": "/"}, "route": {"cluster": "inference-pool",
                                                   "timeout": f"{route_timeout_s}s"}}]}]},
           "http_filters": [*http_filters, ROUTER]}
    return {"name": f"gateway-{port}", "address": _address("127.0.0.1", port),
            "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                            "typed_config": hcm}]}]}


def gateway_bootstrap(listeners: dict[int, bool], pool: list[tuple[str, int]], picker_port: int,
                      route_timeout_s: float = 10.0, mode: dict | None = None) -> dict:
    """{gateway port: fail_open} -> an Envoy bootstrap with one listener per entry."""
    out = [_listener(port, [ext_proc_filter(fail_open, mode=mode)], route_timeout_s)
           for port, fail_open in listeners.items()]
    picker = {"name": "endpoint-picker", "type": "STATIC", "connect_timeout": "1s",
              "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                  "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                  "explicit_http_config": {"http2_protocol_options": {}}}},
              "load_assignment": {"cluster_name": "endpoint-picker", "endpoints": [{"lb_endpoints": [
                  {"endpoint": {"address": _address("127.0.0.1", picker_port)}}]}]}}
    return {"static_resources": {"listeners": out, "clusters": [pool_cluster(pool), picker]}}


# Envoy's own balancers for the same pool. LEAST_REQUEST as Istio configures it (power of
# two choices over active requests); client-side WRR weighs each endpoint by qps / utilisation
# from the `endpoint-load-metrics` ORCA header of its answers (application_utilization here:
# the compute thread's busy share), with short periods so a benchmark phase sees the weights.
BALANCERS = {
    "least_request": {
        "name": "envoy.load_balancing_policies.least_request",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies."
                                  "least_request.v3.LeastRequest"}},
    "orca_wrr": {
        "name": "envoy.load_balancing_policies.client_side_weighted_round_robin",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies."
                                  "client_side_weighted_round_robin.v3.ClientSideWeightedRoundRobin",
                         "blackout_period": "0.5s", "weight_update_period": "0.5s",
                         "weight_expiration_period": "60s"}},
    "round_robin": {
        "name": "envoy.load_balancing_policies.round_robin",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies."
                                  "round_robin.v3.RoundRobin"}},
}


def balanced_cluster(endpoints: list[tuple[str, int]], balancer: str, name: str = "inference-pool") -> dict:
    return {"name": name, "type": "STATIC", "connect_timeout": "1s",
            "load_balancing_policy": {"policies": [{"typed_extension_config": BALANCERS[balancer]}]},
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": _address(h, p)}} for h, p in endpoints]}]}}


def balanced_gateway_bootstrap(port: int, pool: list[tuple[str, int]], balancer: str = "least_request",
                               route_timeout_s: float = 10.0) -> dict:
    """The gateway without the picker: one listener (no ext_proc) -> the pool balanced by
    `balancer` (a key of BALANCERS)."""
    return {"static_resources": {"listeners": [_listener(port, [], route_timeout_s)],
                                 "clusters": [balanced_cluster(pool, balancer)]}}
