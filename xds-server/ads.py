"""The ADS service over gRPC: StreamAggregatedResources (SotW) and DeltaAggregatedResources.

The protocol itself (nonces, ACK/NACK, Delta holdings) is `ads_protocol`,
sans-IO; this module runs it: one coroutine per stream, the hub every
stream shares, and the gRPC registration.

grpc.aio rather than the sync server: a sync server holds a thread per
stream (two, to read requests while a push is written), so 100 proxies cost
200 threads fighting over the GIL. Here every stream is a coroutine on one
event loop, woken by its own queue; requests and pushes of one stream are
handled in order, so per-stream state needs no locks.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc
from google.protobuf.message import DecodeError

from mcp26.xds.ads_protocol import DeltaStream, Shared, SotwStream, Stream
from mcp26.xds.cache import PreparedSnapshot, SnapshotCache, translation_key
from mcp26.xds.write_budget import Trimmer, WriteBudget
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.sync import SyncTracker
from mcp26.xds.telemetry import Telemetry

log = logging.getLogger("mcp26.xds.ads")


# What a stream's queue carries, in the order they happened.
@dataclass(frozen=True)
class Push:
    """The snapshot changed: push what changed for this stream."""


@dataclass(frozen=True)
class Request:
    """The client sent a request: its wire bytes, parsed when its turn comes. A stream's
    requests wait behind its pushes, and while a fleet connects 2,000 EDS subscriptions of
    3,000 names wait at once: 0.15 MB each as bytes, 0.29 MB as a parsed message."""
    wire: bytes


@dataclass(frozen=True)
class End:
    """The client closed its side (or went away mid-read)."""


PUSH, END = Push(), End()


class BadRequest(Exception):
    """The client's request is not one this stream can take: the stream ends INVALID_ARGUMENT."""

PUSH_SPANS_PER_S = 200       # xds.push spans recorded at most (a burst of as many at once)
# Request bytes a stream may have waiting behind its pushes. Past it the stream's reader stops
# taking requests from gRPC, whose flow control then holds the client back: a client that
# sends while its stream's writer is blocked (a zero window) cannot grow the server (200 MB of
# DiscoveryRequests on one such stream were 387 MB here). A fleet's EDS subscriptions of 3,000
# names are 0.15 MB each. Each request counts REQUEST_OVERHEAD more than its bytes (the queued
# Request and its bytes object: ~120 bytes measured), so small ones are bounded by number too.
REQUEST_QUEUE_BYTES = 4 << 20
REQUEST_OVERHEAD = 128


class RateLimit:
    """A token bucket: `take()` is True at most `rate` times a second on average,
    `rate` times in a burst."""

    def __init__(self, rate: float, clock=time.monotonic):
        self.rate, self.clock = rate, clock
        self.tokens, self.at = float(rate), clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


class AdsHub:
    """What every stream shares: the snapshot cache, the protocol's shared state, the open streams."""

    def __init__(self, cache: SnapshotCache, telemetry: Telemetry, tracker: SyncTracker | None = None):
        self.cache = cache
        self.telemetry = telemetry
        self.tracker = tracker or SyncTracker()
        self.shared = Shared(self.tracker, telemetry.metrics)
        self.streams: set[StreamRunner] = set()
        self._translating: dict[tuple, asyncio.Future] = {}
        self.push_spans = RateLimit(PUSH_SPANS_PER_S)
        # Bytes in gRPC's hands at once, and the heap handed back after a burst (memory.py).
        self.writes = WriteBudget()
        self.trimmer = Trimmer(self.writes)
        # sds.IdentityService: lays each node's SDS secrets over its shape's snapshot.
        self.identity = None

    async def snapshot(self, node: ProxyNode) -> PreparedSnapshot | None:
        """The node's snapshot (its shape's, plus its own SDS secrets)."""
        snap = await self._shape_snapshot(node)
        if self.identity is not None and snap is not None:
            snap = self.identity.overlay(node, snap)   # cheap once issued (~1 ms to issue)
        return snap

    async def _shape_snapshot(self, node: ProxyNode) -> PreparedSnapshot | None:
        """A new translation key is translated in a worker thread, once,
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
        except Exception:  # this key fails to translate: its proxies get nothing new
            log.exception("translating for %s failed", node.id)
            return None
        self.cache.offer(node, generation, snap)
        self.trimmer.request()
        return self.cache.peek(node) or snap

    def nodes(self) -> list[ProxyNode]:
        return [r.stream.node for r in self.streams if r.stream.node is not None]

    def subscriptions(self) -> list[tuple]:
        """One (translation key, type URL, wildcard, names, sub key, held) per distinct
        subscription (names copied: they are read in a worker thread while streams run)."""
        out, seen = [], set()
        for r in self.streams:
            node = r.stream.node
            if node is None:
                continue
            key = translation_key(node)
            for type_url, st in r.stream.types.items():
                held = st.held
                k = (key, type_url, st.sub_key, held.version if held is not None else None)
                if k not in seen:
                    seen.add(k)
                    out.append((key, type_url, st.wildcard, frozenset(st.names), st.sub_key, held))
        return out

    def notify_all(self) -> None:
        """A new config is installed: every stream pushes what changed for it; the heap
        its translation (in a worker thread) freed is handed back once they have."""
        for r in list(self.streams):
            r.queue.put_nowait(PUSH)
        self.trimmer.request()

    def notify(self, node_ids) -> None:
        """Push to these nodes' streams only (their secrets changed)."""
        ids = set(node_ids)
        for r in list(self.streams):
            if r.stream.node is not None and r.stream.node.id in ids:
                r.queue.put_nowait(PUSH)


class StreamRunner:
    """Runs one stream's protocol: a reader task queues requests, pushes are queued
    by the hub, and this coroutine handles both in order, yielding wire bytes."""

    def __init__(self, hub: AdsHub, stream: Stream, peer: str, authenticate=None, metadata=()):
        self.hub = hub
        self.stream = stream
        self.peer = peer
        # kube_auth.StreamAuthenticator on the authenticated port: (node, metadata) -> node, or Refused
        self.authenticate, self.metadata = authenticate, metadata
        self.queue: asyncio.Queue[Push | Request | End] = asyncio.Queue()
        self.request_bytes = 0          # of the requests in `queue` (REQUEST_QUEUE_BYTES)
        self.room = asyncio.Event()     # set when request_bytes falls below the bound

    async def run(self, request_iterator):
        stream, protocol = self.stream, self.stream.protocol
        reader = asyncio.create_task(self._read(request_iterator))
        self.hub.streams.add(self)
        try:
            while True:
                event = await self.queue.get()
                started = time.time_ns()
                match event:
                    case End():
                        return
                    case Push():
                        if stream.node is None:
                            continue
                        trigger = "config"
                        responses = stream.push(await self.hub.snapshot(stream.node))
                    case Request(wire):
                        self.request_bytes -= len(wire) + REQUEST_OVERHEAD
                        if self.request_bytes < REQUEST_QUEUE_BYTES:
                            self.room.set()
                        try:
                            req = stream.request_type.FromString(wire)
                            hello = stream.hello(req)
                        except (DecodeError, ValueError) as e:     # not a request, or no node.id first
                            raise BadRequest(f"{stream.request_type.DESCRIPTOR.name}: {e}") from None
                        if hello and self.authenticate is not None:
                            stream.node = await self.authenticate(stream.node, self.metadata)
                        if hello:
                            log.info("%s stream from %s (%s, %s)", protocol, stream.node.id,
                                     stream.node.kind, self.peer)
                        trigger = "request"
                        responses = stream.on_request(req, await self.hub.snapshot(stream.node))
                        req = None       # not kept (with its names) until this stream's next event
                # A span only for what sent something (not for every ACK), and at most
                # PUSH_SPANS_PER_S of them: /debug/tracez keeps the last 500 anyway, and a
                # span is ~50 us of SDK work, 11 % of the loop when 1,000 proxies take a change.
                if responses and self.hub.push_spans.take():
                    self.hub.telemetry.tracer.start_span("xds.push", start_time=started, attributes={
                        "xds.node": stream.node.id, "xds.protocol": protocol, "xds.trigger": trigger,
                        "xds.responses": len(responses), "xds.bytes": sum(len(r) for r in responses),
                    }).end()
                # Popped, not iterated: a loop variable would keep the last response
                # (megabytes: a whole RDS or EDS) alive in this frame until the next event.
                while responses:
                    yield responses.pop(0)
        finally:
            reader.cancel()
            self.hub.streams.discard(self)
            stream.close()
            if stream.node is not None:
                log.info("%s stream closed: %s", protocol, stream.node.id)

    async def _read(self, request_iterator) -> None:
        try:
            async for wire in request_iterator:
                while self.request_bytes >= REQUEST_QUEUE_BYTES:
                    self.room.clear()
                    await self.room.wait()
                self.request_bytes += len(wire) + REQUEST_OVERHEAD
                self.queue.put_nowait(Request(wire))
            self.queue.put_nowait(END)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the client went away mid-read
            self.queue.put_nowait(END)
            log.debug("%s read ended: %s", self.stream.protocol, e)


async def _write_all(responses, context, budget: WriteBudget) -> None:
    """Write each response and let go of it once gRPC has taken it.

    Not a generator handler: grpc.aio's loop over a handler's generator keeps
    the last message it wrote bound until the next one comes, and so would an
    `async for` here; on an idle stream that is its last push, ~5 MB per
    proxy of the 1,000-service mesh (measured: 142 MB of 30 streams' RSS).
    """
    try:
        while True:
            try:
                await budget.write(context, await anext(responses))
            except StopAsyncIteration:
                return
    finally:   # cancelled mid-write: the stream still leaves the hub now, not at GC
        await responses.aclose()


class AdsServicer(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    """Writes serialized responses (bytes); `add_to_server` registers it with a pass-through serializer."""

    def __init__(self, hub: AdsHub, authenticate=None):
        self.hub = hub
        self.authenticate = authenticate

    async def StreamAggregatedResources(self, request_iterator, context):
        await self._serve(SotwStream(self.hub.shared), request_iterator, context)

    async def DeltaAggregatedResources(self, request_iterator, context):
        await self._serve(DeltaStream(self.hub.shared), request_iterator, context)

    async def _serve(self, stream: Stream, request_iterator, context) -> None:
        metadata = context.invocation_metadata() if self.authenticate is not None else ()
        runner = StreamRunner(self.hub, stream, context.peer(), self.authenticate, metadata)
        try:
            await _write_all(runner.run(request_iterator), context, self.hub.writes)
        except BadRequest as e:      # the client's fault: a status and a line, not a traceback
            log.warning("%s stream from %s refused: %s", stream.protocol, runner.peer, e)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except Exception as e:
            if type(e).__name__ != "Refused":       # kube_auth.Refused, not imported here: no kube without it
                raise
            await context.abort(getattr(grpc.StatusCode, e.code), str(e))


class Wire:
    """A response not yet joined: the shared body and this stream's own nonce field.

    Only for content a stream sends again (ads_protocol.Stream._wire; first
    sends are the shared bytes themselves). Joined (one copy of the body) by
    the serializer inside `context.write`, once the write budget has admitted
    it, so that streams waiting to resend a 5 MB body hold references, not copies.
    """
    __slots__ = ("body", "tail")

    def __init__(self, body: bytes, tail: bytes):
        self.body, self.tail = body, tail

    def __len__(self) -> int:
        return len(self.body) + len(self.tail)


def _join(wire) -> bytes:
    return wire.body + wire.tail if isinstance(wire, Wire) else wire


def add_to_server(hub: AdsHub, server, authenticate=None) -> None:
    """Register ADS on a grpc.aio server; the method names are Envoy's, the wire is protobuf.
    `authenticate`: each stream's node checked first (kube_auth.StreamAuthenticator)."""
    hub.shared.wire = Wire
    servicer = AdsServicer(hub, authenticate)
    handlers = {
        "StreamAggregatedResources": grpc.stream_stream_rpc_method_handler(
            servicer.StreamAggregatedResources,
            request_deserializer=None,          # bytes: parsed in turn (ads.Request)
            response_serializer=_join),
        "DeltaAggregatedResources": grpc.stream_stream_rpc_method_handler(
            servicer.DeltaAggregatedResources,
            request_deserializer=None,
            response_serializer=_join),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "envoy.service.discovery.v3.AggregatedDiscoveryService", handlers),))
