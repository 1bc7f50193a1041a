"""The decision loop's endpoint weights on the control plane: parsing (each bad input named,
nothing half-applied), the store's expiry, and what translation serves from the Overlay it
is given: the weighted cluster's ClusterLoadAssignment carries the weights, every other
resource is the very message it was (so CDS, LDS, RDS and the other assignments keep their
versions)."""
import time

import pytest

from mcp26.mesh.parse import parse_documents
from mcp26.mesh.resources import MeshConfig
from mcp26.xds.endpoint_weights import EndpointWeights, parse_endpoint, parse_weights
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.translate import Overlay, Translator
from mcp26.xds.model.type_urls import CLUSTER, ENDPOINT, LISTENER, ROUTE

SE = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: svc, namespace: default}
spec:
  hosts: [svc.mesh.local]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints:
  - {address: 127.0.0.2, ports: {http: 9001}, weight: 2}
  - {address: 127.0.0.3, ports: {http: 9001}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: other, namespace: default}
spec:
  hosts: [other.mesh.local]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.4, ports: {http: 9001}}]
"""
CLUSTER_NAME = "outbound|80||svc.mesh.local"
NODE = ProxyNode("sidecar~127.0.0.1~a.default~default.svc.cluster.local", kind="sidecar")


def _weights(cla) -> dict:
    return {f"{lb.endpoint.address.socket_address.address}:{lb.endpoint.address.socket_address.port_value}":
            lb.load_balancing_weight.value for loc in cla.endpoints for lb in loc.lb_endpoints}


def test_parse_accepts_and_canonicalises():
    now = time.time()
    ws = parse_weights({"cluster": CLUSTER_NAME, "weights": {"127.0.0.2:9001": 9, "[::1]:80": 128},
                        "expires_at": now + 5}, now)
    assert {(w.endpoint, w.weight) for w in ws} == {("127.0.0.2:9001", 9), ("[::1]:80", 128)}
    assert parse_endpoint("[0:0::1]:80") == "[::1]:80"


@pytest.mark.parametrize("body, field", [
    ([], "expected"),
    ({"weights": {"127.0.0.2:9001": 1}, "expires_at": 1e12}, "cluster:"),
    ({"cluster": CLUSTER_NAME, "weights": {}, "expires_at": "soon"}, "weights:"),
    ({"cluster": CLUSTER_NAME, "weights": {"127.0.0.2:9001": 0}}, "expires_at:"),
    ({"cluster": CLUSTER_NAME, "weights": {"127.0.0.2:9001": 0}, "expires_at": "NOW+5"}, "weights['127.0.0.2:9001']"),
    ({"cluster": CLUSTER_NAME, "weights": {"127.0.0.2:9001": 129}, "expires_at": "NOW+5"}, "1..128"),
    ({"cluster": CLUSTER_NAME, "weights": {"127.0.0.2:9001": 2.5}, "expires_at": "NOW+5"}, "integer"),
    ({"cluster": CLUSTER_NAME, "weights": {"127.0.0.2:9001": True}, "expires_at": "NOW+5"}, "integer"),
    ({"cluster": CLUSTER_NAME, "weights": {"svc:9001": 3}, "expires_at": "NOW+5"}, "weights['svc:9001']"),
    ({"cluster": CLUSTER_NAME, "weights": {"127.0.0.2": 3}, "expires_at": "NOW+5"}, "port"),
    ({"cluster": CLUSTER_NAME, "weights": {"127.0.0.2:9001": 3}, "expires_at": "NOW-1"}, "expires_at:"),
    ({"cluster": CLUSTER_NAME, "weights": {"127.0.0.2:9001": 3}, "expires_at": "NOW+7200"}, "expires_at:"),
    ({"cluster": CLUSTER_NAME, "weights": {"127.0.0.2:9001": 3}, "expires_at": "NOW+5", "hold": 1}, "hold:"),
])
def test_parse_names_the_bad_field(body, field):
    now = time.time()
    if isinstance(body, dict) and isinstance(body.get("expires_at"), str) and body["expires_at"].startswith("NOW"):
        body = {**body, "expires_at": now + float(body["expires_at"][3:])}
    with pytest.raises(ValueError) as e:
        parse_weights(body, now)
    assert field in str(e.value)


def test_store_replaces_expires_and_removes():
    now = time.time()
    store = EndpointWeights()
    store.put(parse_weights({"cluster": "c", "weights": {"127.0.0.2:1": 9, "127.0.0.3:1": 1}, "expires_at": now + 2}, now))
    store.put(parse_weights({"cluster": "c", "weights": {"127.0.0.2:1": 4}, "expires_at": now + 10}, now))
    assert store.by_cluster(now) == {"c": {"127.0.0.2:1": 4, "127.0.0.3:1": 1}}
    assert store.by_cluster(now + 3) == {"c": {"127.0.0.2:1": 4}}       # each endpoint its own expiry
    assert store.drop_expired(now + 3) and not store.drop_expired(now + 3)
    assert store.remove("c", "127.0.0.2:1") == 1 and store.active(now) == ()


def test_translation_lays_the_weights_over_eds_only():
    config = MeshConfig(parse_documents(SE, "c.yaml"))
    tr = Translator()
    before = tr.translate(config, NODE)
    assert _weights(before[ENDPOINT][CLUSTER_NAME]) == {"127.0.0.2:9001": 2, "127.0.0.3:9001": 0}
    now = time.time()
    store = EndpointWeights()
    store.put(parse_weights({"cluster": CLUSTER_NAME, "weights": {"127.0.0.3:9001": 9}, "expires_at": now + 60}, now))
    after = tr.translate(config, NODE, Overlay(endpoint_weights=store.by_cluster(now)))
    cla = after[ENDPOINT][CLUSTER_NAME]
    assert _weights(cla) == {"127.0.0.2:9001": 2, "127.0.0.3:9001": 9}     # the unnamed endpoint keeps its weight
    assert [loc.load_balancing_weight.value for loc in cla.endpoints] == [11]
    assert _weights(before[ENDPOINT][CLUSTER_NAME])["127.0.0.3:9001"] == 0  # shared messages are not changed
    for t in (CLUSTER, LISTENER, ROUTE):
        assert all(after[t][n] is before[t][n] for n in before[t]), t
    others = [n for n in before[ENDPOINT] if n != CLUSTER_NAME]
    assert others and all(after[ENDPOINT][n] is before[ENDPOINT][n] for n in others)
    store.remove(CLUSTER_NAME)
    restored = tr.translate(config, NODE, Overlay(endpoint_weights=store.by_cluster(now)))[ENDPOINT][CLUSTER_NAME]
    assert restored is before[ENDPOINT][CLUSTER_NAME]


def test_an_expired_weight_leaves_the_next_overlay_and_translation_reads_no_clock():
    config = MeshConfig(parse_documents(SE, "c.yaml"))
    now = time.time()
    store = EndpointWeights()
    store.put(parse_weights({"cluster": CLUSTER_NAME, "weights": {"127.0.0.3:9001": 9}, "expires_at": now + 0.2}, now))
    overlay = Overlay(endpoint_weights=store.by_cluster())
    tr = Translator()
    assert _weights(tr.translate(config, NODE, overlay)[ENDPOINT][CLUSTER_NAME])["127.0.0.3:9001"] == 9
    time.sleep(0.25)
    # The overlay is what was decided: the server replaces it when the weight expires
    # (scheduler_actions.py's timer, XdsServer.republish_overlay), translation never drops it.
    assert _weights(tr.translate(config, NODE, overlay)[ENDPOINT][CLUSTER_NAME])["127.0.0.3:9001"] == 9
    later = Overlay(endpoint_weights=store.by_cluster())
    assert _weights(tr.translate(config, NODE, later)[ENDPOINT][CLUSTER_NAME])["127.0.0.3:9001"] == 0


def test_the_overlay_is_a_copy_nothing_can_change():
    weights = {CLUSTER_NAME: {"127.0.0.3:9001": 9}}
    overlay = Overlay(endpoint_weights=weights)
    weights[CLUSTER_NAME]["127.0.0.3:9001"] = 1
    weights["other"] = {}
    assert dict(overlay.endpoint_weights) == {CLUSTER_NAME: {"127.0.0.3:9001": 9}}
    with pytest.raises(TypeError):
        overlay.endpoint_weights[CLUSTER_NAME]["127.0.0.3:9001"] = 1
    with pytest.raises(AttributeError):
        overlay.endpoint_weights = {}
