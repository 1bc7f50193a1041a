"""The ADS protocol, sans-IO: one stream's state machine, a request in, serialized responses out.

No sockets, no event loop, no module state: a stream is fed each
DiscoveryRequest (SotW) or DeltaDiscoveryRequest (Delta) with the node's
current PreparedSnapshot, and `push(snapshot)` after a config change; it
returns the responses to write, as wire bytes. What streams of one server
share (nonce source, sync tracker, response bodies, metrics) is injected as
`Shared`. `ads.py` runs it over gRPC; tests feed it plain messages.

Protocol (envoyproxy.io "xDS REST and gRPC protocol"), per stream and type:
- a request whose response_nonce is not the last nonce sent is stale: ignored (SotW);
- same nonce and no error_detail: ACK of that version; error_detail set: NACK,
  recorded with its message, and the last ACKed version stays the node's version;
- LDS/CDS with no names (or "*") are wildcard; other types answer the names asked;
- SotW responses carry the whole set asked for, except a push of routes or
  endpoints (PARTIAL_SOTW_TYPES), which carries only what changed since the
  stream's last response of that type: the protocol groups every type but
  LDS and CDS as Delta does ("Grouping Resources into Responses": the client
  must not drop what a response leaves out), so Envoy does not parse a
  10,000-route RouteConfiguration again to take a change to another one. A
  push that removes a resource, a request, and the first push after a NACK
  still send the whole set;
  Delta responses carry changed resources and removed_resources;
- pushes after a config change go out in make-before-break order (PUSH_ORDER);
- a CDS response is followed by the subscribed endpoints of the clusters it
  changed, even unchanged (istiod's AlwaysRespond for EDS, envoy#13009): an
  updated cluster warms on a new EDS watch, and Envoy does not take the
  endpoints it already holds for it -- without them the cluster warms only
  when its initial fetch times out (15 s), while the old one keeps serving.
  (SotW: all of them when which clusters changed is not known, i.e. after
  the stream's first CDS response or a CDS or EDS NACK.)
"""
from __future__ import annotations

import hashlib
import itertools
import logging
import operator
import weakref
from dataclasses import dataclass, field
from typing import Callable

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from mcp26.xds.cache import WILDCARD_TYPES, PreparedSnapshot, Selection, subscription_key
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.response_bodies import ResponseBodies
from mcp26.xds.sync import SyncTracker, short_name
from mcp26.xds.telemetry import Metrics
from mcp26.xds.model.type_urls import CLUSTER, ENDPOINT, PUSH_ORDER, ROUTE

log = logging.getLogger("mcp26.xds.ads")   # one logger for ADS, as before the split

CONTROL_PLANE = base_pb2.ControlPlane(identifier="mcp-mesh-xds")
# A nonce field alone: field 5 in both DiscoveryResponse and DeltaDiscoveryResponse.
NONCE_FIELD = discovery_pb2.DiscoveryResponse
# SotW types a push sends only the changed resources of (see the module doc).
PARTIAL_SOTW_TYPES = frozenset({ROUTE, ENDPOINT})


def push_order(type_urls) -> list[str]:
    """PUSH_ORDER first (CDS, EDS, ECDS, LDS, RDS, SDS), then any other type a stream asked for."""
    known = [u for u in PUSH_ORDER if u in type_urls]
    return known + sorted(u for u in type_urls if u not in PUSH_ORDER)


def counting_nonces() -> Callable[[], str]:
    """Nonces "1", "2", ...: unique across a server's streams (a stale check compares them)."""
    numbers = itertools.count(1)
    return lambda: str(next(numbers))


@dataclass
class Shared:
    """What every stream of one server shares; the protocol reaches nothing else."""
    tracker: SyncTracker
    metrics: Metrics
    nonce: Callable[[], str] = field(default_factory=counting_nonces)
    bodies: ResponseBodies = field(default_factory=ResponseBodies)
    # How a shared body and a stream's own nonce field become its response (only
    # when the body's own nonce is not new to the stream): bytes here; the gRPC
    # glue (ads.add_to_server) defers the copy to the write itself.
    wire: Callable[[bytes, bytes], object] = operator.add
    # One frozenset per distinct name set, shared by every stream subscribed to it:
    # 100 proxies asking EDS for the same 3,000 clusters hold one set, not 100
    # sets of 3,000 freshly decoded strings (~0.35 MB a stream, measured).
    name_sets: weakref.WeakValueDictionary = field(default_factory=weakref.WeakValueDictionary)

    def intern_names(self, names) -> tuple[frozenset, tuple]:
        """(the shared frozenset equal to `names`, its subscription key for a named subscription)."""
        key = subscription_key(False, names)
        found = self.name_sets.get(key)
        if found is None:
            found = self.name_sets[key] = frozenset(names)
        return found, key


@dataclass
class TypeState:
    """One type URL on one stream: the subscription and what was sent.

    The hub reads `wildcard`, `names`, `sub_key` and `held` to pre-build the
    selections and diffs the next push will ask for.
    """
    names: frozenset[str] = frozenset()   # interned (Shared.intern_names): never mutated
    wildcard: bool = False
    sub_key: tuple = ()
    sent_version: str = ""
    sent_nonce: str = ""
    last_serial: int = 0                   # of the last shared body sent as is (Stream._wire)
    # SotW (PARTIAL_SOTW_TYPES only): `held` is the Selection last sent in full
    # or reached by the changes sent since; None: the next push sends all.
    # Delta: what the client holds (name -> version) and, per nonce in
    # flight, what it held before, to restore on NACK. After a push the client
    # holds exactly a Selection (`held`), whose read-only dict `client` then
    # is; anything that changes the client's holdings otherwise copies it
    # first and drops `held`, so the next diff is computed the long way.
    # A pending entry is (version, holdings before, names sent): the holdings
    # are a shared read-only dict when the client held a Selection, and the
    # names the (shared) resources sent and removed, so a stream in flight
    # costs references, not a dict per resource.
    client: dict[str, str] = field(default_factory=dict)
    held: Selection | None = None
    pending: dict[str, tuple[str, dict[str, str], tuple]] = field(default_factory=dict)

    def subscription_changed(self, shared: Shared) -> None:
        self.names, key = shared.intern_names(self.names)
        self.sub_key = ("*",) if self.wildcard else key

    def own_client(self) -> dict[str, str]:
        if self.held is not None:
            self.client, self.held = dict(self.client), None
        return self.client


class Stream:
    """Per stream: the node (from the first request) and a TypeState per type URL asked for."""
    protocol = ""
    request_type = None          # the message class of its requests (ads.py parses them in turn)

    def __init__(self, shared: Shared):
        self.shared = shared
        self.node: ProxyNode | None = None
        self.types: dict[str, TypeState] = {}
        self.sync_id = 0

    def hello(self, req) -> bool:
        """Read the node from the stream's first request (True then); every request may carry it."""
        if self.node is not None:
            return False
        if not req.HasField("node") or not req.node.id:
            raise ValueError("the first request of a stream must carry node.id")
        self.node = ProxyNode.from_proto(req.node)
        self.sync_id = self.shared.tracker.connect(self.node.id, self.node.cluster, self.protocol)
        self.shared.metrics.connected.add(1, {"protocol": self.protocol})
        return True

    def close(self) -> None:
        """The stream ended: its node is no longer connected (a newer stream of it may be)."""
        if self.node is not None:
            self.shared.tracker.disconnect(self.node.id, self.sync_id)
            self.shared.metrics.connected.add(-1, {"protocol": self.protocol})

    def on_request(self, req, snap: PreparedSnapshot | None) -> list[bytes]:
        """The responses a request (after `hello`) calls for; `snap` None: no config yet."""
        raise NotImplementedError

    def push(self, snap: PreparedSnapshot | None) -> list[bytes]:
        """After a config change: what changed for each type subscribed, make-before-break."""
        if snap is None:
            return []
        out = []
        for type_url in push_order(self.types):
            resp = self._respond(type_url, snap, force=False)
            if resp is not None:
                out.append(resp)
                out.extend(self._warm_endpoints(type_url, snap))
        return out

    def _respond(self, type_url: str, snap: PreparedSnapshot, force: bool) -> bytes | None:
        raise NotImplementedError

    def _warm_endpoints(self, type_url: str, snap: PreparedSnapshot) -> list[bytes]:
        """After a CDS response: the endpoints the clusters in it warm on (see the module doc)."""
        if type_url != CLUSTER or ENDPOINT not in self.types:
            return []
        resp = self._resend_endpoints(snap)
        return [resp] if resp is not None else []

    def _resend_endpoints(self, snap: PreparedSnapshot) -> bytes | None:
        raise NotImplementedError

    def _wire(self, st: "TypeState", key: tuple, build) -> tuple[object, str]:
        """The response for content `key` and its nonce.

        A nonce must be new on its stream and type (an ACK names the response it
        answers), not across streams. Stored bodies carry nonce str(serial),
        serials increasing: a stream whose last stored body had a lower serial
        has never sent this nonce, and sends the shared bytes as they are (no
        per-stream copy). Otherwise (the same content again, e.g. endpoints
        resent for a warming cluster) a nonce field of its own is appended, which
        protobuf's last-one-wins merge makes the nonce the client reads.
        """
        serial, wire = self.shared.bodies.get(key, build)
        if serial > st.last_serial:
            st.last_serial = serial
            return wire, str(serial)
        nonce = f"{serial}.{self.shared.nonce()}"
        return self.shared.wire(wire, NONCE_FIELD(nonce=nonce).SerializeToString()), nonce

    def _nacked(self, type_url: str) -> None:
        self.shared.metrics.nacks.add(1, {"type": short_name(type_url), "protocol": self.protocol})

    def _count(self, type_url: str, wire: bytes, n: int) -> None:
        self.shared.metrics.count_push(short_name(type_url), self.protocol, n, len(wire))


class SotwStream(Stream):
    protocol = "sotw"
    request_type = discovery_pb2.DiscoveryRequest

    def on_request(self, req: discovery_pb2.DiscoveryRequest, snap: PreparedSnapshot | None) -> list[bytes]:
        type_url = req.type_url
        names = set(req.resource_names)
        wildcard = "*" in names or (type_url in WILDCARD_TYPES and not names)
        names.discard("*")
        st = self.types.get(type_url)
        tracker = self.shared.tracker
        if st is None:
            st = self.types[type_url] = TypeState(names=names, wildcard=wildcard)
            st.subscription_changed(self.shared)
            if req.version_info:   # a reconnecting proxy says what it already runs
                tracker.ack(self.node.id, self.sync_id, type_url, req.version_info, "")
        else:
            if req.HasField("error_detail"):
                st.held = None     # what it kept is not known: the next push sends all
                if type_url == CLUSTER:
                    self._clusters_sent = None   # nor which clusters the next CDS response changes
            if req.response_nonce != st.sent_nonce:
                return []          # stale: answers a response superseded since
            if req.HasField("error_detail"):
                tracker.nack(self.node.id, self.sync_id, type_url, st.sent_version,
                             req.response_nonce, req.error_detail.message)
                self._nacked(type_url)
                log.warning("NACK from %s for %s version %s (keeps %s): %s", self.node.id,
                            short_name(type_url), st.sent_version, req.version_info or "nothing",
                            req.error_detail.message)
            else:
                tracker.ack(self.node.id, self.sync_id, type_url, req.version_info, req.response_nonce)
            if names == st.names and wildcard == st.wildcard:
                return []          # a plain ACK/NACK: nothing new to send
            st.names, st.wildcard = names, wildcard
            st.subscription_changed(self.shared)
        if snap is None:
            return []
        resp = self._respond(type_url, snap, force=True)
        return [resp, *self._warm_endpoints(type_url, snap)] if resp is not None else []

    _clusters_sent: Selection | None = None     # the clusters of the last CDS response
    _clusters_changed: frozenset | None = None  # the clusters it changed (None: not known)

    def _resend_endpoints(self, snap: PreparedSnapshot) -> bytes | None:
        # Only the clusters the CDS response changed warm; the others keep their endpoints.
        if self._clusters_changed is not None and not self._clusters_changed:
            return None            # no cluster warms: endpoint changes go out in their own push
        return self._respond(ENDPOINT, snap, force=True, warm=self._clusters_changed)

    def _respond(self, type_url: str, snap: PreparedSnapshot, force: bool,
                 warm: frozenset | None = None) -> bytes | None:
        """`warm`: endpoints resent for these clusters (with what else changed) rather than all."""
        st = self.types[type_url]
        if not st.wildcard and not st.names:
            return None            # subscribed to nothing (e.g. EDS before any cluster)
        sel = snap.selection(type_url, st.wildcard, st.names, st.sub_key)
        resources, version = sel.resources, sel.version
        if version == st.sent_version and not force:
            return None
        content = ("sotw", type_url, version)
        if (not force or warm is not None) and st.held is not None:   # a PARTIAL_SOTW_TYPES type
            changed, removed = snap.diff(st.held, sel)
            sent = {r.name for r in changed}
            again = [r for r in sel.resources if r.name in warm and r.name not in sent] if warm else []
            if (changed or again) and not removed:
                resources = list(changed) + again
                content = ("sotw-diff", type_url, st.held.version, version,
                           hashlib.sha256("\n".join(r.name for r in again).encode()).digest())
        wire, nonce = self._wire(st, content, lambda: discovery_pb2.DiscoveryResponse(
            version_info=version, type_url=type_url, control_plane=CONTROL_PLANE,
            resources=[r.any for r in resources]))
        st.sent_version, st.sent_nonce = version, nonce
        if type_url in PARTIAL_SOTW_TYPES:
            st.held = sel
        elif type_url == CLUSTER:
            before = self._clusters_sent
            self._clusters_changed = None if before is None else frozenset(r.name for r in snap.diff(before, sel)[0])
            self._clusters_sent = sel
        self.shared.tracker.sent(self.node.id, self.sync_id, type_url, version, nonce, len(sel.resources))
        self._count(type_url, wire, len(resources))
        return wire


class DeltaStream(Stream):
    protocol = "delta"
    request_type = discovery_pb2.DeltaDiscoveryRequest
    _clusters_sent: frozenset = frozenset()    # the clusters of the last CDS response

    def on_request(self, req: discovery_pb2.DeltaDiscoveryRequest, snap: PreparedSnapshot | None) -> list[bytes]:
        type_url = req.type_url
        tracker = self.shared.tracker
        st = self.types.get(type_url)
        first = st is None
        if first:
            st = self.types[type_url] = TypeState(
                wildcard=type_url in WILDCARD_TYPES and not req.resource_names_subscribe)
            # Reconnect: the client tells what it holds; unchanged resources are not resent.
            st.client = dict(req.initial_resource_versions)
        if req.response_nonce:
            version_sent, before, sent = st.pending.pop(req.response_nonce, ("", None, ()))
            if before is not None and req.HasField("error_detail"):
                client = st.own_client()
                for part in sent:                    # the client kept what it had
                    for r in part:
                        name = r if isinstance(r, str) else r.name
                        version = before.get(name)
                        if version is None:
                            client.pop(name, None)
                        else:
                            client[name] = version
                tracker.nack(self.node.id, self.sync_id, type_url, version_sent,
                             req.response_nonce, req.error_detail.message)
                self._nacked(type_url)
                log.warning("NACK from %s for %s (delta): %s", self.node.id, short_name(type_url),
                            req.error_detail.message)
            elif before is not None:
                tracker.ack(self.node.id, self.sync_id, type_url, version_sent, req.response_nonce)
        wildcard_before, new_names, dropped = st.wildcard, set(), set()
        for name in req.resource_names_subscribe:
            if name == "*":
                st.wildcard = True
            elif name not in st.names:
                new_names.add(name)
        for name in req.resource_names_unsubscribe:
            if name == "*":
                st.wildcard = False
            else:
                dropped.add(name)
                st.own_client().pop(name, None)   # the client dropped it; nothing to remove
        if new_names or dropped:
            st.names = (st.names | new_names) - dropped
        # Turning to "*" is a subscription change too: its key (what selections
        # are memoized by, for every stream) must change with it.
        if not (first or new_names or req.resource_names_unsubscribe or st.wildcard != wildcard_before):
            return []
        st.subscription_changed(self.shared)
        if snap is None:
            return []
        resp = self._respond(type_url, snap, force=first, absent=new_names)
        return [resp, *self._warm_endpoints(type_url, snap)] if resp is not None else []

    def _resend_endpoints(self, snap: PreparedSnapshot) -> bytes | None:
        # Only the clusters the CDS response carried warm; the others keep their endpoints.
        return self._respond(ENDPOINT, snap, force=False, resend=self._clusters_sent)

    def _respond(self, type_url: str, snap: PreparedSnapshot, force: bool, absent=(),
                 resend: frozenset = frozenset()) -> bytes | None:
        st = self.types[type_url]
        want = snap.selection(type_url, st.wildcard, st.names, st.sub_key)
        version = want.version
        # `content` names what is sent, so that streams sending the same share one body.
        if st.held is not None:
            if st.held is want and not force:
                return None                       # already holds exactly this
            changed, removed = snap.diff(st.held, want)
            content = ("diff", st.held.version)
        elif not st.client:                       # holds nothing yet: everything
            changed, removed = want.resources, ()   # shared, read-only
            content = ("all",)
        else:                                     # after a reconnect, NACK or unsubscribe
            changed = [r for r in want.resources if st.client.get(r.name) != r.version]
            removed = sorted(n for n in st.client if n not in want.items)
            content = ("some", hashlib.sha256("\n".join(f"{r.name}\0{r.version}" for r in changed).encode()).digest())
        if resend:
            sent = {c.name for c in changed}
            again = [r for r in want.resources if r.name in resend and r.name in st.client and r.name not in sent]
        else:
            again = []
        if again:                                 # held unchanged, sent again for a warming cluster
            changed = list(changed) + again
            content = (*content, "again", hashlib.sha256("\n".join(r.name for r in again).encode()).digest())
        # A newly asked-for name that does not exist is said to be absent, so
        # the client need not wait out its initial fetch timeout.
        absent = sorted(n for n in absent if n not in want.items and n not in st.client)
        if not changed and not removed and not absent and not force:
            st.client, st.held = want.items, want
            return None
        removed = list(removed) + absent
        wire, nonce = self._wire(
            st, ("delta", type_url, version, *content, tuple(removed)),
            lambda: discovery_pb2.DeltaDiscoveryResponse(
                system_version_info=version, type_url=type_url, control_plane=CONTROL_PLANE,
                resources=[discovery_pb2.Resource(name=r.name, version=r.version, resource=r.any)
                           for r in changed],
                removed_resources=removed))
        # What the client held before, to restore on NACK: the shared dict of the
        # Selection it held as it is, else a copy of only the names this touches.
        if st.held is not None:
            before = st.client
        else:
            before = {n: v for n in [r.name for r in changed] + removed
                      if (v := st.client.get(n)) is not None}
        st.pending[nonce] = (version, before, (changed, removed))
        if type_url == CLUSTER:
            self._clusters_sent = frozenset(r.name for r in changed)
        st.client, st.held = want.items, want     # the client now holds exactly `want`
        st.sent_version, st.sent_nonce = version, nonce
        self.shared.tracker.sent(self.node.id, self.sync_id, type_url, version, nonce, len(want.resources))
        self._count(type_url, wire, len(changed))
        return wire
