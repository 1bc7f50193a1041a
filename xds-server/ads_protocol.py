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
- SotW responses carry the whole set asked for (omission = removal);
  Delta responses carry changed resources and removed_resources;
- pushes after a config change go out in make-before-break order (PUSH_ORDER).
"""
from __future__ import annotations

import hashlib
import itertools
import logging
from dataclasses import dataclass, field
from typing import Callable

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from xds_server.cache import WILDCARD_TYPES, PreparedSnapshot, Selection, subscription_key
from xds_server.node import ProxyNode
from xds_server.response_bodies import ResponseBodies
from xds_server.sync import SyncTracker, short_name
from xds_server.telemetry import Metrics
from xds_server.type_urls import PUSH_ORDER

log = logging.getLogger("xds_server.ads")   # one logger for ADS, as before the split

CONTROL_PLANE = base_pb2.ControlPlane(identifier="mcp-mesh-xds")


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


@dataclass
class TypeState:
    """One type URL on one stream: the subscription and what was sent.

    The hub reads `wildcard`, `names`, `sub_key` and `held` to pre-build the
    selections and diffs the next push will ask for.
    """
    names: set[str] = field(default_factory=set)
    wildcard: bool = False
    sub_key: tuple = ()
    sent_version: str = ""
    sent_nonce: str = ""
    # Delta only: what the client holds (name -> version) and, per nonce in
    # flight, what it held before, to restore on NACK. After a push the client
    # holds exactly a Selection (`held`), whose read-only dict `client` then
    # is; anything that changes the client's holdings otherwise copies it
    # first and drops `held`, so the next diff is computed the long way.
    client: dict[str, str] = field(default_factory=dict)
    held: Selection | None = None
    pending: dict[str, tuple[str, dict[str, str | None]]] = field(default_factory=dict)

    def subscription_changed(self) -> None:
        self.sub_key = subscription_key(self.wildcard, self.names)

    def own_client(self) -> dict[str, str]:
        if self.held is not None:
            self.client, self.held = dict(self.client), None
        return self.client


class Stream:
    """Per stream: the node (from the first request) and a TypeState per type URL asked for."""
    protocol = ""

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
        return out

    def _respond(self, type_url: str, snap: PreparedSnapshot, force: bool) -> bytes | None:
        raise NotImplementedError

    def _nacked(self, type_url: str) -> None:
        self.shared.metrics.nacks.add(1, {"type": short_name(type_url), "protocol": self.protocol})

    def _count(self, type_url: str, wire: bytes, n: int) -> None:
        m = self.shared.metrics
        attrs = {"type": short_name(type_url), "protocol": self.protocol}
        m.pushes.add(1, attrs)
        m.push_resources.add(n, attrs)
        m.push_bytes.add(len(wire), attrs)


class SotwStream(Stream):
    protocol = "sotw"

    def on_request(self, req: discovery_pb2.DiscoveryRequest, snap: PreparedSnapshot | None) -> list[bytes]:
        type_url = req.type_url
        names = set(req.resource_names)
        wildcard = "*" in names or (type_url in WILDCARD_TYPES and not names)
        names.discard("*")
        st = self.types.get(type_url)
        tracker = self.shared.tracker
        if st is None:
            st = self.types[type_url] = TypeState(names=names, wildcard=wildcard)
            st.subscription_changed()
            if req.version_info:   # a reconnecting proxy says what it already runs
                tracker.ack(self.node.id, self.sync_id, type_url, req.version_info, "")
        else:
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
            st.subscription_changed()
        if snap is None:
            return []
        resp = self._respond(type_url, snap, force=True)
        return [resp] if resp is not None else []

    def _respond(self, type_url: str, snap: PreparedSnapshot, force: bool) -> bytes | None:
        st = self.types[type_url]
        if not st.wildcard and not st.names:
            return None            # subscribed to nothing (e.g. EDS before any cluster)
        sel = snap.selection(type_url, st.wildcard, st.names, st.sub_key)
        resources, version = sel.resources, sel.version
        if version == st.sent_version and not force:
            return None
        nonce = self.shared.nonce()
        body = self.shared.bodies.get(("sotw", type_url, version), lambda: discovery_pb2.DiscoveryResponse(
            version_info=version, type_url=type_url, control_plane=CONTROL_PLANE,
            resources=[r.any for r in resources]))
        wire = body + discovery_pb2.DiscoveryResponse(nonce=nonce).SerializeToString()
        st.sent_version, st.sent_nonce = version, nonce
        self.shared.tracker.sent(self.node.id, self.sync_id, type_url, version, nonce, len(resources))
        self._count(type_url, wire, len(resources))
        return wire


class DeltaStream(Stream):
    protocol = "delta"

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
            version_sent, before = st.pending.pop(req.response_nonce, ("", None))
            if before is not None and req.HasField("error_detail"):
                client = st.own_client()
                for name, version in before.items():   # the client kept what it had
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
        wildcard_before, new_names = st.wildcard, set()
        for name in req.resource_names_subscribe:
            if name == "*":
                st.wildcard = True
            elif name not in st.names:
                st.names.add(name)
                new_names.add(name)
        for name in req.resource_names_unsubscribe:
            if name == "*":
                st.wildcard = False
            else:
                st.names.discard(name)
                st.own_client().pop(name, None)   # the client dropped it; nothing to remove
        # Turning to "*" is a subscription change too: its key (what selections
        # are memoized by, for every stream) must change with it.
        if not (first or new_names or req.resource_names_unsubscribe or st.wildcard != wildcard_before):
            return []
        st.subscription_changed()
        if snap is None:
            return []
        resp = self._respond(type_url, snap, force=first, absent=new_names)
        return [resp] if resp is not None else []

    def _respond(self, type_url: str, snap: PreparedSnapshot, force: bool, absent=()) -> bytes | None:
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
            changed, removed = list(want.resources), []
            content = ("all",)
        else:                                     # after a reconnect, NACK or unsubscribe
            changed = [r for r in want.resources if st.client.get(r.name) != r.version]
            removed = sorted(n for n in st.client if n not in want.items)
            content = ("some", hashlib.sha256("\n".join(f"{r.name}\0{r.version}" for r in changed).encode()).digest())
        # A newly asked-for name that does not exist is said to be absent, so
        # the client need not wait out its initial fetch timeout.
        absent = sorted(n for n in absent if n not in want.items and n not in st.client)
        if not changed and not removed and not absent and not force:
            st.client, st.held = want.items, want
            return None
        removed = list(removed) + absent
        nonce = self.shared.nonce()
        body = self.shared.bodies.get(
            ("delta", type_url, version, *content, tuple(removed)),
            lambda: discovery_pb2.DeltaDiscoveryResponse(
                system_version_info=version, type_url=type_url, control_plane=CONTROL_PLANE,
                resources=[discovery_pb2.Resource(name=r.name, version=r.version, resource=r.any)
                           for r in changed],
                removed_resources=removed))
        wire = body + discovery_pb2.DeltaDiscoveryResponse(nonce=nonce).SerializeToString()
        st.pending[nonce] = (version, {n: st.client.get(n) for n in [r.name for r in changed] + removed})
        st.client, st.held = want.items, want     # the client now holds exactly `want`
        st.sent_version, st.sent_nonce = version, nonce
        self.shared.tracker.sent(self.node.id, self.sync_id, type_url, version, nonce, len(want.resources))
        self._count(type_url, wire, len(changed))
        return wire
