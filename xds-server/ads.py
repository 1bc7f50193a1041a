"""The ADS service: StreamAggregatedResources (SotW) and DeltaAggregatedResources.

grpc.aio rather than the sync server: a sync server holds a thread per
stream (two, to read requests while a push is written), so 100 proxies cost
200 threads fighting over the GIL. Here every stream is a coroutine on one
event loop, woken by its own queue; requests and pushes of one stream are
handled in order, so per-stream state needs no locks.

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

import asyncio
import collections
import hashlib
import itertools
import logging
import time
from dataclasses import dataclass, field

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

from xds_server import telemetry
from xds_server.cache import (WILDCARD_TYPES, PreparedSnapshot, Selection, SnapshotCache, translation_key,
                              subscription_key)
from xds_server.sync import SyncTracker, short_name
from xds_server.type_urls import PUSH_ORDER
from xds_server.node import ProxyNode

log = logging.getLogger("xds_server.ads")

CONTROL_PLANE = base_pb2.ControlPlane(identifier="mcp-mesh-xds")
_PUSH = object()   # queue event: the snapshot changed
_EOF = object()    # queue event: the client closed its side


def push_order(type_urls) -> list[str]:
    """PUSH_ORDER first (CDS, EDS, ECDS, LDS, RDS, SDS), then any other type a stream asked for."""
    known = [u for u in PUSH_ORDER if u in type_urls]
    return known + sorted(u for u in type_urls if u not in PUSH_ORDER)


class ResponseBodies:
    """Serialized responses without their nonce, shared by every stream that sends the same content.

    A response is built and serialized once per content (100 gateways at one
    version share one 5 MB EDS body); each stream appends its own nonce field,
    which protobuf parses as a merge of the two. Bounded by total bytes, LRU.
    """

    def __init__(self, max_bytes: int = 256 << 20):
        self.max_bytes = max_bytes
        self.size = 0
        self._bodies: collections.OrderedDict[tuple, bytes] = collections.OrderedDict()
        self.hits = self.misses = 0

    def get(self, key: tuple, build) -> bytes:
        body = self._bodies.get(key)
        if body is not None:
            self._bodies.move_to_end(key)
            self.hits += 1
            return body
        self.misses += 1
        body = build().SerializeToString()
        self._bodies[key] = body
        self.size += len(body)
        while self.size > self.max_bytes and len(self._bodies) > 1:
            _, old = self._bodies.popitem(last=False)
            self.size -= len(old)
        return body


class AdsHub:
    """What every stream shares: the snapshot cache, the sync tracker, the open streams."""

    def __init__(self, cache: SnapshotCache, tracker: SyncTracker | None = None):
        self.cache = cache
        self.tracker = tracker or SyncTracker()
        self.streams: set["_Stream"] = set()
        self.bodies = ResponseBodies()
        self._nonces = itertools.count(1)
        self._translating: dict[tuple, asyncio.Future] = {}

    def nonce(self) -> str:
        return str(next(self._nonces))

    async def snapshot(self, node: ProxyNode) -> PreparedSnapshot | None:
        """The node's snapshot; a new shape is translated in a worker thread, once,
        however many of its proxies connect meanwhile (the loop keeps serving)."""
        snap = self.cache.peek(node)
        if snap is not None or not self.cache.ready:
            return snap
        key = (translation_key(node), self.cache.generation)
        task = self._translating.get(key)
        if task is None:
            task = self._translating[key] = asyncio.ensure_future(
                asyncio.to_thread(self.cache.prepare_current, node))
            task.add_done_callback(lambda _: self._translating.pop(key, None))
        try:
            generation, snap = await asyncio.shield(task)
        except Exception:  # this shape fails to translate: its proxies get nothing new
            log.exception("translating for %s failed", node.id)
            return None
        self.cache.offer(node, generation, snap)
        return self.cache.peek(node) or snap

    def nodes(self) -> list[ProxyNode]:
        return [s.node for s in self.streams if s.node is not None]

    def subscriptions(self) -> list[tuple]:
        """One (shape, type URL, wildcard, names, key, held) per distinct subscription
        (names copied: they are read in a worker thread while streams run)."""
        out, seen = [], set()
        for s in self.streams:
            if s.node is None:
                continue
            shape = translation_key(s.node)
            for type_url, st in s.types.items():
                held = st.held
                k = (shape, type_url, st.sub_key, held.version if held is not None else None)
                if k not in seen:
                    seen.add(k)
                    out.append((shape, type_url, st.wildcard, frozenset(st.names), st.sub_key, held))
        return out

    def notify_all(self) -> None:
        for s in list(self.streams):
            s.queue.put_nowait(_PUSH)


@dataclass
class _TypeState:
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


class _Stream:
    protocol = ""

    def __init__(self, hub: AdsHub, peer: str):
        self.hub = hub
        self.peer = peer
        self.queue: asyncio.Queue = asyncio.Queue()
        self.node: ProxyNode | None = None
        self.types: dict[str, _TypeState] = {}
        self.sync_id = 0

    async def run(self, request_iterator):
        reader = asyncio.create_task(self._read(request_iterator))
        self.hub.streams.add(self)
        try:
            while True:
                event = await self.queue.get()
                if event is _EOF:
                    return
                if isinstance(event, BaseException):
                    raise event
                started = time.time_ns()
                if event is _PUSH:
                    if self.node is None:
                        continue
                    trigger = "config"
                    responses = self._push_all(await self.hub.snapshot(self.node))
                else:
                    self._hello(event)
                    trigger = "request"
                    responses = self._on_request(event, await self.hub.snapshot(self.node))
                if responses:   # a span only for what sent something (not for every ACK)
                    telemetry.tracer().start_span("xds.push", start_time=started, attributes={
                        "xds.node": self.node.id, "xds.protocol": self.protocol, "xds.trigger": trigger,
                        "xds.responses": len(responses), "xds.bytes": sum(len(r) for r in responses),
                    }).end()
                for resp in responses:
                    yield resp
        finally:
            reader.cancel()
            self.hub.streams.discard(self)
            if self.node is not None:
                self.hub.tracker.disconnect(self.node.id, self.sync_id)
                telemetry.metrics().connected.add(-1, {"protocol": self.protocol})
                log.info("%s stream closed: %s", self.protocol, self.node.id)

    async def _read(self, request_iterator) -> None:
        try:
            async for req in request_iterator:
                self.queue.put_nowait(req)
            self.queue.put_nowait(_EOF)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the client went away mid-read
            self.queue.put_nowait(_EOF)
            log.debug("%s read ended: %s", self.protocol, e)

    def _hello(self, req) -> None:
        if self.node is None:
            if not req.HasField("node") or not req.node.id:
                raise ValueError("the first request of a stream must carry node.id")
            self.node = ProxyNode.from_proto(req.node)
            self.sync_id = self.hub.tracker.connect(self.node.id, self.node.cluster, self.protocol)
            telemetry.metrics().connected.add(1, {"protocol": self.protocol})
            log.info("%s stream from %s (%s, %s)", self.protocol, self.node.id, self.node.kind, self.peer)

    def _push_all(self, snap: PreparedSnapshot | None) -> list:
        if snap is None:
            return []
        out = []
        for type_url in push_order(self.types):
            resp = self._respond(type_url, snap, force=False)
            if resp is not None:
                out.append(resp)
        return out

    # Implemented by each protocol.
    def _on_request(self, req, snap: PreparedSnapshot | None) -> list:
        raise NotImplementedError

    def _respond(self, type_url: str, snap: PreparedSnapshot, force: bool):
        raise NotImplementedError

    def _count(self, type_url: str, wire: bytes, n: int) -> None:
        m = telemetry.metrics()
        attrs = {"type": short_name(type_url), "protocol": self.protocol}
        m.pushes.add(1, attrs)
        m.push_resources.add(n, attrs)
        m.push_bytes.add(len(wire), attrs)


class SotwStream(_Stream):
    protocol = "sotw"

    def _on_request(self, req: discovery_pb2.DiscoveryRequest, snap: PreparedSnapshot | None) -> list:
        type_url = req.type_url
        names = set(req.resource_names)
        wildcard = "*" in names or (type_url in WILDCARD_TYPES and not names)
        names.discard("*")
        st = self.types.get(type_url)
        tracker = self.hub.tracker
        if st is None:
            st = self.types[type_url] = _TypeState(names=names, wildcard=wildcard)
            st.subscription_changed()
            if req.version_info:   # a reconnecting proxy says what it already runs
                tracker.ack(self.node.id, self.sync_id, type_url, req.version_info, "")
        else:
            if req.response_nonce != st.sent_nonce:
                return []          # stale: answers a response superseded since
            if req.HasField("error_detail"):
                tracker.nack(self.node.id, self.sync_id, type_url, st.sent_version,
                             req.response_nonce, req.error_detail.message)
                telemetry.metrics().nacks.add(1, {"type": short_name(type_url), "protocol": self.protocol})
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

    def _respond(self, type_url: str, snap: PreparedSnapshot, force: bool):
        st = self.types[type_url]
        if not st.wildcard and not st.names:
            return None            # subscribed to nothing (e.g. EDS before any cluster)
        sel = snap.selection(type_url, st.wildcard, st.names, st.sub_key)
        resources, version = sel.resources, sel.version
        if version == st.sent_version and not force:
            return None
        nonce = self.hub.nonce()
        body = self.hub.bodies.get(("sotw", type_url, version), lambda: discovery_pb2.DiscoveryResponse(
            version_info=version, type_url=type_url, control_plane=CONTROL_PLANE,
            resources=[r.any for r in resources]))
        wire = body + discovery_pb2.DiscoveryResponse(nonce=nonce).SerializeToString()
        st.sent_version, st.sent_nonce = version, nonce
        self.hub.tracker.sent(self.node.id, self.sync_id, type_url, version, nonce, len(resources))
        self._count(type_url, wire, len(resources))
        return wire


class DeltaStream(_Stream):
    protocol = "delta"

    def _on_request(self, req: discovery_pb2.DeltaDiscoveryRequest, snap: PreparedSnapshot | None) -> list:
        type_url = req.type_url
        tracker = self.hub.tracker
        st = self.types.get(type_url)
        first = st is None
        if first:
            st = self.types[type_url] = _TypeState(
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
                telemetry.metrics().nacks.add(1, {"type": short_name(type_url), "protocol": self.protocol})
                log.warning("NACK from %s for %s (delta): %s", self.node.id, short_name(type_url),
                            req.error_detail.message)
            elif before is not None:
                tracker.ack(self.node.id, self.sync_id, type_url, version_sent, req.response_nonce)
        new_names = set()
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
        if not (first or new_names or req.resource_names_unsubscribe):
            return []
        st.subscription_changed()
        if snap is None:
            return []
        resp = self._respond(type_url, snap, force=first, absent=new_names)
        return [resp] if resp is not None else []

    def _respond(self, type_url: str, snap: PreparedSnapshot, force: bool, absent=()):
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
        nonce = self.hub.nonce()
        body = self.hub.bodies.get(
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
        self.hub.tracker.sent(self.node.id, self.sync_id, type_url, version, nonce, len(want.resources))
        self._count(type_url, wire, len(changed))
        return wire


class AdsServicer(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    """Yields serialized responses (bytes); `add_to_server` registers it with a pass-through serializer."""

    def __init__(self, hub: AdsHub):
        self.hub = hub

    async def StreamAggregatedResources(self, request_iterator, context):
        async for resp in SotwStream(self.hub, context.peer()).run(request_iterator):
            yield resp

    async def DeltaAggregatedResources(self, request_iterator, context):
        async for resp in DeltaStream(self.hub, context.peer()).run(request_iterator):
            yield resp


def _passthrough(wire: bytes) -> bytes:
    return wire


def add_to_server(hub: AdsHub, server) -> None:
    """Register ADS on a grpc.aio server; the method names are Envoy's, the wire is protobuf."""
    servicer = AdsServicer(hub)
    handlers = {
        "StreamAggregatedResources": grpc.stream_stream_rpc_method_handler(
            servicer.StreamAggregatedResources,
            request_deserializer=discovery_pb2.DiscoveryRequest.FromString,
            response_serializer=_passthrough),
        "DeltaAggregatedResources": grpc.stream_stream_rpc_method_handler(
            servicer.DeltaAggregatedResources,
            request_deserializer=discovery_pb2.DeltaDiscoveryRequest.FromString,
            response_serializer=_passthrough),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "envoy.service.discovery.v3.AggregatedDiscoveryService", handlers),))
