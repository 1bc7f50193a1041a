"""The ADS protocol without sockets: plain DiscoveryRequest / DeltaDiscoveryRequest messages in,
the wire bytes `xds.ads_protocol` returns parsed back, on hand-made PreparedSnapshots.

The scenarios are tables (as go-control-plane's server_test.go): each step
sends one request (or pushes a new snapshot) and names the responses it must
produce, in order, as "TYPE: name ... -removed ...". Every resource in a
response is looked up by its exact Any bytes in the snapshot that was served,
so a summary only matches if the bytes are the prepared ones. The same
protocol over a real grpc.aio server: tests/xds/e2e/test_xds_ads_grpc.py.
"""
from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2, extension_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import wrappers_pb2
from google.rpc import status_pb2

from mcp26.xds.model import type_urls as T
from mcp26.xds.ads import AdsHub, StreamRunner
from mcp26.xds.ads_protocol import CONTROL_PLANE, DeltaStream, Shared, SotwStream, counting_nonces, push_order
from mcp26.xds.cache import PreparedSnapshot, SnapshotCache
from mcp26.xds.sync import SyncTracker, short_name
from mcp26.xds.telemetry import Telemetry

NODE = base_pb2.Node(id="router~127.0.0.1~gw.default~default.svc.cluster.local", cluster="gw")
CDS, EDS, LDS, RDS, ECDS = T.CLUSTER, T.ENDPOINT, T.LISTENER, T.ROUTE, T.EXTENSION_CONFIG


def resources(config) -> dict:
    """config: {"clusters": {name: port}, "listeners": [names], "routes": {name: cluster},
    "extensions": {name: value}} -> type URL -> name -> message."""
    out = {CDS: {}, EDS: {}, LDS: {}, RDS: {}, ECDS: {}}
    for name, port in config.get("clusters", {}).items():
        out[CDS][name] = cluster_pb2.Cluster(name=name, type=cluster_pb2.Cluster.EDS, alt_stat_name=str(port))
        cla = out[EDS][name] = endpoint_pb2.ClusterLoadAssignment(cluster_name=name)
        addr = cla.endpoints.add().lb_endpoints.add().endpoint.address.socket_address
        addr.address, addr.port_value = "127.0.0.1", port
    for name in config.get("listeners", []):
        out[LDS][name] = listener_pb2.Listener(name=name)
    for name, cluster in config.get("routes", {}).items():
        rc = out[RDS][name] = route_pb2.RouteConfiguration(name=name)
        rc.virtual_hosts.add(name="vh", domains=["*"]).routes.add().route.cluster = cluster
    for name, value in config.get("extensions", {}).items():
        ext = out[ECDS][name] = extension_pb2.TypedExtensionConfig(name=name)
        ext.typed_config.Pack(wrappers_pb2.StringValue(value=value))
    return out


def prepared(config) -> PreparedSnapshot:
    return PreparedSnapshot.from_snapshot(resources(config), "g")


BASE = {"clusters": {"a": 1001, "b": 1002}, "listeners": ["l1", "l2"], "routes": {"r1": "a", "r2": "b"},
        "extensions": {"x1": "v1"}}
VERSIONS = {t: {n: r.version for n, r in by.items()} for t, by in prepared(BASE).resources.items()}


class Driver:
    """One protocol stream fed plain messages; keeps what it was sent, to ACK or NACK it."""

    def __init__(self, delta: bool, config=BASE, shared: Shared | None = None):
        self.delta = delta
        self.telemetry = Telemetry()
        self.shared = shared or Shared(SyncTracker(), self.telemetry.metrics)
        self.stream = (DeltaStream if delta else SotwStream)(self.shared)
        self.snap = prepared(config) if config is not None else None
        self.sent: dict[str, list] = {}       # type URL -> responses, parsed
        self.names: dict[str, list] = {}      # SotW: type URL -> names last asked for
        self.acked: dict[str, str] = {}       # SotW: type URL -> version last ACKed
        self.wire: list[bytes] = []

    def request(self, **kw) -> list[str]:
        req = (discovery_pb2.DeltaDiscoveryRequest if self.delta else discovery_pb2.DiscoveryRequest)(node=NODE, **kw)
        self.stream.hello(req)
        return self._read(self.stream.on_request(req, self.snap))

    def push(self, config) -> list[str]:
        return self.push_snapshot(prepared(config))

    def push_snapshot(self, snap: PreparedSnapshot) -> list[str]:
        self.snap = snap
        return self._read(self.stream.push(snap))

    def last(self, type_url: str, back: int = 1):
        return self.sent[type_url][-back]

    def _read(self, wires: list[bytes]) -> list[str]:
        self.wire += wires
        out = []
        for wire in wires:
            cls = discovery_pb2.DeltaDiscoveryResponse if self.delta else discovery_pb2.DiscoveryResponse
            resp = cls.FromString(wire)
            self.sent.setdefault(resp.type_url, []).append(resp)
            out.append(summary(resp, self.snap))
        return out

    def sync(self, type_url: str) -> dict:
        return self.shared.tracker.syncz()[0]["types"][short_name(type_url)]


def summary(resp, snap: PreparedSnapshot) -> str:
    """"TYPE: name ... -removed ...", each resource checked byte for byte against `snap`."""
    have = snap.of_type(resp.type_url)
    by_bytes = {r.any.SerializeToString(): r for r in have.values()}
    names = []
    for res in resp.resources:
        if isinstance(res, discovery_pb2.Resource):      # Delta: name, version, resource
            r = have[res.name]
            assert (res.version, res.resource) == (r.version, r.any)
        else:
            r = by_bytes[res.SerializeToString()]
        names.append(r.name)
    removed = [f"-{n}" for n in getattr(resp, "removed_resources", [])]
    return " ".join([f"{short_name(resp.type_url)}:", *names, *removed])


# Steps. `expect` is what the step must produce, in order.
@dataclass
class Ask:
    """SotW: a request for `names`, ACKing the last response of its type (if any)."""
    type_url: str
    names: tuple = ()
    expect: list = field(default_factory=list)
    version_info: str = ""          # a reconnecting proxy's first request says what it runs

    def run(self, d: Driver) -> list[str]:
        d.names[self.type_url] = list(self.names)
        prev = d.sent.get(self.type_url)
        if prev:
            d.acked[self.type_url] = prev[-1].version_info
            return d.request(type_url=self.type_url, resource_names=self.names,
                             version_info=prev[-1].version_info, response_nonce=prev[-1].nonce)
        return d.request(type_url=self.type_url, resource_names=self.names, version_info=self.version_info)


@dataclass
class Sub:
    """Delta: subscribe / unsubscribe; `initial` = initial_resource_versions (a reconnect)."""
    type_url: str
    names: tuple = ()
    unsub: tuple = ()
    expect: list = field(default_factory=list)
    initial: dict = field(default_factory=dict)

    def run(self, d: Driver) -> list[str]:
        return d.request(type_url=self.type_url, resource_names_subscribe=self.names,
                         resource_names_unsubscribe=self.unsub, initial_resource_versions=self.initial)


@dataclass
class Ack:
    """ACK the last response of a type (SotW: with the names last asked for)."""
    type_url: str
    expect: list = field(default_factory=list)

    def run(self, d: Driver) -> list[str]:
        last = d.last(self.type_url)
        if d.delta:
            return d.request(type_url=self.type_url, response_nonce=last.nonce)
        d.acked[self.type_url] = last.version_info
        return d.request(type_url=self.type_url, resource_names=d.names[self.type_url],
                         version_info=last.version_info, response_nonce=last.nonce)


@dataclass
class Nack:
    """Reject the last response of a type (SotW: naming the version it keeps); `back`=2:
    the one before it (a stale NACK, arriving after the next response was sent)."""
    type_url: str
    message: str
    expect: list = field(default_factory=list)
    back: int = 1

    def run(self, d: Driver) -> list[str]:
        kw = dict(type_url=self.type_url, response_nonce=d.last(self.type_url, self.back).nonce,
                  error_detail=status_pb2.Status(code=3, message=self.message))
        if not d.delta:
            kw.update(resource_names=d.names[self.type_url], version_info=d.acked.get(self.type_url, ""))
        return d.request(**kw)


@dataclass
class Stale:
    """SotW: a request answering the response before the last one, asking for `names`."""
    type_url: str
    names: tuple = ()
    expect: list = field(default_factory=list)

    def run(self, d: Driver) -> list[str]:
        old = d.last(self.type_url, back=2)
        return d.request(type_url=self.type_url, resource_names=self.names,
                         version_info=old.version_info, response_nonce=old.nonce)


@dataclass
class Push:
    """The config changed: the stream is pushed the snapshot of `config`."""
    config: dict
    expect: list = field(default_factory=list)

    def run(self, d: Driver) -> list[str]:
        return d.push(self.config)


@dataclass
class Sync:
    """What /debug/syncz shows for a type; `acked`/`nacked`: the nth response's version
    (1-based), or a version string."""
    type_url: str
    status: str
    acked: int | str | None = None
    nacked: int | str | None = None
    error: str = ""
    expect: list = field(default_factory=list)

    def run(self, d: Driver) -> list[str]:
        s = d.sync(self.type_url)
        assert s["status"] == self.status, s
        for key, n in (("acked_version", self.acked), ("nacked_version", self.nacked)):
            if isinstance(n, int):
                sent = d.sent[self.type_url][n - 1]
                assert s[key] == (sent.system_version_info if d.delta else sent.version_info), (key, s)
            elif n is not None:
                assert s[key] == n, (key, s)
        assert s["error"] == self.error, s
        return []


def play(d: Driver, steps) -> None:
    for i, step in enumerate(steps):
        got = step.run(d)
        assert got == step.expect, f"step {i + 1} {step}"


CHANGED_B = {**BASE, "clusters": {"a": 1001, "b": 9999, "c": 1003}}
ONLY_A = {**BASE, "clusters": {"a": 1001}}
EVERY_TYPE_CHANGED = {"clusters": {"a": 1, "b": 2, "c": 3}, "listeners": ["l1", "l9"], "routes": {"r1": "c"},
                      "extensions": {"x1": "v2"}}

SOTW = {
    "CDS with no names is wildcard": [
        Ask(CDS, expect=["CDS: a b"])],
    "'*' is wildcard on any type": [
        Ask(EDS, ("*",), expect=["EDS: a b"])],
    "EDS with no names is subscribed to nothing": [
        Ask(EDS, expect=[])],
    "LDS with names answers only those": [
        Ask(LDS, ("l2",), expect=["LDS: l2"])],
    "names that do not exist are left out": [
        Ask(RDS, ("r2", "missing"), expect=["RDS: r2"])],
    "ACK without subscription change sends nothing": [
        Ask(CDS, expect=["CDS: a b"]),
        Ack(CDS, expect=[]),
        Sync(CDS, "SYNCED", acked=1)],
    "a subscription change is answered at once": [
        Ask(RDS, ("r1",), expect=["RDS: r1"]),
        Ask(RDS, ("r1", "r2"), expect=["RDS: r1 r2"]),
        Sync(RDS, "STALE", acked=1)],
    "removal by omission": [
        Ask(CDS, expect=["CDS: a b"]),
        Ack(CDS),
        Push(ONLY_A, expect=["CDS: a"])],
    "a change to what nobody asked for sends nothing": [
        Ask(RDS, ("r1",), expect=["RDS: r1"]),
        Ack(RDS),
        Push({**BASE, "routes": {"r1": "a", "r9": "b"}}, expect=[])],
    "a stale nonce is ignored, subscription change and all": [
        Ask(CDS, expect=["CDS: a b"]),
        Push(CHANGED_B, expect=["CDS: a b c"]),
        Stale(CDS, ("zzz",), expect=[]),
        Sync(CDS, "STALE"),
        Ack(CDS, expect=[]),
        Sync(CDS, "SYNCED", acked=2)],
    "NACK keeps the acked version and sends nothing; a later ACK clears it": [
        Ask(LDS, expect=["LDS: l1 l2"]),
        Ack(LDS),
        Push({**BASE, "listeners": ["l1", "l2", "l3"]}, expect=["LDS: l1 l2 l3"]),
        Nack(LDS, "l3: bad filter chain", expect=[]),
        Sync(LDS, "NACKED", acked=1, nacked=2, error="l3: bad filter chain"),
        Push({**BASE, "listeners": ["l1"]}, expect=["LDS: l1"]),
        Sync(LDS, "STALE", acked=1, error="l3: bad filter chain"),
        Ack(LDS, expect=[]),
        Sync(LDS, "SYNCED", acked=3)],
    "a reconnecting proxy's version_info counts as acked": [
        Ask(CDS, version_info="v-before", expect=["CDS: a b"]),
        Sync(CDS, "STALE", acked="v-before")],
    "a push of routes sends only the changed ones (not LDS/CDS: the protocol's grouping)": [
        Ask(RDS, ("r1", "r2"), expect=["RDS: r1 r2"]),
        Ack(RDS),
        Push({**BASE, "routes": {"r1": "a", "r2": "a"}}, expect=["RDS: r2"]),
        Ack(RDS),
        Sync(RDS, "SYNCED", acked=2),
        Push({**BASE, "routes": {"r1": "b", "r2": "a"}}, expect=["RDS: r1"])],
    "a push of endpoints sends only the changed ones": [
        Ask(EDS, ("a", "b", "c"), expect=["EDS: a b"]),
        Ack(EDS),
        Push(CHANGED_B, expect=["EDS: b c"])],
    "a push that removes a route sends the whole set": [
        Ask(RDS, ("r1", "r2"), expect=["RDS: r1 r2"]),
        Ack(RDS),
        Push({**BASE, "routes": {"r1": "a"}}, expect=["RDS: r1"])],
    "after a NACK the next push sends the whole set": [
        Ask(RDS, ("r1", "r2"), expect=["RDS: r1 r2"]),
        Ack(RDS),
        Push({**BASE, "routes": {"r1": "a", "r2": "a"}}, expect=["RDS: r2"]),
        Nack(RDS, "r2: rejected", expect=[]),
        Push({**BASE, "routes": {"r1": "b", "r2": "a"}}, expect=["RDS: r1 r2"])],
    "after a stale NACK too (the response it rejected was built on)": [
        Ask(RDS, ("r1", "r2"), expect=["RDS: r1 r2"]),
        Push({**BASE, "routes": {"r1": "a", "r2": "a"}}, expect=["RDS: r2"]),
        Push({**BASE, "routes": {"r1": "b", "r2": "a"}}, expect=["RDS: r1"]),
        Nack(RDS, "r2: rejected", back=2, expect=[]),
        Push({**BASE, "routes": {"r1": "b", "r2": "b"}}, expect=["RDS: r1 r2"])],
    "pushes are make-before-break: CDS, EDS, ECDS, LDS, RDS": [
        Ask(LDS, expect=["LDS: l1 l2"]), Ack(LDS),
        Ask(RDS, ("r1",), expect=["RDS: r1"]), Ack(RDS),
        Ask(ECDS, ("x1",), expect=["ECDS: x1"]), Ack(ECDS),
        Ask(CDS, expect=["CDS: a b"]), Ack(CDS),
        Ask(EDS, ("a", "b", "c"), expect=["EDS: a b"]), Ack(EDS),
        Push(EVERY_TYPE_CHANGED, expect=["CDS: a b c", "EDS: a b c", "ECDS: x1", "LDS: l1 l9", "RDS: r1"])],
}

DELTA = {
    "CDS with no names is wildcard": [
        Sub(CDS, expect=["CDS: a b"])],
    "named: the names asked, those that do not exist said to be absent": [
        Sub(EDS, ("a", "nope"), expect=["EDS: a -nope"])],
    "only changed resources are sent, removal by removed_resources": [
        Sub(CDS, expect=["CDS: a b"]),
        Ack(CDS),
        Push(CHANGED_B, expect=["CDS: b c"]),
        Ack(CDS),
        Push({**BASE, "clusters": {"a": 1001, "c": 1003}}, expect=["CDS: -b"]),
        Ack(CDS),
        Sync(CDS, "SYNCED", acked=3)],
    "ACK sends nothing; subscribe more and unsubscribe": [
        Sub(EDS, ("a",), expect=["EDS: a"]),
        Ack(EDS, expect=[]),
        Sub(EDS, ("b",), unsub=("a",), expect=["EDS: b"]),
        Ack(EDS),
        Push({**BASE, "clusters": {"a": 5, "b": 1002}}, expect=[])],   # only the unsubscribed one changed
    "subscribing to '*' sends what was not held": [
        Sub(EDS, ("a",), expect=["EDS: a"]),
        Ack(EDS),
        Sub(EDS, ("*",), expect=["EDS: b"]),
        Ack(EDS),
        Push(CHANGED_B, expect=["EDS: b c"])],
    "unsubscribing from '*' leaves the names": [
        Sub(CDS, expect=["CDS: a b"]),
        Ack(CDS),
        Sub(CDS, ("a",), unsub=("*",), expect=["CDS: -b"]),
        Ack(CDS),
        Push(CHANGED_B, expect=[])],
    "reconnect: initial_resource_versions, only what differs is sent": [
        Sub(CDS, initial={**VERSIONS[CDS], "gone": "0123"}, expect=["CDS: -gone"]),
        Ack(CDS),
        Push(CHANGED_B, expect=["CDS: b c"])],
    "reconnect holding everything: an empty response, then only changes": [
        Sub(CDS, initial=VERSIONS[CDS], expect=["CDS:"]),
        Ack(CDS),
        Push(ONLY_A, expect=["CDS: -b"])],
    "NACK restores what the client holds; the next push re-sends it": [
        Sub(CDS, expect=["CDS: a b"]),
        Ack(CDS),
        Push({**BASE, "clusters": {"a": 7, "b": 1002}}, expect=["CDS: a"]),
        Nack(CDS, "a: rejected", expect=[]),
        Sync(CDS, "NACKED", acked=1, nacked=2, error="a: rejected"),
        Push({**BASE, "clusters": {"a": 7, "b": 8}}, expect=["CDS: a b"]),
        Ack(CDS),
        Sync(CDS, "SYNCED", acked=3)],
    "pushes are make-before-break: CDS, EDS, ECDS, LDS, RDS": [
        Sub(LDS, expect=["LDS: l1 l2"]), Ack(LDS),
        Sub(RDS, ("r1",), expect=["RDS: r1"]), Ack(RDS),
        Sub(ECDS, ("x1",), expect=["ECDS: x1"]), Ack(ECDS),
        Sub(CDS, expect=["CDS: a b"]), Ack(CDS),
        Sub(EDS, ("a", "b"), expect=["EDS: a b"]), Ack(EDS),
        Push(EVERY_TYPE_CHANGED, expect=["CDS: a b c", "EDS: a b", "ECDS: x1", "LDS: l9 -l2", "RDS: r1"])],
}


@pytest.mark.parametrize("steps", SOTW.values(), ids=SOTW.keys())
def test_sotw(steps):
    play(Driver(delta=False), steps)


@pytest.mark.parametrize("steps", DELTA.values(), ids=DELTA.keys())
def test_delta(steps):
    play(Driver(delta=True), steps)


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
def test_nothing_before_a_config_then_everything_asked_for(delta):
    d = Driver(delta, config=None)
    assert (Sub(CDS) if delta else Ask(CDS)).run(d) == []     # not an empty CDS: that removes every cluster
    assert (Sub(EDS, ("a",)) if delta else Ask(EDS, ("a",))).run(d) == []
    assert d.stream.push(None) == []
    assert d.push(BASE) == ["CDS: a b", "EDS: a"]


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
def test_the_first_request_must_carry_node_id(delta):
    cls = discovery_pb2.DeltaDiscoveryRequest if delta else discovery_pb2.DiscoveryRequest
    d = Driver(delta)
    for req in (cls(type_url=CDS), cls(type_url=CDS, node=base_pb2.Node(cluster="gw"))):
        with pytest.raises(ValueError, match="node.id"):
            d.stream.hello(req)
    assert d.shared.tracker.nodes == {}
    assert d.stream.hello(cls(type_url=CDS, node=NODE)) is True
    assert d.stream.hello(cls(type_url=CDS)) is False       # later requests need not repeat it
    assert d.stream.node.id == NODE.id and d.stream.node.kind == "router"
    assert list(d.shared.tracker.nodes) == [NODE.id]


def test_sotw_response_bytes_shared_by_streams_nonce_new_per_stream():
    """Streams sending the same content send one serialized buffer (nonce included);
    the same content again on one stream gets a nonce of its own appended."""
    shared = Shared(SyncTracker(), Telemetry().metrics, nonce=counting_nonces())
    one, two = Driver(False, shared=shared), Driver(False, shared=shared)
    Ask(CDS).run(one)
    Ask(CDS).run(two)
    snap = one.snap
    sel = snap.selection(CDS, True, set(), ("*",))
    for d in (one, two):
        assert d.last(CDS) == discovery_pb2.DiscoveryResponse(
            version_info=sel.version, type_url=CDS, control_plane=CONTROL_PLANE,
            resources=[r.any for r in sel.resources], nonce="1")
    assert one.wire[0] is two.wire[0]                              # one buffer, serialized once
    assert (shared.bodies.misses, shared.bodies.hits) == (1, 1)
    # (two: the node's current stream) EDS, then a CDS change: the endpoints are resent unchanged (warming), same content.
    Ask(EDS, ("a", "b")).run(two)
    first = two.last(EDS).nonce
    Ask(EDS, ("a", "b")).run(two)                                  # ACK
    assert two.push({**BASE, "clusters": {"a": 1001, "b": 1002, "c": 1003}})[:2] == ["CDS: a b c", "EDS: a b"]
    again = two.last(EDS)
    assert again.nonce != first and again.nonce.startswith(first + ".")
    eds = [w for w in two.wire if discovery_pb2.DiscoveryResponse.FromString(w).type_url == EDS]
    assert eds[-1].startswith(eds[0]) and len(eds[-1]) > len(eds[0])   # the shared bytes + its own nonce
    # An ACK of the first EDS response is stale now; the resend's is its ACK.
    ack = dict(type_url=EDS, resource_names=["a", "b"], version_info=again.version_info)
    assert two.request(response_nonce=first, **ack) == []
    assert two.sync(EDS)["status"] != "SYNCED"
    assert two.request(response_nonce=again.nonce, **ack) == []
    assert two.sync(EDS)["status"] == "SYNCED"


def test_delta_response_bytes_removed_then_absent():
    d = Driver(True)
    assert Sub(EDS, ("a", "b", "zz", "nope")).run(d) == ["EDS: a b -nope -zz"]
    Ack(EDS).run(d)
    d.push(ONLY_A)
    want = d.snap.selection(EDS, False, {"a", "b", "zz", "nope"}, ())
    assert d.last(EDS) == discovery_pb2.DeltaDiscoveryResponse(
        system_version_info=want.version, type_url=EDS, control_plane=CONTROL_PLANE,
        removed_resources=["b"], nonce="2")
    first = d.sent[EDS][0]
    a = prepared(BASE).of_type(EDS)["a"]
    assert list(first.resources) == [discovery_pb2.Resource(name="a", version=a.version, resource=a.any),
                                     discovery_pb2.Resource(name="b", version=VERSIONS[EDS]["b"],
                                                            resource=prepared(BASE).of_type(EDS)["b"].any)]
    assert list(first.removed_resources) == ["nope", "zz"]


def test_delta_wildcard_subscribe_does_not_leak_into_a_stream_of_the_old_names():
    """Selections are memoized per snapshot by subscription key: a stream that turns to '*'
    must change its key, or the next stream asking for its old names is served everything."""
    shared = Shared(SyncTracker(), Telemetry().metrics)
    x, y = Driver(True, shared=shared), Driver(True, shared=shared)
    for d in (x, y):
        play(d, [Sub(EDS, ("a",), expect=["EDS: a"]), Ack(EDS)])
    play(x, [Sub(EDS, ("*",), expect=["EDS: b"]), Ack(EDS)])
    snap = prepared(CHANGED_B)
    assert x.push_snapshot(snap) == ["EDS: b c"]
    assert y.push_snapshot(snap) == []              # "a" did not change; b and c were never asked for


def test_push_order_puts_unknown_types_last_sorted():
    assert push_order({"type.googleapis.com/z.Z", LDS, "type.googleapis.com/a.A", CDS, T.SECRET}) == [
        CDS, LDS, T.SECRET, "type.googleapis.com/a.A", "type.googleapis.com/z.Z"]


def test_nonces_are_unique_per_stream_and_shared_with_the_content():
    """A nonce names a response on its stream (xDS); streams sent the same content
    share its bytes, nonce included (no per-stream copy of a 5 MB body)."""
    shared = Shared(SyncTracker(), Telemetry().metrics)
    drivers = [Driver(delta, shared=shared) for delta in (False, True, False)]
    for d in drivers:
        for t in (CDS, LDS):
            (Sub(t) if d.delta else Ask(t)).run(d)
    per_stream = [[r.nonce for sent in d.sent.values() for r in sent] for d in drivers]
    assert all(len(set(n)) == len(n) == 2 for n in per_stream)
    assert per_stream[0] == per_stream[2] and not set(per_stream[0]) & set(per_stream[1])


def metric(text: str, name: str, **labels) -> float:
    for line in text.splitlines():
        m = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            return float(m.group(2))
    return 0.0


def test_metrics_go_to_the_injected_telemetry():
    d = Driver(delta=False)
    play(d, [Ask(CDS, expect=["CDS: a b"]), Ack(CDS), Push(ONLY_A, expect=["CDS: a"]), Nack(CDS, "no")])
    text = d.telemetry.prometheus_text().decode()
    assert metric(text, "xds_pushes_total", type="CDS", protocol="sotw") == 2
    assert metric(text, "xds_pushed_resources_total", type="CDS", protocol="sotw") == 3
    assert metric(text, "xds_push_bytes_total", type="CDS", protocol="sotw") == sum(map(len, d.wire))
    assert metric(text, "xds_nacks_total", type="CDS", protocol="sotw") == 1
    assert metric(text, "xds_connected_proxies", protocol="sotw") == 1
    d.stream.close()
    assert metric(d.telemetry.prometheus_text().decode(), "xds_connected_proxies", protocol="sotw") == 0
    assert d.shared.tracker.nodes == {}


def test_a_closed_stream_leaves_the_newer_stream_of_its_node():
    shared = Shared(SyncTracker(), Telemetry().metrics)
    old, new = Driver(False, shared=shared), Driver(False, shared=shared)
    Ask(CDS).run(old)
    Ask(CDS).run(new)
    old.stream.close()
    assert shared.tracker.nodes[NODE.id].stream == new.stream.sync_id


def test_runner_over_typed_events_without_grpc():
    """ads.StreamRunner on an async iterator of requests: Request, Push and End events, in order."""
    async def body():
        cache = SnapshotCache(lambda config, node: resources(config))
        cache.install(BASE, "g1", {})
        telemetry = Telemetry()
        hub = AdsHub(cache, telemetry)
        requests: asyncio.Queue = asyncio.Queue()

        async def client():            # the wire, as gRPC hands it over (parsed by the runner in turn)
            while (req := await requests.get()) is not None:
                yield req.SerializeToString()
        out = StreamRunner(hub, SotwStream(hub.shared), "test-peer").run(client())
        requests.put_nowait(discovery_pb2.DiscoveryRequest(node=NODE, type_url=CDS))
        r1 = discovery_pb2.DiscoveryResponse.FromString(await anext(out))
        assert r1.type_url == CDS and len(r1.resources) == 2 and hub.nodes()[0].id == NODE.id
        requests.put_nowait(discovery_pb2.DiscoveryRequest(type_url=CDS, version_info=r1.version_info,
                                                           response_nonce=r1.nonce))
        pending = asyncio.ensure_future(anext(out))     # the runner handles the ACK (sends nothing)
        while hub.tracker.syncz()[0]["types"]["CDS"]["status"] != "SYNCED":
            await asyncio.sleep(0.01)
        cache.install(ONLY_A, "g2", {})
        hub.notify_all()
        r2 = discovery_pb2.DiscoveryResponse.FromString(await pending)
        assert len(r2.resources) == 1 and r2.nonce != r1.nonce
        assert [s["attributes"]["xds.trigger"] for s in telemetry.recent_spans("xds.push")] == ["request", "config"]
        requests.put_nowait(None)                 # the client closes its side
        with pytest.raises(StopAsyncIteration):
            await anext(out)
        assert hub.streams == set() and hub.tracker.nodes == {}
    asyncio.run(asyncio.wait_for(body(), 10))


def test_push_spans_are_capped_per_second():
    """ads.RateLimit, which caps xds.push spans: a burst of `rate`, then `rate` a second."""
    from mcp26.xds.ads import RateLimit
    now = [100.0]
    limit = RateLimit(200, clock=lambda: now[0])
    assert sum(limit.take() for _ in range(1000)) == 200
    now[0] += 0.5
    assert sum(limit.take() for _ in range(1000)) == 100
    now[0] += 60
    assert sum(limit.take() for _ in range(1000)) == 200       # never more than a burst


def test_requests_waiting_behind_a_blocked_writer_are_bounded():
    """A client that keeps sending while nothing is read from its stream (the writer blocked on
    a zero window): the reader stops taking requests from gRPC past REQUEST_QUEUE_BYTES, so
    gRPC's flow control holds the client back (the queue held 200 MB of requests)."""
    from mcp26.xds import ads

    async def body():
        cache = SnapshotCache(lambda config, node: resources(config))
        cache.install(BASE, "g1", {})
        hub = AdsHub(cache, Telemetry())
        pulled = 0
        wire = discovery_pb2.DiscoveryRequest(node=NODE, type_url=CDS, resource_names=["x" * 100] * 1000)
        wire = wire.SerializeToString()

        async def client():            # 100 MB of requests, as fast as the runner takes them
            nonlocal pulled
            for _ in range(1000):
                pulled += 1
                yield wire
        runner = StreamRunner(hub, SotwStream(hub.shared), "test-peer")
        out = runner.run(client())
        first = asyncio.ensure_future(anext(out))      # the writer takes one response, then blocks
        await first
        for _ in range(50):
            await asyncio.sleep(0)
        stopped_at = pulled
        for _ in range(50):
            await asyncio.sleep(0)
        assert pulled == stopped_at < 100, f"{pulled} requests pulled"
        assert runner.request_bytes <= ads.REQUEST_QUEUE_BYTES + len(wire)
        rest = asyncio.ensure_future(anext(out))       # the writer goes on: so does the reader
        for _ in range(50):
            await asyncio.sleep(0)
        assert pulled > stopped_at
        rest.cancel()
        await out.aclose()
    asyncio.run(asyncio.wait_for(body(), 20))
