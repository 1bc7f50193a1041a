"""Filter module: envoy.filters.http.ext_proc pointed at an InferencePool's
Endpoint Picker (EPP), as istiod wires the Gateway API Inference Extension.

On a gateway whose routes send to an InferencePool (inference_pool.py: the
pool's shadow cluster), every HTTP connection manager gets one ext_proc
filter, **disabled by default**; each route to a pool enables it with its
own settings (`typed_per_filter_config` `envoy.filters.http.ext_proc`: a
`FilterConfig` wrapping an `ExtProcPerRoute` override):

- `grpc_service`: the pool's `endpointPickerRef`, a Service NAME/PORT in the
  pool's namespace -> cluster `outbound|PORT||NAME.NS.svc.cluster.local`
  (the Service, or ServiceEntry, the user declares; its port must speak
  HTTP/2: `appProtocol: http2` or a `grpc-` port name; mesh.analyze warns);
- `failure_mode_allow`: `failureMode` FailOpen (the picker unreachable, the
  request goes on without a pick and the cluster's fallback, round robin,
  chooses) or FailClose (the default: the request fails, 500).

A route with weighted backends gets the override on each pool's
`ClusterWeight` instead, so the picker runs exactly when a pool is the
backend chosen, and two pools of one rule each ask their own picker (istiod
keys one config per route rule, the last pool's). Routes to anything else
never open an ext_proc stream.

What the filter sends (the Endpoint Picker Protocol, mesh/endpoint_picker.py
LEAN_MODE): request headers, then the whole body (`BUFFERED`: the picker reads
the OpenAI `model` and prompt) -- unless the picker picks a live session's
request on its headers and switches it to SESSION_MODE (no body: one
message); nothing of the response (Envoy keeps the stream of a request with a
body open until the request ends, which ends the picker's in-flight count; the
response headers would cost a third message, scheduler/README.md measures
it); no trailers. `allow_mode_override` for
exactly STREAMED_RESPONSE_MODE, what the picker switches a `"stream": true`
answer to where the response headers are sent, and SESSION_MODE: a pool annotated
`mcp-mesh.io/endpoint-picker-mode: answer` gets ANSWER_MODE on its routes, with
gRPC initial metadata `x-mcp-endpoint-picker-mode: answer` telling the picker so.
It keeps the picker's dynamic metadata in `envoy.lb` (the pick the cluster's
override_host policy reads) and forwards `envoy.lb` and
`envoy.lb.subset_hint` to the picker (the subset hint a filter before it may
set; in ANSWER_MODE, on the response, `x-gateway-destination-endpoint-served`,
where the request ran after retries). `message_timeout` 5 s per message (the picker
answers in microseconds; a picker that does not is handled by its failure
mode). `route_cache_action: RETAIN`: the picker's header mutations
(`x-gateway-destination-endpoint`, `x-gateway-model-name`) do not re-route
the request, so the pick stays with the pool that was picked for. A body
larger than the listener's buffer limit (1 MiB) is answered 413, as Envoy
does for BUFFERED bodies.

Place in the chain: the last phase entry (after the Wasm plugins of every
phase, RBAC and jwt_authn), as istiod appends it after its STATS and
UNSPECIFIED extensions: the picker sees the request as routed -- the
header contract has set the signed `x-mcp-qos-class` (the class the picker
sheds by), `x-gateway-inference-objective` and the session header are the
client's -- and nothing that may still deny the request runs after a pick
(fault excepted). Route-level header modifiers are applied by the router,
after the pick: an objective named by an HTTPRoute RequestHeaderModifier does
not reach the picker (the client's header or the body's `model` do).
"""
from __future__ import annotations

from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2, processing_mode_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from google.protobuf import any_pb2, json_format

from mcp26.mesh import endpoint_picker as epp
from mcp26.mesh import gateway_api, hosts
from mcp26.mesh.resources import MeshConfig
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.model.type_urls import Snapshot
from mcp26.xds.translate import inference_pool
from mcp26.xds.translate.index import MeshIndex
from mcp26.xds.translate.overlay import Overlay
from mcp26.xds.translate.phases import Phase

EXT_PROC = "envoy.filters.http.ext_proc"
MESSAGE_TIMEOUT_S = 5
# The filter's own grpc_service: never used (the filter is disabled unless a
# route names its picker), but a cluster name is required.
UNUSED_CLUSTER = "inference-endpoint-picker-unset"
_Mode = processing_mode_pb2.ProcessingMode


def _pack(msg) -> any_pb2.Any:
    out = any_pb2.Any()
    out.Pack(msg)
    return out


def processing_mode(mode: dict) -> processing_mode_pb2.ProcessingMode:
    """One of mesh.endpoint_picker's modes as the proto."""
    return json_format.ParseDict(mode, _Mode())


def external_processor() -> ext_proc_pb2.ExternalProcessor:
    """The filter-level configuration every pool route starts from."""
    cfg = ext_proc_pb2.ExternalProcessor()
    cfg.grpc_service.envoy_grpc.cluster_name = UNUSED_CLUSTER
    cfg.failure_mode_allow = False
    cfg.processing_mode.CopyFrom(processing_mode(epp.LEAN_MODE))
    # Exactly two overrides: a pool route in ANSWER_MODE lets the picker stream SSE answers through
    # it; a LEAN request of a live session is picked on its headers and its body skipped.
    cfg.allow_mode_override = True
    cfg.allowed_override_modes.append(processing_mode(epp.STREAMED_RESPONSE_MODE))
    cfg.allowed_override_modes.append(processing_mode(epp.SESSION_MODE))
    cfg.message_timeout.FromSeconds(MESSAGE_TIMEOUT_S)
    cfg.metadata_options.receiving_namespaces.untyped.append(epp.DESTINATION_NAMESPACE)
    cfg.metadata_options.forwarding_namespaces.untyped.extend([epp.DESTINATION_NAMESPACE, epp.SUBSET_NAMESPACE])
    cfg.route_cache_action = ext_proc_pb2.ExternalProcessor.RETAIN
    cfg.request_attributes.append("source.address")     # the downstream peer: the decision loop's flow marks
    return cfg


_FILTER = hcm_pb2.HttpFilter(name=EXT_PROC, typed_config=_pack(external_processor()), disabled=True)


def per_route(pool: inference_pool.Pool) -> any_pb2.Any:
    """The route's (or ClusterWeight's) typed_per_filter_config for ext_proc:
    enabled, with the pool's picker, failure mode and, for a pool annotated
    `mcp-mesh.io/endpoint-picker-mode: answer`, ANSWER_MODE."""
    override = ext_proc_pb2.ExtProcPerRoute()
    override.overrides.grpc_service.envoy_grpc.cluster_name = pool.picker_cluster or UNUSED_CLUSTER
    override.overrides.failure_mode_allow.value = pool.fail_open
    if pool.picker_mode != "lean" and pool.picker_mode in epp.POOL_MODES:
        override.overrides.processing_mode.CopyFrom(processing_mode(epp.POOL_MODES[pool.picker_mode]))
        # and tells the picker so: it then never picks on the headers alone (that would skip the response)
        override.overrides.grpc_initial_metadata.add(key=epp.PICKER_MODE_METADATA, value=pool.picker_mode)
    return _pack(route_components_pb2.FilterConfig(config=_pack(override), disabled=False))


# -- which gateways need the filter ----------------------------------------------

def _pool_hosts(config: MeshConfig) -> set[str]:
    return {str(h) for se in config.of_kind("ServiceEntry")
            if se.labels.get(gateway_api.SERVICE_SEMANTICS_LABEL) == gateway_api.INFERENCE_POOL_SEMANTICS
            for h in se.spec.get("hosts") or []}


def routes_to_pool(config: MeshConfig, node: ProxyNode) -> bool:
    """Whether a VirtualService bound to a Gateway this node runs sends to an InferencePool."""
    if node.kind != "router":
        return False
    pool_hosts = _pool_hosts(config)
    if not pool_hosts:
        return False
    mine = {f"{g.namespace}/{g.name}" for g in config.of_kind("Gateway") if g.group == "networking.istio.io"
            and all(node.labels.get(k) == str(v) for k, v in (g.spec.get("selector") or {}).items())}
    for vs in config.of_kind("VirtualService"):
        if not mine & {hosts.gateway_ref(str(g), vs.namespace) for g in vs.spec.get("gateways") or []}:
            continue
        for http in vs.spec.get("http") or []:
            for rd in http.get("route") or []:
                host = str((rd.get("destination") or {}).get("host") or "")
                if hosts.resolve_short_name(host, vs.namespace) in pool_hosts:
                    return True
    return False


def http_filters(config: MeshConfig, node: ProxyNode, port: int, phase: Phase) -> list:
    if phase is not Phase.UNSPECIFIED or not routes_to_pool(config, node):
        return []
    return [_FILTER]


def resources(config: MeshConfig, node: ProxyNode, overlay: Overlay) -> Snapshot:
    return {}


# -- the routes: the Translator's hook after route planning -------------------------

def _pool_clusters(route: route_components_pb2.Route) -> list[str]:
    if not route.HasField("route"):
        return []
    return [route.route.cluster] if route.route.cluster else [c.name for c in route.route.weighted_clusters.clusters]


def with_picker(idx: MeshIndex, node: ProxyNode, routes: dict) -> dict:
    """{name: RouteConfiguration} with ext_proc enabled on every route (or
    weighted cluster) that sends to a pool: a copy of each route configuration
    that has one (those given may be shared with other configs' translations),
    the others as given. Only gateways get the filter (http_filters)."""
    pools = inference_pool.pools(idx) if node.kind == "router" else {}
    if not pools:
        return routes
    out = None
    for name, rc in routes.items():
        if not any(c in pools for vh in rc.virtual_hosts for r in vh.routes for c in _pool_clusters(r)):
            continue
        copy = route_pb2.RouteConfiguration()
        copy.CopyFrom(rc)
        for vh in copy.virtual_hosts:
            for r in vh.routes:
                if not r.HasField("route"):
                    continue
                if r.route.cluster in pools:
                    r.typed_per_filter_config[EXT_PROC].CopyFrom(per_route(pools[r.route.cluster]))
                for cw in r.route.weighted_clusters.clusters:
                    if cw.name in pools:
                        cw.typed_per_filter_config[EXT_PROC].CopyFrom(per_route(pools[cw.name]))
        out = dict(routes) if out is None else out
        out[name] = copy
    return routes if out is None else out
