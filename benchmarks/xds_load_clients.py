"""ADS clients that subscribe and ACK as Envoy does: the xDS benchmarks' load.

    python -m benchmarks.xds_load_clients --address 127.0.0.1:18000 --clients 100 --mode delta
    python -m benchmarks.xds_load_clients --address ... --clients 500 --streams-per-channel 25 --report summary

Like Envoy: CDS and LDS wildcard, then EDS for every cluster and RDS for
every route config the listeners name; every response ACKed (SotW:
version_info + response_nonce; Delta: response_nonce). Node labels
istio=ingressgateway; `--shapes N` spreads the node clusters (part of the
control plane's translation key) over N shapes.

Cheap enough for thousands of streams on a few cores:
- `--streams-per-channel K`: K streams share one channel (one HTTP/2
  connection; grpc.aio multiplexes them). Default 1, as each Envoy has its
  own connection (bench_xds).
- responses are raw bytes parsed with "head" messages that declare only
  version, type URL, nonce and removed names: the resources (field 2) are
  unknown fields to them, kept as one C-side copy, never a Python object
  each. What a client needs from the resources (the names it follows with
  EDS/RDS, the count) is decoded once per distinct content and shared.
- `--report events` (default; bench_xds reads it): a JSON line per response.
  `--report summary`: a status line every 0.5 s ({"synced", "last", "eds"})
  and, once stdin closes, one line with each client's sync time and EDS
  receive times and this process's CPU seconds, so the benchmark can tell
  its own CPU from the control plane's.

A client is synced when it holds the full config: a response of each type,
and an EDS and RDS response carrying every name it subscribed to.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import sys
import time

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, struct_pb2

CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
ENDPOINT = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"
ROUTE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
SHORT = {CLUSTER: "CDS", ENDPOINT: "EDS", LISTENER: "LDS", ROUTE: "RDS"}
FOLLOW = {CLUSTER: ENDPOINT, LISTENER: ROUTE}
SERVICE = "/envoy.service.discovery.v3.AggregatedDiscoveryService/"


def _head_messages():
    T, L = descriptor_pb2.FieldDescriptorProto, descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="xds_bench_heads.proto", package="xdsbench", syntax="proto3")

    def msg(name, fields):
        m = fdp.message_type.add(name=name)
        for fname, number, ftype, repeated in fields:
            m.field.add(name=fname, number=number, type=ftype,
                        label=L.LABEL_REPEATED if repeated else L.LABEL_OPTIONAL)

    # No `resources` field: the heads skip them (kept as unknown bytes, in C).
    msg("SotwHead", [("version_info", 1, T.TYPE_STRING, False), ("type_url", 4, T.TYPE_STRING, False),
                     ("nonce", 5, T.TYPE_STRING, False)])
    msg("DeltaHead", [("system_version_info", 1, T.TYPE_STRING, False), ("type_url", 4, T.TYPE_STRING, False),
                      ("nonce", 5, T.TYPE_STRING, False), ("removed_resources", 6, T.TYPE_STRING, True)])
    msg("Resources", [("resources", 2, T.TYPE_BYTES, True)])                  # either response's field 2
    msg("ResourceHead", [("name", 3, T.TYPE_STRING, False), ("resource", 2, T.TYPE_BYTES, False)])  # delta Resource
    msg("AnyHead", [("value", 2, T.TYPE_BYTES, False)])                       # Any.value
    msg("NamedHead", [("name", 1, T.TYPE_STRING, False)])                     # Cluster.name / Listener.name
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"xdsbench.{m.name}"))
            for m in fdp.message_type}


HEADS = _head_messages()


def route_names(lis: listener_pb2.Listener) -> list[str]:
    out = []
    for chain in lis.filter_chains:
        for f in chain.filters:
            hcm = http_connection_manager_pb2.HttpConnectionManager()
            if f.typed_config.Unpack(hcm) and hcm.HasField("rds"):
                out.append(hcm.rds.route_config_name)
    return out


class Content:
    """What a client needs from a response's resources, decoded once per distinct
    content and shared by every client that receives it: the resource names, the
    names it follows (clusters -> EDS, listeners' RDS -> RDS)."""
    __slots__ = ("count", "names", "follow")

    def __init__(self, type_url: str, raw: bytes, delta: bool):
        names, follow = [], set()
        for r in HEADS["Resources"].FromString(raw).resources:
            if delta:
                res = HEADS["ResourceHead"].FromString(r)
                name, value = res.name, HEADS["AnyHead"].FromString(res.resource).value
            else:
                value = HEADS["AnyHead"].FromString(r).value
                name = None
            if type_url == CLUSTER:
                name = name or HEADS["NamedHead"].FromString(value).name
                follow.add(name)
            elif type_url == LISTENER:
                follow.update(route_names(listener_pb2.Listener.FromString(value)))
            names.append(name)
        self.count = len(names)
        self.names = frozenset(n for n in names if n is not None)
        self.follow = intern(frozenset(follow))


_contents: dict[tuple, Content] = {}
_interned: dict[frozenset, frozenset] = {}


def content(type_url: str, key: tuple, raw: bytes, delta: bool) -> Content:
    found = _contents.get(key)
    if found is None:
        found = _contents[key] = Content(type_url, raw, delta)
    return found


_sorted: dict[frozenset, list] = {}


def intern(names: frozenset) -> frozenset:
    return _interned.setdefault(names, names)


def sorted_names(names: frozenset) -> list:
    """The sorted list a SotW ACK repeats, once per distinct (interned) set."""
    found = _sorted.get(names)
    if found is None:
        found = _sorted[names] = sorted(names)
    return found


def node_id(i: int, prefix: str) -> str:
    """Client i's node id (what the control plane's /debug/syncz names it by)."""
    return f"router~127.0.0.{i % 250 + 1}~{prefix}-{i}.default~default.svc.cluster.local"


def node(i: int, prefix: str, labels: dict, shapes: int = 1) -> base_pb2.Node:
    """Client i's node; with `shapes` > 1 its cluster is one of that many (the
    cluster is part of the control plane's translation key: one snapshot per shape)."""
    meta = struct_pb2.Struct()
    meta.update({"LABELS": labels})
    cluster = prefix if shapes <= 1 else f"{prefix}-shape-{i % shapes}"
    return base_pb2.Node(id=node_id(i, prefix), cluster=cluster, metadata=meta)


def emit(**event) -> None:
    sys.stdout.write(json.dumps(event) + "\n")


class Client:
    __slots__ = ("i", "args", "delta", "events", "node", "first", "subscribed", "holds",
                 "got", "synced_at", "eds_times", "error", "restarts", "state", "seen", "chaos")

    def __init__(self, i: int, args):
        self.i, self.args = i, args
        self.delta = args.mode == "delta"
        self.events = args.report == "events"
        self.node = node(i, args.prefix, dict(kv.split("=", 1) for kv in args.label), args.shapes)
        self.eds_times: list[float] = []
        self.error = ""                          # the last stream error
        self.restarts = 0                        # streams re-opened after an error, as Envoy does
        self.chaos = None                        # the call --chaos cancelled
        self.state = "opening"                   # opening | open | backoff | ended (server closed) | died: ...
        self._fresh()

    def _fresh(self) -> None:
        """A new stream starts from nothing (node on its first message, no subscriptions held)."""
        self.first = True
        self.subscribed: dict[str, frozenset] = {ENDPOINT: frozenset(), ROUTE: frozenset()}
        self.holds: dict[str, frozenset] = {}    # Delta: names held per followed type (interned)
        self.got: set[str] = set()               # types held in full
        self.synced_at = 0.0
        # Per type on this stream: [responses, last nonce, last version, last receive time]
        # (what `diagnosis` reports for a client that is not synced).
        self.seen: dict[str, list] = {}

    def request(self, **kw) -> bytes:
        cls = discovery_pb2.DeltaDiscoveryRequest if self.delta else discovery_pb2.DiscoveryRequest
        if self.first:
            kw["node"] = self.node          # set_node_on_first_message_only, as Envoy
            self.first = False
        return cls(**kw).SerializeToString()

    async def run(self, channel, ready: asyncio.Event) -> None:
        """One ADS stream; after an error, a new one from scratch after a jittered backoff
        (0.25 s doubling to 4 s), as Envoy re-opens its ADS stream."""
        method = SERVICE + ("DeltaAggregatedResources" if self.delta else "StreamAggregatedResources")
        backoff = 0.25
        try:
            while True:
                call = channel.stream_stream(method, request_serializer=None, response_deserializer=None)()
                if self.args.chaos and random.random() < self.args.chaos:
                    asyncio.get_running_loop().call_later(random.uniform(0, self.args.chaos_window),
                                                          self._chaos_cancel, call)
                try:
                    await call.write(self.request(type_url=CLUSTER))
                    await call.write(self.request(type_url=LISTENER))
                    self.state = "open"
                    ready.set()
                    while True:
                        raw = await call.read()
                        if raw is grpc.aio.EOF:
                            # The control plane ended the stream (status OK): Envoy re-opens it
                            # then as after an error; before, this client stopped for good.
                            self._failed(f"{(await call.code()).name}: stream ended by the control plane")
                            break
                        t = time.time()
                        for req in (self.on_delta if self.delta else self.on_sotw)(raw, t):
                            await call.write(req)
                        backoff = 0.25
                except grpc.aio.AioRpcError as e:
                    self._failed(f"{e.code().name}: {(e.details() or '')[:120]}")
                except asyncio.InvalidStateError:
                    # A write to a call that ended after the read before it returned (the
                    # stream failed in between): grpc.aio raises this, not AioRpcError. The
                    # stream is over all the same; before, it ended this client for good.
                    self._failed(f"{(await call.code()).name}: {((await call.details()) or '')[:100]} (at a write)")
                except asyncio.CancelledError:
                    if self.chaos is not call or asyncio.current_task().cancelling():
                        call.cancel()
                        raise
                    self._failed("CHAOS: cancelled by the client (--chaos)")
                self.state = "backoff"
                ready.set()
                self.restarts += 1
                await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
                backoff = min(4.0, backoff * 2)
                self._fresh()
        except Exception as e:      # anything else ends this client for good: say so
            self.state = f"died: {type(e).__name__}: {e}"[:200]
            raise
        finally:
            ready.set()

    def _failed(self, error: str) -> None:
        self.error = error
        ERRORS[error] = ERRORS.get(error, 0) + 1
        if self.events:
            emit(c=self.i, error=error)

    def _chaos_cancel(self, call) -> None:
        """--chaos: end this stream from the client side now, wherever it is (as a client-side
        stream error would); the client re-opens it as after any error."""
        if not call.done():
            self.chaos = call
            call.cancel()

    def diagnosis(self) -> dict:
        """What a client that is not synced lacks: per type, the names it follows but does
        not hold (first 5), what it received (responses, last nonce/version, when)."""
        out = {"state": self.state, "restarts": self.restarts, "error": self.error, "types": {}}
        for ty in (CLUSTER, ENDPOINT, LISTENER, ROUTE):
            sub = self.subscribed.get(ty)
            held = self.holds.get(ty, frozenset())
            n, nonce, version, at = self.seen.get(ty, (0, "", "", 0.0))
            d = {"full": ty in self.got, "responses": n, "nonce": nonce, "version": version, "at": at}
            if sub is not None:
                d["subscribed"] = len(sub)
                if self.delta:
                    missing = sorted(sub - held)
                    d["held"], d["missing"], d["missing_first"] = len(held), len(missing), missing[:5]
            out["types"][SHORT[ty]] = d
        return out

    def _seen(self, ty: str, nonce: str, version: str, t: float) -> None:
        s = self.seen.get(ty)
        if s is None:
            s = self.seen[ty] = [0, "", "", 0.0]
        s[0] += 1
        s[1], s[2], s[3] = nonce, version, t

    def received(self, ty: str, raw: bytes, count: int, full: bool, t: float) -> None:
        if self.events:
            emit(c=self.i, ty=SHORT.get(ty, ty), t=t, b=len(raw), n=count)
        if ty == ENDPOINT:
            self.eds_times.append(t)
        if full and ty not in self.got:
            self.got.add(ty)
            if len(self.got) == 4:
                self.synced_at = t

    def on_sotw(self, raw: bytes, t: float) -> list[bytes]:
        head = HEADS["SotwHead"].FromString(raw)
        ty = head.type_url
        c = content(ty, ("sotw", ty, head.version_info), raw, False)
        self._seen(ty, head.nonce, head.version_info, t)
        sub = self.subscribed.get(ty)
        self.received(ty, raw, c.count, sub is None or c.count >= len(sub), t)
        out = [self.request(type_url=ty, version_info=head.version_info, response_nonce=head.nonce,
                            resource_names=sorted_names(sub) if sub is not None else [])]
        follow = FOLLOW.get(ty)
        if follow and c.follow != self.subscribed[follow]:
            self.subscribed[follow] = c.follow
            self.got.discard(follow)
            out.append(self.request(type_url=follow, resource_names=sorted_names(c.follow)))
        return out

    def on_delta(self, raw: bytes, t: float) -> list[bytes]:
        head = DeltaHead.FromString(raw)
        ty = head.type_url
        removed = tuple(head.removed_resources)
        # Delta bodies are shared per content; the same system version, size
        # less the nonce, and removals name one content (a benchmark's key).
        c = content(ty, ("delta", ty, head.system_version_info, len(raw) - len(head.nonce), removed), raw, True)
        self._seen(ty, head.nonce, head.system_version_info, t)
        sub = self.subscribed.get(ty)
        if sub is not None:          # a followed type: what is held now
            held = self.holds.get(ty, frozenset())
            if c.names - held or removed:
                held = intern((held | c.names) - set(removed))
                self.holds[ty] = held
            full = sub <= held
        else:
            full = True
        self.received(ty, raw, c.count, full, t)
        out = [self.request(type_url=ty, response_nonce=head.nonce)]
        follow = FOLLOW.get(ty)
        if not follow:
            return out
        have = self.subscribed[follow]
        new = c.follow - have
        gone = (set(removed) & have) if ty == CLUSTER else set()
        if new or gone:
            self.subscribed[follow] = intern((have | new) - gone)
            self.got.discard(follow)
            out.append(self.request(type_url=follow, resource_names_subscribe=sorted(new),
                                    resource_names_unsubscribe=sorted(gone)))
        return out


DeltaHead = HEADS["DeltaHead"]
ERRORS: dict[str, int] = {}      # stream errors of this process, by kind (the final line reports them)


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def main(args) -> None:
    clients = [Client(args.offset + i, args) for i in range(args.clients)]
    per = max(1, args.streams_per_channel)
    options = [("grpc.max_receive_message_length", 256 << 20)]
    # A distinct option per channel: grpc would otherwise share one subchannel
    # (one TCP connection) between channels of equal target and options.
    channels = [grpc.aio.insecure_channel(args.address, options=options + [("grpc.channel_id", k)])
                for k in range(-(-len(clients) // per))]
    events = [asyncio.Event() for _ in clients]
    tasks = [asyncio.create_task(c.run(channels[k // per], e))
             for k, (c, e) in enumerate(zip(clients, events))]
    # Status lines from the start: a stream still waiting to open is counted, not hidden.
    reporter = asyncio.create_task(_report_forever(clients, args.report)) if args.report == "summary" else None
    await asyncio.gather(*(e.wait() for e in events))
    emit(event="ready", t=time.time())
    sys.stdout.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(sys.stdin.fileno(), stop.set)     # the parent closes stdin to stop us
    reporter = reporter or asyncio.create_task(_report_forever(clients, args.report))
    await stop.wait()
    reporter.cancel()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if args.report == "summary":
        emit(final=True, cpu_s=cpu_seconds(), maxrss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
             clients={c.i: {"synced": c.synced_at, "eds": c.eds_times, "error": c.error, "restarts": c.restarts}
                       for c in clients},
             unsynced={c.i: c.diagnosis() for c in clients if not c.synced_at}, stream_errors=ERRORS)
    sys.stdout.flush()
    for ch in channels:
        await ch.close()


async def _report_forever(clients, report: str):
    while True:
        if report == "events":
            await asyncio.sleep(0.005)
        else:
            await asyncio.sleep(0.5)
            synced = [c.synced_at for c in clients if c.synced_at]
            errors = [c.error for c in clients if c.error]
            emit(synced=len(synced), last=max(synced, default=0.0), eds=sum(len(c.eds_times) for c in clients),
                 errors=len(errors), restarts=sum(c.restarts for c in clients),
                 first_error=errors[0] if errors else "", cpu_s=cpu_seconds())
        sys.stdout.flush()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--address", required=True)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--mode", choices=("sotw", "delta"), default="sotw")
    p.add_argument("--prefix", default="bench-gw")
    p.add_argument("--label", action="append", default=["istio=ingressgateway"])
    p.add_argument("--shapes", type=int, default=1, help="spread the clients over this many node shapes")
    p.add_argument("--offset", type=int, default=0, help="first client number (several processes, unique ids)")
    p.add_argument("--streams-per-channel", type=int, default=1,
                   help="ADS streams sharing one channel (HTTP/2 connection); 1: one each, as Envoys")
    p.add_argument("--report", choices=("events", "summary"), default="events")
    p.add_argument("--chaos", type=float, default=0.0,
                   help="probability that a stream is cancelled by the client at a random moment in its "
                        "first --chaos-window seconds (then re-opened, as after an error): makes re-opens frequent")
    p.add_argument("--chaos-window", type=float, default=3.0)
    asyncio.run(main(p.parse_args()))
