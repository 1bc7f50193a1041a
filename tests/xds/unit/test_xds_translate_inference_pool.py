"""InferencePool as istiod translates it: an HTTPRoute backendRef to a pool -> the pool's
shadow service and its cluster (override_host from `envoy.lb`, round robin fallback), the
ext_proc filter disabled on the gateway's listeners and enabled, with the pool's picker and
failure mode, on the routes to a pool only; the analyzers for pools and the routes to them."""
from __future__ import annotations

from envoy.config.route.v3 import route_components_pb2
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2, processing_mode_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.load_balancing_policies.override_host.v3 import override_host_pb2
from envoy.type.metadata.v3 import metadata_pb2

from mcp26.mesh import endpoint_picker as epp
from mcp26.mesh import gateway_api
from mcp26.mesh.change_set import load_texts
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.translate import Translator, translate
from mcp26.xds.model.type_urls import CLUSTER, ENDPOINT, LISTENER, ROUTE

NS = "inference"
GATEWAY = ProxyNode("router~127.0.0.1~gw.inference~inference.svc.cluster.local", namespace=NS,
                    labels={"gateway.networking.k8s.io/gateway-name": "inference-gateway"})
OTHER_GATEWAY = ProxyNode("router~127.0.0.1~other.inference~inference.svc.cluster.local", namespace=NS,
                          labels={"gateway.networking.k8s.io/gateway-name": "other-gateway"})
SIDECAR = ProxyNode("sidecar~127.0.0.9~app.inference~inference.svc.cluster.local", namespace=NS, kind="sidecar")
PROXYLESS = ProxyNode("grpc-client", namespace=NS, kind="grpc")
POOL_HOST = "decoders-ip-795b822f.inference.svc.cluster.local"
POOL_CLUSTER = f"outbound|54321||{POOL_HOST}"
PICKER_CLUSTER = "outbound|9002||epp.inference.svc.cluster.local"
EXT_PROC = "envoy.filters.http.ext_proc"


def gateway(name="inference-gateway", port=8080):
    return f"""apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: {name}, namespace: {NS}}}
spec:
  gatewayClassName: istio
  listeners: [{{name: http, port: {port}, protocol: HTTP}}]
"""


def route(rules: str, name="llm", parent="inference-gateway", namespace=NS):
    return f"""apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  parentRefs: [{{name: {parent}, namespace: {NS}}}]
  rules:
{rules}"""


POOL_RULE = """  - matches: [{path: {type: PathPrefix, value: /v1}}]
    backendRefs: [{group: inference.networking.k8s.io, kind: InferencePool, name: decoders}]
"""
PLAIN_RULE = """  - matches: [{path: {type: PathPrefix, value: /plain}}]
    backendRefs: [{name: plain, port: 80}]
"""
MIXED_RULE = """  - matches: [{path: {type: PathPrefix, value: /mixed}}]
    backendRefs:
    - {group: inference.networking.k8s.io, kind: InferencePool, name: decoders, weight: 3}
    - {name: plain, port: 80, weight: 1}
"""


def pool(name="decoders", mode="FailClose", picker="epp", labels="{app: decoder}", ports="[{number: 8000}, {number: 8001}]"):
    return f"""apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {{name: {name}, namespace: {NS}}}
spec:
  selector: {{matchLabels: {labels}}}
  targetPorts: {ports}
  endpointPickerRef: {{name: {picker}, port: {{number: 9002}}, failureMode: {mode}}}
"""


def service(name, port, port_name, app_protocol=""):
    extra = f", appProtocol: {app_protocol}" if app_protocol else ""
    return f"""apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {NS}}}
spec:
  selector: {{app: {name}}}
  ports: [{{name: {port_name}, port: {port}{extra}}}]
"""


DEPLOYMENT = f"""apiVersion: apps/v1
kind: Deployment
metadata: {{name: decoder, namespace: {NS}}}
spec:
  selector: {{matchLabels: {{app: decoder}}}}
  template:
    metadata:
      labels: {{app: decoder, tier: gpu}}
      annotations: {{mcp-mesh.io/addresses: "127.0.0.2,127.0.0.3"}}
    spec:
      containers: [{{name: server, image: mcp-mesh}}]
"""
WORKLOAD_ENTRY = f"""apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: decoder-4, namespace: {NS}, labels: {{app: decoder}}}}
spec: {{address: 127.0.0.4}}
"""


def config(*docs, rules=POOL_RULE + PLAIN_RULE):
    base = [gateway(), route(rules), pool(), service("epp", 9002, "grpc-ext-proc", "http2"),
            service("plain", 80, "http"), DEPLOYMENT, WORKLOAD_ENTRY]
    return load_texts({"inference.yaml": "---\n".join(base + list(docs))})


def _hcm(listener) -> hcm_pb2.HttpConnectionManager:
    hcm = hcm_pb2.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(hcm)
    return hcm


def _routes(snap) -> dict:
    return {r.match.prefix or r.match.path: r for vh in snap[ROUTE]["http.8080"].virtual_hosts for r in vh.routes}


def _per_route(typed_per_filter_config) -> tuple[route_components_pb2.FilterConfig, ext_proc_pb2.ExtProcPerRoute]:
    wrapper = route_components_pb2.FilterConfig()
    assert typed_per_filter_config[EXT_PROC].Unpack(wrapper)
    override = ext_proc_pb2.ExtProcPerRoute()
    assert wrapper.config.Unpack(override)
    return wrapper, override


# -- the Gateway API conversion -----------------------------------------------------

def test_the_shadow_service_is_named_as_istiod_names_it():
    # pilot/pkg/config/kube/gateway/testdata/http.yaml.golden: infpool-gen -> infpool-gen-ip-6580eb2c
    assert gateway_api.pool_service_name("infpool-gen") == "infpool-gen-ip-6580eb2c"
    long = gateway_api.pool_service_name("p" * 80)
    assert len(long) == 63 and long.startswith("p" * 51 + "-ip-")


def test_a_pool_backend_routes_to_its_shadow_service_holding_every_target_port_of_the_pool():
    cfg = config()
    vs = next(r for r in cfg.of_kind("VirtualService") if r.name == "llm-httproute")
    dest = next(h for h in vs.spec["http"] if h["match"][0]["uri"].get("prefix") == "/v1/")["route"][0]["destination"]
    assert dest == {"host": POOL_HOST, "port": {"number": 54321}}
    (se,) = [r for r in cfg.of_kind("ServiceEntry") if r.name == "decoders-ip-795b822f"]
    assert se.spec["ports"] == [{"number": 54321, "name": "http-0", "protocol": "HTTP"}]
    # The Deployment's two replicas and the WorkloadEntry (metadata labels count), each target port.
    assert sorted((e["address"], e["ports"]["http-0"]) for e in se.spec["endpoints"]) == [
        (a, p) for a in ("127.0.0.2", "127.0.0.3", "127.0.0.4") for p in (8000, 8001)]
    assert se.labels == {gateway_api.POOL_NAME_LABEL: "decoders", gateway_api.PICKER_SERVICE_LABEL: "epp",
                         gateway_api.PICKER_PORT_LABEL: "9002", gateway_api.PICKER_FAILURE_MODE_LABEL: "FailClose",
                         gateway_api.SERVICE_SEMANTICS_LABEL: "inferencepool"}
    assert se.file == "inference.yaml"              # a finding about it names the pool's file


def test_a_pool_no_route_sends_to_has_no_shadow_service():
    cfg = config(rules=PLAIN_RULE)
    assert not [r for r in cfg.of_kind("ServiceEntry") if r.labels.get(gateway_api.POOL_NAME_LABEL)]


def test_a_pool_in_another_namespace_needs_a_reference_grant():
    other = route(POOL_RULE.replace("name: decoders}", f"name: decoders, namespace: {NS}}}"),
                  name="cross", namespace="apps")
    grant = f"""apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {{name: apps-to-pool, namespace: {NS}}}
spec:
  from: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: apps}}]
  to: [{{group: inference.networking.k8s.io, kind: InferencePool}}]
"""
    listener_all = gateway().replace("protocol: HTTP}", "protocol: HTTP, allowedRoutes: {namespaces: {from: All}}}")
    without = load_texts({"a.yaml": "---\n".join([listener_all, pool(), other])})
    vs = next(r for r in without.of_kind("VirtualService") if r.name == "cross-httproute")
    assert vs.spec["http"][0]["directResponse"] == {"status": 500}
    assert any("RefNotPermitted" in w.message for w in without.warnings)
    with_grant = load_texts({"a.yaml": "---\n".join([listener_all, pool(), other, grant])})
    vs = next(r for r in with_grant.of_kind("VirtualService") if r.name == "cross-httproute")
    assert vs.spec["http"][0]["route"][0]["destination"]["host"] == POOL_HOST


# -- the cluster --------------------------------------------------------------------

def test_the_pool_cluster_balances_with_override_host_from_envoy_lb_and_round_robin_after():
    snap = translate(config(), GATEWAY)
    cluster = snap[CLUSTER][POOL_CLUSTER]
    assert cluster.lb_policy == cluster.CLUSTER_PROVIDED
    (policy,) = cluster.load_balancing_policy.policies
    assert policy.typed_extension_config.name == "envoy.load_balancing_policies.override_host"
    override = override_host_pb2.OverrideHost()
    assert policy.typed_extension_config.typed_config.Unpack(override)
    (source,) = override.override_host_sources
    assert not source.header                       # a client's own header steers nothing
    assert (source.metadata.key, [p.key for p in source.metadata.path]) == (epp.DESTINATION_NAMESPACE,
                                                                            [epp.DESTINATION_ENDPOINT])
    (fallback,) = override.fallback_policy.policies
    assert fallback.typed_extension_config.name == "envoy.load_balancing_policies.round_robin"
    # selected_host_key (field 2, newer than the pinned protos) follows as wire bytes.
    served = metadata_pb2.MetadataKey(key=epp.DESTINATION_NAMESPACE)
    served.path.add().key = epp.SERVED_KEY
    raw = policy.typed_extension_config.typed_config.value
    assert raw.endswith(b"\x12" + bytes([len(served.SerializeToString())]) + served.SerializeToString())
    # Its endpoints: the pool's, each ADDRESS:TARGETPORT.
    cla = snap[ENDPOINT][POOL_CLUSTER]
    assert sorted((e.endpoint.address.socket_address.address, e.endpoint.address.socket_address.port_value)
                  for loc in cla.endpoints for e in loc.lb_endpoints) == [
        (a, p) for a in ("127.0.0.2", "127.0.0.3", "127.0.0.4") for p in (8000, 8001)]


def test_other_clusters_keep_their_policy_and_proxyless_grpc_gets_no_override_host():
    snap = translate(config(), GATEWAY)
    assert not snap[CLUSTER]["outbound|80||plain.inference.svc.cluster.local"].HasField("load_balancing_policy")
    grpc = translate(config(), PROXYLESS)[CLUSTER][POOL_CLUSTER]
    assert not grpc.HasField("load_balancing_policy")


# -- the filter and the routes --------------------------------------------------------

def test_the_gateway_gets_ext_proc_disabled_last_before_fault_and_router():
    snap = translate(config(), GATEWAY)
    filters = _hcm(snap[LISTENER]["127.0.0.1_8080"]).http_filters
    names = [f.name for f in filters]
    assert names[-3:] == [EXT_PROC, "envoy.filters.http.fault", "envoy.filters.http.router"]
    f = filters[-3]
    assert f.disabled                                              # on only where a route enables it
    cfg = ext_proc_pb2.ExternalProcessor()
    assert f.typed_config.Unpack(cfg)
    mode, m = cfg.processing_mode, processing_mode_pb2.ProcessingMode
    # LEAN_MODE: the pick needs the headers held (SEND) and the body; the response is not sent
    assert (mode.request_header_mode, mode.request_body_mode, mode.response_header_mode, mode.response_body_mode) == (
        m.SEND, m.BUFFERED, m.SKIP, m.NONE)
    # the two overrides the picker may ask for: a streamed answer through it (ANSWER_MODE routes),
    # and a live session's request picked on its headers: no body, the stream kept to the end
    assert cfg.allow_mode_override and [
        (o.request_body_mode, o.response_header_mode, o.response_body_mode, o.response_trailer_mode)
        for o in cfg.allowed_override_modes] == [(m.BUFFERED, m.SEND, m.FULL_DUPLEX_STREAMED, m.SEND),
                                                 (m.NONE, m.SKIP, m.NONE, m.SEND)]
    assert list(cfg.metadata_options.receiving_namespaces.untyped) == [epp.DESTINATION_NAMESPACE]
    assert epp.DESTINATION_NAMESPACE in cfg.metadata_options.forwarding_namespaces.untyped
    assert cfg.message_timeout.seconds == 5 and not cfg.failure_mode_allow
    assert cfg.route_cache_action == cfg.RETAIN


def test_gateways_without_a_pool_route_sidecars_and_proxyless_get_no_ext_proc():
    cfg = load_texts({"a.yaml": "---\n".join([gateway(), gateway("other-gateway", 8081), route(POOL_RULE),
                                              route(PLAIN_RULE, name="plain-route", parent="other-gateway"),
                                              pool(), service("epp", 9002, "grpc", ""), service("plain", 80, "http"),
                                              DEPLOYMENT])})
    other = translate(cfg, OTHER_GATEWAY)
    assert EXT_PROC not in [f.name for lis in other[LISTENER].values() for f in _hcm(lis).http_filters]
    sidecar = translate(cfg, SIDECAR)
    assert EXT_PROC not in [f.name for lis in sidecar[LISTENER].values() if lis.filter_chains
                            for f in _hcm(lis).http_filters]
    for rc in sidecar[ROUTE].values():
        assert not any(EXT_PROC in r.typed_per_filter_config for vh in rc.virtual_hosts for r in vh.routes)


def test_a_route_to_a_pool_enables_ext_proc_with_its_picker_and_failure_mode_and_others_do_not():
    routes = _routes(translate(config(), GATEWAY))
    wrapper, override = _per_route(routes["/v1/"].typed_per_filter_config)
    assert not wrapper.disabled
    assert override.overrides.grpc_service.envoy_grpc.cluster_name == PICKER_CLUSTER
    assert override.overrides.failure_mode_allow.value is False                      # FailClose
    assert EXT_PROC not in routes["/plain/"].typed_per_filter_config
    # Retries walk the picker's fallback list: istiod's default policy, with previous_hosts.
    rp = routes["/v1/"].route.retry_policy
    assert rp.num_retries.value == 2 and "connect-failure" in rp.retry_on
    assert [p.name for p in rp.retry_host_predicate] == ["envoy.retry_host_predicates.previous_hosts"]

    fail_open = load_texts({"a.yaml": "---\n".join([gateway(), route(POOL_RULE), pool(mode="FailOpen"),
                                                    service("epp", 9002, "grpc", ""), DEPLOYMENT])})
    routes = _routes(translate(fail_open, GATEWAY))
    _, override = _per_route(routes["/v1/"].typed_per_filter_config)
    assert override.overrides.failure_mode_allow.value is True                       # FailOpen


def test_a_pool_annotated_answer_mode_gets_the_response_headers_sent_to_its_picker():
    m = processing_mode_pb2.ProcessingMode
    routes = _routes(translate(config(), GATEWAY))
    _, override = _per_route(routes["/v1/"].typed_per_filter_config)
    assert not override.overrides.HasField("processing_mode")                       # the filter's LEAN_MODE
    assert not override.overrides.grpc_initial_metadata
    annotated = pool().replace(f"metadata: {{name: decoders, namespace: {NS}}}",
                               f"metadata: {{name: decoders, namespace: {NS}, "
                               f"annotations: {{{epp.MODE_ANNOTATION}: answer}}}}")
    answer = load_texts({"a.yaml": "---\n".join([gateway(), route(POOL_RULE), annotated,
                                                  service("epp", 9002, "grpc", ""), DEPLOYMENT])})
    _, override = _per_route(_routes(translate(answer, GATEWAY))["/v1/"].typed_per_filter_config)
    mode = override.overrides.processing_mode
    assert (mode.request_header_mode, mode.request_body_mode, mode.response_header_mode) == (m.SEND, m.BUFFERED, m.SEND)
    # the picker is told, so that it never skips the response by picking on the headers alone
    assert [(h.key, h.value) for h in override.overrides.grpc_initial_metadata] == [
        (epp.PICKER_MODE_METADATA, "answer")]


def test_a_split_rule_asks_the_picker_only_for_the_pool_share():
    routes = _routes(translate(config(rules=MIXED_RULE + PLAIN_RULE), GATEWAY))
    mixed = routes["/mixed/"]
    assert EXT_PROC not in mixed.typed_per_filter_config
    by_cluster = {cw.name: cw for cw in mixed.route.weighted_clusters.clusters}
    _, override = _per_route(by_cluster[POOL_CLUSTER].typed_per_filter_config)
    assert override.overrides.grpc_service.envoy_grpc.cluster_name == PICKER_CLUSTER
    assert EXT_PROC not in by_cluster["outbound|80||plain.inference.svc.cluster.local"].typed_per_filter_config


def test_a_changed_failure_mode_reaches_the_route_through_a_reused_translator():
    translator = Translator()
    first = translator.translate(config(), GATEWAY)
    again = translator.translate(config(), GATEWAY)
    assert first[ROUTE]["http.8080"] == again[ROUTE]["http.8080"]
    changed = load_texts({"inference.yaml": "---\n".join([
        gateway(), route(POOL_RULE + PLAIN_RULE), pool(mode="FailOpen"), service("epp", 9002, "grpc-ext-proc", "http2"),
        service("plain", 80, "http"), DEPLOYMENT, WORKLOAD_ENTRY])})
    routes = _routes(translator.translate(changed, GATEWAY))
    _, override = _per_route(routes["/v1/"].typed_per_filter_config)
    assert override.overrides.failure_mode_allow.value is True
    # An endpoint-only change (a replica more) keeps the routes and updates the pool's endpoints.
    more = load_texts({"inference.yaml": "---\n".join([
        gateway(), route(POOL_RULE + PLAIN_RULE), pool(mode="FailOpen"), service("epp", 9002, "grpc-ext-proc", "http2"),
        service("plain", 80, "http"), DEPLOYMENT, WORKLOAD_ENTRY, WORKLOAD_ENTRY.replace("decoder-4", "decoder-5")
        .replace("127.0.0.4", "127.0.0.5")])})
    snap = translator.translate(more, GATEWAY)
    addresses = {e.endpoint.address.socket_address.address for loc in snap[ENDPOINT][POOL_CLUSTER].endpoints
                 for e in loc.lb_endpoints}
    assert "127.0.0.5" in addresses
    assert snap[CLUSTER][POOL_CLUSTER].HasField("load_balancing_policy")


# -- the analyzers ----------------------------------------------------------------------

def _warnings(cfg) -> list[str]:
    return [f"{w.field}: {w.message}" for w in cfg.warnings]


def test_a_route_to_a_pool_that_does_not_exist_warns_and_answers_500():
    cfg = load_texts({"a.yaml": "---\n".join([gateway(), route(POOL_RULE.replace("decoders", "missing"))])})
    assert any("Referenced InferencePool not found: \"inference/missing\"" in w for w in _warnings(cfg))
    vs = cfg.of_kind("VirtualService")[0]
    assert vs.spec["http"][0]["directResponse"] == {"status": 500}


def test_a_pool_selecting_no_workload_or_no_address_warns():
    cfg = load_texts({"a.yaml": "---\n".join([pool(labels="{app: nothing}"), service("epp", 9002, "grpc", "")])})
    assert any(w.startswith("spec.selector.matchLabels: The selector matches no workload") for w in _warnings(cfg))
    no_address = DEPLOYMENT.replace('      annotations: {mcp-mesh.io/addresses: "127.0.0.2,127.0.0.3"}\n', "")
    cfg = load_texts({"a.yaml": "---\n".join([pool(), service("epp", 9002, "grpc", ""), no_address])})
    assert any("have no address" in w for w in _warnings(cfg))
    cfg = load_texts({"a.yaml": "---\n".join([pool(), service("epp", 9002, "grpc", ""), DEPLOYMENT])})
    assert not _warnings(cfg)


def test_a_missing_picker_service_or_a_picker_port_that_is_not_http2_warns():
    cfg = load_texts({"a.yaml": "---\n".join([pool(), DEPLOYMENT])})
    assert any("Referenced endpoint picker Service not found: \"inference/epp\"" in w for w in _warnings(cfg))
    cfg = load_texts({"a.yaml": "---\n".join([pool(), DEPLOYMENT, service("epp", 9003, "grpc", "")])})
    assert any('Referenced host:port not found: "epp.inference.svc.cluster.local:9002"' in w for w in _warnings(cfg))
    cfg = load_texts({"a.yaml": "---\n".join([pool(), DEPLOYMENT, service("epp", 9002, "tcp-epp", "")])})
    assert any("is not declared HTTP/2" in w for w in _warnings(cfg))
    for name, proto in (("grpc-ext-proc", ""), ("ext-proc", "http2")):
        cfg = load_texts({"a.yaml": "---\n".join([pool(), DEPLOYMENT, service("epp", 9002, name, proto)])})
        assert not _warnings(cfg), _warnings(cfg)


def test_pool_findings_never_block_a_push():
    cfg = load_texts({"a.yaml": "---\n".join([gateway(), route(POOL_RULE.replace("decoders", "missing")),
                                              pool(labels="{app: nothing}")])})     # no ConfigError
    found = [w for w in cfg.warnings if w.resource.startswith(("InferencePool/", "HTTPRoute/"))]
    assert len(found) >= 3 and {w.severity for w in found} == {"warning"}


def test_a_grpc_route_cannot_send_to_a_pool():
    grpc_route = route(POOL_RULE.replace("- matches: [{path: {type: PathPrefix, value: /v1}}]",
                                         "- matches: [{method: {service: svc.Infer}}]")).replace("HTTPRoute", "GRPCRoute")
    grpc_gateway = gateway().replace("protocol: HTTP}", "protocol: HTTP, allowedRoutes: {kinds: [{kind: GRPCRoute}]}}")
    cfg = load_texts({"a.yaml": "---\n".join([grpc_gateway, grpc_route, pool(), service("epp", 9002, "grpc", ""),
                                              DEPLOYMENT])})
    assert any("InvalidKind" in w for w in _warnings(cfg))
    assert cfg.of_kind("VirtualService")[0].spec["http"][0]["directResponse"] == {"status": 500}
