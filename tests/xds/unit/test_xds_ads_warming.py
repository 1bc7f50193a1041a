"""A changed cluster warms on its endpoints: a CDS response is followed by EDS, even unchanged.

Envoy replaces an updated cluster by a warming one with a new EDS watch and
waits for a ClusterLoadAssignment for it; the one it already holds does not
count. If the server sends none (the endpoints did not change), the new
cluster warms only when its initial fetch times out (15 s) and the old one
keeps serving meanwhile: a DestinationRule switching a service to
ISTIO_MUTUAL kept plaintext for 15 s while the server side was already
STRICT (503s). istiod answers EDS for warming (AlwaysRespond, envoy#13009).
The same through real Envoys: tests/xds/e2e/test_identity_mtls.py.
"""
from __future__ import annotations

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2

from mcp26.xds.ads_protocol import DeltaStream, Shared, SotwStream
from mcp26.xds.cache import PreparedSnapshot
from mcp26.xds.sync import SyncTracker
from mcp26.xds.telemetry import Telemetry
from mcp26.xds.model.type_urls import CLUSTER, ENDPOINT

NODE = base_pb2.Node(id="sidecar~127.0.0.1~a-1.shop~shop.svc.cluster.local")


def snapshot(timeouts: dict[str, int], ports: dict[str, int]) -> PreparedSnapshot:
    """Clusters whose connect timeout is `timeouts[name]`; endpoints on `ports[name]`."""
    out = {CLUSTER: {}, ENDPOINT: {}}
    for name, t in timeouts.items():
        c = out[CLUSTER][name] = cluster_pb2.Cluster(name=name, type=cluster_pb2.Cluster.EDS)
        c.connect_timeout.FromSeconds(t)
        cla = out[ENDPOINT][name] = endpoint_pb2.ClusterLoadAssignment(cluster_name=name)
        addr = cla.endpoints.add().lb_endpoints.add().endpoint.address.socket_address
        addr.address, addr.port_value = "127.0.0.1", ports[name]
    return PreparedSnapshot.from_snapshot(out, "g")


def decode(wires: list[bytes], delta: bool) -> list[tuple[str, list[str]]]:
    cls = discovery_pb2.DeltaDiscoveryResponse if delta else discovery_pb2.DiscoveryResponse
    out = []
    for w in wires:
        r = cls.FromString(w)
        if delta:
            names = [x.name for x in r.resources]
        elif r.type_url == CLUSTER:
            names = [cluster_pb2.Cluster.FromString(a.value).name for a in r.resources]
        else:
            names = [endpoint_pb2.ClusterLoadAssignment.FromString(a.value).cluster_name for a in r.resources]
        out.append(("CDS" if r.type_url == CLUSTER else "EDS", sorted(names)))
    return out


def connected(delta: bool, snap: PreparedSnapshot):
    """A stream that asked for every cluster and their endpoints and ACKed both."""
    stream = (DeltaStream if delta else SotwStream)(Shared(SyncTracker(), Telemetry().metrics))
    last = {}

    def request(type_url, names=(), ack=True):
        if delta:
            req = discovery_pb2.DeltaDiscoveryRequest(node=NODE, type_url=type_url, resource_names_subscribe=names)
        else:
            prev = last.get(type_url)
            req = discovery_pb2.DiscoveryRequest(node=NODE, type_url=type_url, resource_names=names,
                                                 version_info=prev.version_info if prev else "",
                                                 response_nonce=prev.nonce if prev else "")
        stream.hello(req)
        wires = stream.on_request(req, snap)
        for w in wires:
            r = (discovery_pb2.DeltaDiscoveryResponse if delta else discovery_pb2.DiscoveryResponse).FromString(w)
            last[r.type_url] = r
        return wires

    assert decode(request(CLUSTER), delta) == [("CDS", ["a", "b"])]
    assert decode(request(ENDPOINT, ["a", "b"]), delta) == [("EDS", ["a", "b"])]
    if not delta:                                         # ACKs: nothing more to send
        assert request(CLUSTER) == [] and request(ENDPOINT, ["a", "b"]) == []
    return stream, request


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
def test_an_updated_cluster_gets_its_unchanged_endpoints_again(delta):
    before = snapshot({"a": 1, "b": 1}, {"a": 9001, "b": 9002})
    stream, request = connected(delta, before)
    after = snapshot({"a": 5, "b": 1}, {"a": 9001, "b": 9002})   # cluster a changes, no endpoint does
    got = decode(stream.push(after), delta)
    # CDS: SotW the whole set (LDS/CDS always), Delta the changed one; EDS: what the changed cluster warms on
    assert got == [("CDS", ["a", "b"] if not delta else ["a"]), ("EDS", ["a"])]


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
def test_warming_endpoints_come_with_the_endpoint_changes(delta):
    stream, _ = connected(delta, snapshot({"a": 1, "b": 1}, {"a": 9001, "b": 9002}))
    got = decode(stream.push(snapshot({"a": 5, "b": 1}, {"a": 9001, "b": 9003})), delta)
    assert got == [("CDS", ["a", "b"] if not delta else ["a"]), ("EDS", ["a", "b"])]   # a warms, b changed


def test_sotw_a_cluster_removed_warms_nothing():
    stream, _ = connected(False, snapshot({"a": 1, "b": 1}, {"a": 9001, "b": 9002}))
    got = decode(stream.push(snapshot({"a": 1}, {"a": 9001})), False)
    # no warming resend; EDS once, its own push, whole (a name it asks for is gone: removal by omission)
    assert got == [("CDS", ["a"]), ("EDS", ["a"])]


def test_sotw_after_an_endpoint_nack_every_cluster_warms_on_the_whole_set():
    from google.rpc import status_pb2
    stream, request = connected(False, snapshot({"a": 1, "b": 1}, {"a": 9001, "b": 9002}))
    assert decode(stream.push(snapshot({"a": 1, "b": 1}, {"a": 9001, "b": 9003})), False) == [("EDS", ["b"])]
    last = discovery_pb2.DiscoveryResponse.FromString(stream.push(snapshot({"a": 1, "b": 1}, {"a": 9001, "b": 9004}))[0])
    nack = discovery_pb2.DiscoveryRequest(node=NODE, type_url=ENDPOINT, resource_names=["a", "b"], response_nonce=last.nonce,
                                          error_detail=status_pb2.Status(code=3, message="b: rejected"))
    assert stream.on_request(nack, None) == []
    got = decode(stream.push(snapshot({"a": 5, "b": 1}, {"a": 9001, "b": 9004})), False)
    assert got == [("CDS", ["a", "b"]), ("EDS", ["a", "b"])]     # what it kept is not known


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
def test_endpoints_alone_change_no_cds_no_extra(delta):
    before = snapshot({"a": 1, "b": 1}, {"a": 9001, "b": 9002})
    stream, _ = connected(delta, before)
    got = decode(stream.push(snapshot({"a": 1, "b": 1}, {"a": 9001, "b": 9003})), delta)
    assert got == [("EDS", ["b"])]       # SotW too: EDS is not LDS/CDS, a push carries what changed
    assert stream.push(snapshot({"a": 1, "b": 1}, {"a": 9001, "b": 9003})) == []   # nothing changed: nothing sent


def test_sotw_after_a_cluster_nack_every_cluster_warms_on_the_whole_set():
    """The rejected CDS response changed a; the next one, taken, changes a for the client
    too (it kept the old a), so a must warm although it did not change since the rejected one."""
    from google.rpc import status_pb2
    stream, _ = connected(False, snapshot({"a": 1, "b": 1}, {"a": 9001, "b": 9002}))
    wires = stream.push(snapshot({"a": 5, "b": 1}, {"a": 9001, "b": 9002}))
    cds = discovery_pb2.DiscoveryResponse.FromString(wires[0])
    nack = discovery_pb2.DiscoveryRequest(node=NODE, type_url=CLUSTER, response_nonce=cds.nonce,
                                          error_detail=status_pb2.Status(code=3, message="a: rejected"))
    assert stream.on_request(nack, None) == []
    got = decode(stream.push(snapshot({"a": 5, "b": 2}, {"a": 9001, "b": 9002})), False)
    assert got == [("CDS", ["a", "b"]), ("EDS", ["a", "b"])]
