"""InferencePool clusters, as istiod builds them for a gateway.

mesh.gateway_api gives each InferencePool an HTTPRoute sends to a shadow
ServiceEntry `POOL-ip-HASH.NS.svc.cluster.local` (istiod's shadow Service):
one port, 54321, whose endpoints are the pool's `ADDRESS:TARGETPORT`s
(mesh.inference_pool.pool_endpoints: the selector over the WorkloadEntries of
the pool's namespace, those mesh.kube synthesizes from Pods and Deployments
included), labelled with the pool's endpoint picker. clusters.py builds its
EDS cluster `outbound|54321||POOL-ip-HASH.NS.svc.cluster.local` like any
other; `override_host(idx, built, grpc)`, the Translator's hook right after
build_clusters, then gives it istiod's load-balancing policy
(ClusterBuilder.applyOverrideHostPolicy):

    envoy.load_balancing_policies.override_host
      override_host_sources: metadata envoy.lb / x-gateway-destination-endpoint
      selected_host_key:     metadata envoy.lb / x-gateway-destination-endpoint-served
      fallback_policy:       round robin

The endpoint picker (ext_proc, endpoint_picker.py) writes the pick and its
fallbacks, `ip:port,ip:port,...`, into the request's `envoy.lb` metadata; the
policy sends the first attempt to the first address and every retry to the
next one not yet used (its filter state keeps the place), and uses round
robin when there is no pick (FailOpen with the picker down) or the list is
spent. The route's retry policy (routes.py: istiod's default, 2 retries on
connect-failure, refused-stream, unavailable, cancelled, 503, with
previous_hosts) is what walks the list: pick + up to two fallbacks is three
attempts. `selected_host_key` writes where the request actually went, which
ext_proc forwards to the picker with the response headers.

Only the metadata source is read, not the header: a client's own
`x-gateway-destination-endpoint` header steers nothing. The policy is given on
every Envoy (istiod: gateways only; without a pick it is round robin, so a
sidecar routing to the pool gets round robin), not to proxyless gRPC, which
has no override_host.
"""
from __future__ import annotations

from dataclasses import dataclass

from envoy.config.cluster.v3 import cluster_pb2
from envoy.extensions.load_balancing_policies.override_host.v3 import override_host_pb2
from envoy.extensions.load_balancing_policies.round_robin.v3 import round_robin_pb2
from envoy.type.metadata.v3 import metadata_pb2
from google.protobuf import any_pb2

from mcp26.mesh import endpoint_picker as epp
from mcp26.mesh import gateway_api as gwapi
from mcp26.mesh.inference_pool import DEFAULT_EPP_PORT, FAIL_OPEN
from mcp26.mesh.kube import service_host
from mcp26.xds.translate.index import MeshIndex, Service
from mcp26.xds.translate.names import cluster_name

Cluster = cluster_pb2.Cluster
OVERRIDE_HOST = "envoy.load_balancing_policies.override_host"
ROUND_ROBIN = "envoy.load_balancing_policies.round_robin"
_OVERRIDE_HOST_URL = "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost"
# OverrideHost.selected_host_key (field 2) is in Envoy 1.40's API but not in the
# xds-protos this project pins, so it is appended to the message as wire bytes.
_SELECTED_HOST_KEY_FIELD = 2


@dataclass(frozen=True)
class Pool:
    """What a route to one pool's cluster needs: the pool, its picker's cluster and failure mode."""
    ref: str                      # NS/NAME of the InferencePool
    cluster: str                  # outbound|54321||POOL-ip-HASH.NS.svc.cluster.local
    picker_cluster: str           # outbound|PORT||EPP.NS.svc.cluster.local
    fail_open: bool
    picker_mode: str = "lean"     # the pool's mcp-mesh.io/endpoint-picker-mode (endpoint_picker.py)


def is_pool_service(svc: Service) -> bool:
    return svc.source.labels.get(gwapi.SERVICE_SEMANTICS_LABEL) == gwapi.INFERENCE_POOL_SEMANTICS


def _pool(svc: Service) -> Pool:
    labels = svc.source.labels
    name = labels.get(gwapi.POOL_NAME_LABEL, "")
    picker = labels.get(gwapi.PICKER_SERVICE_LABEL, "")
    port = int(labels.get(gwapi.PICKER_PORT_LABEL) or DEFAULT_EPP_PORT)
    # As istiod: the picker is the Service NAME in the pool's namespace, its cluster outbound|PORT||HOST.
    return Pool(f"{svc.namespace}/{name}", cluster_name(svc.host, gwapi.POOL_SERVICE_PORT),
                cluster_name(service_host(picker, svc.namespace), port) if picker else "",
                labels.get(gwapi.PICKER_FAILURE_MODE_LABEL) == FAIL_OPEN, labels.get(epp.MODE_ANNOTATION, "lean"))


def pools(idx: MeshIndex) -> dict[str, Pool]:
    """{pool cluster name: Pool} for every shadow service of the index (memoised on it)."""
    found = idx.memo.get("inference_pools")
    if found is None:
        found = idx.memo["inference_pools"] = {
            p.cluster: p for p in (_pool(s) for s in idx.services.values() if is_pool_service(s))}
    return found


def _metadata_key(key: str) -> metadata_pb2.MetadataKey:
    out = metadata_pb2.MetadataKey(key=epp.DESTINATION_NAMESPACE)
    out.path.add().key = key
    return out


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def override_host_policy() -> any_pb2.Any:
    """The OverrideHost policy istiod gives a pool's cluster, packed."""
    policy = override_host_pb2.OverrideHost()
    policy.override_host_sources.add().metadata.CopyFrom(_metadata_key(epp.DESTINATION_ENDPOINT))
    fallback = policy.fallback_policy.policies.add().typed_extension_config
    fallback.name = ROUND_ROBIN
    fallback.typed_config.Pack(round_robin_pb2.RoundRobin())
    selected = _metadata_key(epp.SERVED_KEY).SerializeToString(deterministic=True)
    raw = policy.SerializeToString(deterministic=True) + _varint(_SELECTED_HOST_KEY_FIELD << 3 | 2) \
        + _varint(len(selected)) + selected
    return any_pb2.Any(type_url=_OVERRIDE_HOST_URL, value=raw)


_POLICY = override_host_policy()


def apply_override_host(cluster: Cluster) -> None:
    """istiod's applyOverrideHostPolicy: the cluster's lb_policy CLUSTER_PROVIDED
    and load_balancing_policy override_host (locality-weighted LB cannot go with it)."""
    cluster.common_lb_config.ClearField("locality_weighted_lb_config")
    cluster.lb_policy = Cluster.CLUSTER_PROVIDED
    if cluster.WhichOneof("lb_config"):
        cluster.ClearField(cluster.WhichOneof("lb_config"))
    cluster.ClearField("load_balancing_policy")
    policy = cluster.load_balancing_policy.policies.add().typed_extension_config
    policy.name = OVERRIDE_HOST
    policy.typed_config.CopyFrom(_POLICY)


def override_host(idx: MeshIndex, built: tuple[dict, dict], grpc: bool) -> tuple[dict, dict]:
    """The Translator's hook after clusters.build_clusters: the pools' clusters
    (just built, so changed in place) get the override_host policy.
    Proxyless gRPC has no such policy: its pool clusters stay as built."""
    clusters, _ = built
    if not grpc:
        for name in pools(idx):
            if name in clusters:
                apply_override_host(clusters[name])
    return built
