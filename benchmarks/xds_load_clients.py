"""N ADS clients in one process that subscribe and ACK as Envoy does (the xDS benchmark's load).

    python -m benchmarks.xds_load_clients --address 127.0.0.1:18000 --clients 100 --mode delta

Each client is its own gRPC channel (its own HTTP/2 connection, as each
Envoy has), with node labels istio=ingressgateway so that all share one
snapshot shape. Like Envoy: CDS and LDS wildcard, then EDS for every
cluster and RDS for every route config the listeners name; every response
ACKed (SotW: version_info + response_nonce; Delta: response_nonce).

To keep the load generator from being the bottleneck, responses are read
as raw bytes and decoded with "head" messages that declare only the fields
an ACK needs; resource names are decoded once per content version and
shared between clients. Prints one JSON line per response received:
{"c": client, "ty": "CDS", "t": time.time(), "b": bytes, "n": resources}
and {"event": "ready"} once every stream is open.
"""
from __future__ import annotations

import argparse
import asyncio
import json
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
SERVICE = "/envoy.service.discovery.v3.AggregatedDiscoveryService/"


def _head_messages():
    T, L = descriptor_pb2.FieldDescriptorProto, descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="xds_bench_heads.proto", package="xdsbench", syntax="proto3")

    def msg(name, fields):
        m = fdp.message_type.add(name=name)
        for fname, number, ftype, repeated in fields:
            m.field.add(name=fname, number=number, type=ftype,
                        label=L.LABEL_REPEATED if repeated else L.LABEL_OPTIONAL)

    msg("SotwHead", [("version_info", 1, T.TYPE_STRING, False), ("resources", 2, T.TYPE_BYTES, True),
                     ("type_url", 4, T.TYPE_STRING, False), ("nonce", 5, T.TYPE_STRING, False)])
    msg("DeltaHead", [("system_version_info", 1, T.TYPE_STRING, False),
                      ("resources", 2, T.TYPE_BYTES, True), ("type_url", 4, T.TYPE_STRING, False),
                      ("nonce", 5, T.TYPE_STRING, False), ("removed_resources", 6, T.TYPE_STRING, True)])
    msg("ResourceHead", [("name", 3, T.TYPE_STRING, False)])                  # delta Resource.name
    msg("AnyHead", [("value", 2, T.TYPE_BYTES, False)])                       # Any.value
    msg("NamedHead", [("name", 1, T.TYPE_STRING, False)])                     # Cluster.name / Listener.name
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"xdsbench.{m.name}"))
            for m in fdp.message_type}


HEADS = _head_messages()
_names_by_version: dict[tuple, list[str]] = {}


def sotw_names(head) -> list[str]:
    """Cluster names (CDS) or the RDS names the listeners use (LDS), decoded once per version."""
    key = (head.type_url, head.version_info)
    if key not in _names_by_version:
        names = []
        for raw in head.resources:
            value = HEADS["AnyHead"].FromString(raw).value
            if head.type_url == CLUSTER:
                names.append(HEADS["NamedHead"].FromString(value).name)
            else:
                names.extend(route_names(listener_pb2.Listener.FromString(value)))
        _names_by_version[key] = names
    return _names_by_version[key]


def route_names(lis: listener_pb2.Listener) -> list[str]:
    out = []
    for chain in lis.filter_chains:
        for f in chain.filters:
            hcm = http_connection_manager_pb2.HttpConnectionManager()
            if f.typed_config.Unpack(hcm) and hcm.HasField("rds"):
                out.append(hcm.rds.route_config_name)
    return out


def node(i: int, prefix: str, labels: dict, shapes: int = 1) -> base_pb2.Node:
    """Client i's node; with `shapes` > 1 its cluster is one of that many (the
    cluster is part of the control plane's translation key: one snapshot per shape)."""
    meta = struct_pb2.Struct()
    meta.update({"LABELS": labels})
    cluster = prefix if shapes <= 1 else f"{prefix}-shape-{i % shapes}"
    return base_pb2.Node(id=f"router~127.0.0.{i % 250 + 1}~{prefix}-{i}.default~default.svc.cluster.local",
                         cluster=cluster, metadata=meta)


def emit(**event) -> None:
    sys.stdout.write(json.dumps(event) + "\n")


class Client:
    def __init__(self, i: int, args):
        self.i, self.args = i, args
        self.node = node(i, args.prefix, dict(kv.split("=", 1) for kv in args.label), args.shapes)
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.first = True
        self.subscribed: dict[str, set] = {ENDPOINT: set(), ROUTE: set()}

    def send(self, **kw) -> None:
        cls = discovery_pb2.DeltaDiscoveryRequest if self.args.mode == "delta" else discovery_pb2.DiscoveryRequest
        if self.first:
            kw["node"] = self.node          # set_node_on_first_message_only, as Envoy
            self.first = False
        self.outbox.put_nowait(cls(**kw))

    async def requests(self):
        while True:
            req = await self.outbox.get()
            if req is None:
                return
            yield req

    async def run(self, ready: asyncio.Event) -> None:
        delta = self.args.mode == "delta"
        channel = grpc.aio.insecure_channel(self.args.address, options=[
            ("grpc.max_receive_message_length", 256 << 20)])
        method = SERVICE + ("DeltaAggregatedResources" if delta else "StreamAggregatedResources")
        call = channel.stream_stream(method, request_serializer=lambda m: m.SerializeToString(),
                                     response_deserializer=None)(self.requests())
        self.send(type_url=CLUSTER)
        self.send(type_url=LISTENER)
        ready.set()
        try:
            async for raw in call:
                t = time.time()
                if delta:
                    self.on_delta(HEADS["DeltaHead"].FromString(raw), raw, t)
                else:
                    self.on_sotw(HEADS["SotwHead"].FromString(raw), raw, t)
        except grpc.aio.AioRpcError as e:
            emit(c=self.i, error=e.code().name)
        finally:
            await channel.close()

    def on_sotw(self, head, raw: bytes, t: float) -> None:
        ty = head.type_url
        emit(c=self.i, ty=SHORT.get(ty, ty), t=t, b=len(raw), n=len(head.resources))
        self.send(type_url=ty, version_info=head.version_info, response_nonce=head.nonce,
                  resource_names=sorted(self.subscribed[ty]) if ty in self.subscribed else [])
        follow = {CLUSTER: ENDPOINT, LISTENER: ROUTE}.get(ty)
        if follow:
            names = set(sotw_names(head))
            if names != self.subscribed[follow]:
                self.subscribed[follow] = names
                self.send(type_url=follow, resource_names=sorted(names),
                          version_info="", response_nonce="")

    def on_delta(self, head, raw: bytes, t: float) -> None:
        ty = head.type_url
        emit(c=self.i, ty=SHORT.get(ty, ty), t=t, b=len(raw), n=len(head.resources))
        self.send(type_url=ty, response_nonce=head.nonce)
        follow = {CLUSTER: ENDPOINT, LISTENER: ROUTE}.get(ty)
        if not follow:
            return
        # Responses with the same system version and count carry the same names
        # (every client of one shape gets the same ones): decode them once.
        key = ("delta", ty, head.system_version_info, len(head.resources), tuple(head.removed_resources))
        names = _names_by_version.get(key)
        if names is None:
            if ty == CLUSTER:
                names = {HEADS["ResourceHead"].FromString(r).name for r in head.resources}
            else:
                names = set()
                for r in head.resources:
                    res = discovery_pb2.Resource.FromString(r)
                    lis = listener_pb2.Listener()
                    res.resource.Unpack(lis)
                    names.update(route_names(lis))
            _names_by_version[key] = names
        new = names - self.subscribed[follow]
        gone = set(head.removed_resources) & self.subscribed[follow] if ty == CLUSTER else set()
        if new or gone:
            self.subscribed[follow] = (self.subscribed[follow] | new) - gone
            self.send(type_url=follow, resource_names_subscribe=sorted(new),
                      resource_names_unsubscribe=sorted(gone))


async def main(args) -> None:
    clients = [Client(args.offset + i, args) for i in range(args.clients)]
    events = [asyncio.Event() for _ in clients]
    tasks = [asyncio.create_task(c.run(e)) for c, e in zip(clients, events)]
    await asyncio.gather(*(e.wait() for e in events))
    emit(event="ready", t=time.time())
    sys.stdout.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(sys.stdin.fileno(), stop.set)     # the parent closes stdin to stop us
    flusher = asyncio.create_task(_flush_forever())
    await stop.wait()
    for c in clients:
        c.outbox.put_nowait(None)
    for t in tasks:
        t.cancel()
    flusher.cancel()
    sys.stdout.flush()


async def _flush_forever():
    while True:
        await asyncio.sleep(0.005)
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
    asyncio.run(main(p.parse_args()))
