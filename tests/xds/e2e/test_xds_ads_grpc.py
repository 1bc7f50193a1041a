"""The ADS service end to end: a real XdsServer (grpc.aio) and client, on hand-made snapshots.

Each test drives one stream as Envoy would (requests, ACKs, NACKs) and
asserts on the responses that came back over the wire. The protocol's
cases in detail, without sockets: tests/xds/unit/test_xds_ads_protocol.py.
"""
import asyncio

import grpc
import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from envoy.config.core.v3 import extension_pb2
from google.protobuf import wrappers_pb2
from google.rpc import status_pb2

from mcp26.demo.stack.ports import free_port
from mcp26.xds.model import type_urls as T
from mcp26.xds.server import XdsServer

pytestmark = pytest.mark.e2e


def translate(config, node):
    """config: {"clusters": {name: port}, "listeners": [names], "routes": {name: cluster}}"""
    snap = {T.CLUSTER: {}, T.ENDPOINT: {}, T.LISTENER: {}, T.ROUTE: {}}
    for name, port in config.get("clusters", {}).items():
        snap[T.CLUSTER][name] = cluster_pb2.Cluster(name=name, type=cluster_pb2.Cluster.EDS, alt_stat_name=str(port))
        cla = endpoint_pb2.ClusterLoadAssignment(cluster_name=name)
        ep = cla.endpoints.add().lb_endpoints.add().endpoint.address.socket_address
        ep.address, ep.port_value = "127.0.0.1", port
        snap[T.ENDPOINT][name] = cla
    for name in config.get("listeners", []):
        snap[T.LISTENER][name] = listener_pb2.Listener(name=name)
    for name, value in config.get("extensions", {}).items():   # ECDS: a filter config by name
        ext = extension_pb2.TypedExtensionConfig(name=name)
        ext.typed_config.Pack(wrappers_pb2.StringValue(value=value))
        snap.setdefault(T.EXTENSION_CONFIG, {})[name] = ext
    for name, cluster in config.get("routes", {}).items():
        rc = route_pb2.RouteConfiguration(name=name)
        rc.virtual_hosts.add(name="vh", domains=["*"]).routes.add().route.cluster = cluster
        snap[T.ROUTE][name] = rc
    return snap


BASE = {"clusters": {"a": 1001, "b": 1002}, "listeners": ["l1", "l2"], "routes": {"r1": "a", "r2": "b"}}


@pytest.fixture(autouse=True, params=["fast", "grpcio"])
def frontend(request, monkeypatch):
    """Every test against ADS on both frontends (`--grpc-frontend`)."""
    monkeypatch.setattr(Harness, "frontend", request.param)


class Harness:
    """A real XdsServer (fake source) and a real grpc.aio client stream."""
    frontend = "fast"

    def __init__(self, config, delta=False):
        self.config = config
        self.delta = delta
        self.node = base_pb2.Node(id="router~127.0.0.1~gw.default~default.svc.cluster.local", cluster="gw")

    def _load(self, directory):
        if isinstance(self.config, Exception):
            raise self.config
        return self.config

    async def __aenter__(self):
        self.server = XdsServer("/nonexistent", port=free_port(), admin_port=free_port(),
                                load=self._load, translate=translate, grpc_frontend=self.frontend)
        await self.server.start()
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.server.port}")
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(self.channel)
        self.requests: asyncio.Queue = asyncio.Queue()

        async def gen():
            while True:
                req = await self.requests.get()
                if req is None:
                    return
                yield req
        rpc = stub.DeltaAggregatedResources if self.delta else stub.StreamAggregatedResources
        self.call = rpc(gen())
        self.responses: asyncio.Queue = asyncio.Queue()

        async def reader():  # reads must not be cancelled (that cancels the RPC): queue them
            async for resp in self.call:
                self.responses.put_nowait(resp)
        self.reader = asyncio.create_task(reader())
        return self

    async def __aexit__(self, *exc):
        await self.requests.put(None)
        self.call.cancel()
        self.reader.cancel()
        await self.channel.close()
        await self.server.stop(0)

    def send(self, **kw):
        cls = discovery_pb2.DeltaDiscoveryRequest if self.delta else discovery_pb2.DiscoveryRequest
        self.requests.put_nowait(cls(node=self.node, **kw))

    async def recv(self, timeout=3.0):
        return await asyncio.wait_for(self.responses.get(), timeout)

    async def nothing(self, wait=0.3):
        await asyncio.sleep(wait)
        assert self.responses.empty(), f"unexpected response: {self.responses.get_nowait()}"

    async def change(self, config):
        await asyncio.sleep(0.1)   # let requests sent before the change reach the server first
        self.config = config
        assert await self.server.apply()


def names(resp):
    if isinstance(resp, discovery_pb2.DeltaDiscoveryResponse):
        return sorted(r.name for r in resp.resources)
    out = []
    for any_ in resp.resources:
        cls = {T.CLUSTER: cluster_pb2.Cluster, T.LISTENER: listener_pb2.Listener,
               T.ROUTE: route_pb2.RouteConfiguration, T.ENDPOINT: endpoint_pb2.ClusterLoadAssignment}[resp.type_url]
        msg = cls()
        any_.Unpack(msg)
        out.append(msg.cluster_name if resp.type_url == T.ENDPOINT else msg.name)
    return sorted(out)


def run(coro):
    asyncio.run(asyncio.wait_for(coro, 20))


def test_sotw_wildcard_ack_and_removal_by_omission():
    async def body():
        async with Harness(dict(BASE)) as h:
            h.send(type_url=T.CLUSTER)
            r = await h.recv()
            assert r.type_url == T.CLUSTER and names(r) == ["a", "b"] and r.nonce
            h.send(type_url=T.CLUSTER, version_info=r.version_info, response_nonce=r.nonce)
            await h.nothing()    # a plain ACK gets no response
            sync = h.server.hub.tracker.syncz()[0]["types"]["CDS"]
            assert sync["status"] == "SYNCED" and sync["acked_version"] == r.version_info
            await h.change({**BASE, "clusters": {"a": 1001}})
            r2 = await h.recv()
            assert names(r2) == ["a"] and r2.version_info != r.version_info
    run(body())


def test_sotw_nack_keeps_last_acked_version_and_records_error():
    async def body():
        async with Harness(dict(BASE)) as h:
            h.send(type_url=T.LISTENER)
            r = await h.recv()
            h.send(type_url=T.LISTENER, version_info=r.version_info, response_nonce=r.nonce)
            await h.change({**BASE, "listeners": ["l1", "l2", "l3"]})
            r2 = await h.recv()
            assert names(r2) == ["l1", "l2", "l3"]
            h.send(type_url=T.LISTENER, version_info=r.version_info, response_nonce=r2.nonce,
                   error_detail=status_pb2.Status(code=3, message="l3: bad filter chain"))
            await h.nothing()    # a NACK is not answered with the same rejected config
            sync = h.server.hub.tracker.syncz()[0]["types"]["LDS"]
            assert sync["status"] == "NACKED"
            assert sync["acked_version"] == r.version_info         # the last accepted one
            assert sync["nacked_version"] == r2.version_info
            assert "l3: bad filter chain" in sync["error"]
            await h.change({**BASE, "listeners": ["l1"]})            # the fix goes out
            r3 = await h.recv()
            h.send(type_url=T.LISTENER, version_info=r3.version_info, response_nonce=r3.nonce)
            await asyncio.sleep(0.2)
            sync = h.server.hub.tracker.syncz()[0]["types"]["LDS"]
            assert sync["status"] == "SYNCED" and sync["error"] == ""
    run(body())


def test_sotw_stale_nonce_is_ignored():
    async def body():
        async with Harness(dict(BASE)) as h:
            h.send(type_url=T.CLUSTER)
            r = await h.recv()
            await h.change({**BASE, "clusters": {"a": 1}})
            r2 = await h.recv()
            # An ACK of the superseded response, asking for something else: ignored.
            h.send(type_url=T.CLUSTER, version_info=r.version_info, response_nonce=r.nonce,
                   resource_names=["zzz"])
            await h.nothing()
            assert h.server.hub.tracker.syncz()[0]["types"]["CDS"]["status"] == "STALE"
            h.send(type_url=T.CLUSTER, version_info=r2.version_info, response_nonce=r2.nonce)
            await asyncio.sleep(0.2)
            assert h.server.hub.tracker.syncz()[0]["types"]["CDS"]["status"] == "SYNCED"
    run(body())


def test_sotw_named_subscription_answers_only_names_asked():
    async def body():
        async with Harness(dict(BASE)) as h:
            h.send(type_url=T.ROUTE, resource_names=["r2", "missing"])
            r = await h.recv()
            assert names(r) == ["r2"]
            h.send(type_url=T.ROUTE, version_info=r.version_info, response_nonce=r.nonce,
                   resource_names=["r1", "r2"])
            r2 = await h.recv()  # a new subscription is answered at once
            assert names(r2) == ["r1", "r2"]
            h.send(type_url=T.ROUTE, version_info=r2.version_info, response_nonce=r2.nonce,
                   resource_names=["r1", "r2"])
            # A change to a resource nobody subscribed to sends nothing on RDS.
            await h.change({**BASE, "routes": {"r1": "a", "r2": "b", "r9": "a"}})
            await h.nothing()
    run(body())


def test_push_after_change_is_make_before_break_ordered():
    async def body():
        async with Harness(dict(BASE)) as h:
            acks = {}
            for t, kw in ((T.LISTENER, {}), (T.ROUTE, {"resource_names": ["r1"]}), (T.CLUSTER, {}),
                          (T.ENDPOINT, {"resource_names": ["a", "b", "c"]})):
                h.send(type_url=t, **kw)
                r = await h.recv()
                acks[t] = kw
                h.send(type_url=t, version_info=r.version_info, response_nonce=r.nonce, **kw)
            await h.change({"clusters": {"a": 1, "b": 2, "c": 3}, "listeners": ["l1", "l9"],
                            "routes": {"r1": "c"}})
            order = [(await h.recv()).type_url for _ in range(4)]
            assert order == [T.CLUSTER, T.ENDPOINT, T.LISTENER, T.ROUTE]
    run(body())


def test_one_translation_per_node_shape():
    async def body():
        async with Harness(dict(BASE)) as h:
            h.send(type_url=T.CLUSTER)
            await h.recv()
            before = h.server.cache.translations
            # A second stream of the same shape (another replica of the gateway).
            stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(h.channel)
            node = base_pb2.Node(id="router~127.0.0.2~gw-2.default~default.svc.cluster.local", cluster="gw")
            call = stub.StreamAggregatedResources(iter([discovery_pb2.DiscoveryRequest(node=node, type_url=T.CLUSTER)]))
            assert names(await asyncio.wait_for(call.read(), 3)) == ["a", "b"]
            assert h.server.cache.translations == before
            call.cancel()
    run(body())


def test_delta_subscribe_changes_and_removed_resources():
    async def body():
        async with Harness(dict(BASE), delta=True) as h:
            h.send(type_url=T.CLUSTER)           # wildcard
            r = await h.recv()
            assert names(r) == ["a", "b"] and list(r.removed_resources) == []
            h.send(type_url=T.CLUSTER, response_nonce=r.nonce)
            await h.change({**BASE, "clusters": {"a": 1001, "b": 9999, "c": 1003}})
            r2 = await h.recv()
            assert names(r2) == ["b", "c"]           # "a" unchanged: not resent
            h.send(type_url=T.CLUSTER, response_nonce=r2.nonce)
            await h.change({**BASE, "clusters": {"a": 1001, "c": 1003}})
            r3 = await h.recv()
            assert names(r3) == [] and list(r3.removed_resources) == ["b"]
            h.send(type_url=T.CLUSTER, response_nonce=r3.nonce)
            await asyncio.sleep(0.1)
            assert h.server.hub.tracker.syncz()[0]["types"]["CDS"]["status"] == "SYNCED"
    run(body())


def test_delta_named_subscribe_unsubscribe_and_absent_names():
    async def body():
        async with Harness(dict(BASE), delta=True) as h:
            h.send(type_url=T.ENDPOINT, resource_names_subscribe=["a", "nope"])
            r = await h.recv()
            assert names(r) == ["a"] and list(r.removed_resources) == ["nope"]
            h.send(type_url=T.ENDPOINT, response_nonce=r.nonce, resource_names_subscribe=["b"],
                   resource_names_unsubscribe=["a"])
            r2 = await h.recv()
            assert names(r2) == ["b"]
            h.send(type_url=T.ENDPOINT, response_nonce=r2.nonce)
            await h.change({**BASE, "clusters": {"a": 5, "b": 1002}})   # only "a" changed: unsubscribed
            await h.nothing()
    run(body())


def test_delta_reconnect_with_initial_versions_gets_only_what_differs():
    async def body():
        async with Harness(dict(BASE), delta=True) as h:
            h.send(type_url=T.CLUSTER)
            r = await h.recv()
            held = {res.name: res.version for res in r.resources}
        # A new server (restarted control plane) with one cluster changed and one gone.
        async with Harness({**BASE, "clusters": {"a": 1001, "c": 1003}}, delta=True) as h2:
            h2.send(type_url=T.CLUSTER, initial_resource_versions={**held})
            r2 = await h2.recv()
            assert names(r2) == ["c"] and list(r2.removed_resources) == ["b"]
    run(body())


def test_delta_nack_restores_what_client_holds():
    async def body():
        async with Harness(dict(BASE), delta=True) as h:
            h.send(type_url=T.CLUSTER)
            r = await h.recv()
            h.send(type_url=T.CLUSTER, response_nonce=r.nonce)
            await h.change({**BASE, "clusters": {"a": 7, "b": 1002}})
            r2 = await h.recv()
            assert names(r2) == ["a"]
            h.send(type_url=T.CLUSTER, response_nonce=r2.nonce,
                   error_detail=status_pb2.Status(code=3, message="a: rejected"))
            await asyncio.sleep(0.1)
            sync = h.server.hub.tracker.syncz()[0]["types"]["CDS"]
            assert sync["status"] == "NACKED" and "a: rejected" in sync["error"]
            # The next change (to b) also resends a: the client never accepted it.
            await h.change({**BASE, "clusters": {"a": 7, "b": 8}})
            r3 = await h.recv()
            assert names(r3) == ["a", "b"]
    run(body())


def test_nothing_served_before_a_good_config():
    from mcp26.mesh.diagnostics import ConfigError, Diagnostic

    async def body():
        async with Harness(ConfigError([Diagnostic("broken", file="x.yaml", line=3)])) as h:
            assert not h.server.cache.ready
            h.send(type_url=T.CLUSTER)
            await h.nothing()     # not an empty CDS, which would remove every cluster
            h.server.load = lambda d: BASE
            assert await h.server.apply()
            assert names(await h.recv()) == ["a", "b"]
    run(body())


@pytest.mark.parametrize("delta", [False, True])
def test_ecds_is_served_by_name_like_any_other_type(delta):
    async def body():
        async with Harness({**BASE, "extensions": {"mcp.header_contract": "v1", "other": "x"}}, delta=delta) as h:
            if delta:
                h.send(type_url=T.EXTENSION_CONFIG, resource_names_subscribe=["mcp.header_contract"])
            else:
                h.send(type_url=T.EXTENSION_CONFIG, resource_names=["mcp.header_contract"])
            r = await h.recv()
            assert r.type_url == T.EXTENSION_CONFIG
            got = []
            for res in r.resources:
                ext = extension_pb2.TypedExtensionConfig()
                (res.resource if delta else res).Unpack(ext)
                value = wrappers_pb2.StringValue()
                ext.typed_config.Unpack(value)
                got.append((ext.name, value.value))
            assert got == [("mcp.header_contract", "v1")]
            if delta:
                h.send(type_url=T.EXTENSION_CONFIG, response_nonce=r.nonce)
            else:
                h.send(type_url=T.EXTENSION_CONFIG, version_info=r.version_info, response_nonce=r.nonce,
                       resource_names=["mcp.header_contract"])
            await h.change({**BASE, "extensions": {"mcp.header_contract": "v2", "other": "x"}})
            r2 = await h.recv()
            assert r2.type_url == T.EXTENSION_CONFIG and len(r2.resources) == 1
    run(body())


@pytest.mark.parametrize("delta", [False, True])
def test_a_malformed_request_ends_its_stream_invalid_argument_and_others_are_served(delta):
    """Bytes that are not a request, and a first request without node.id: INVALID_ARGUMENT
    naming what was wrong (not UNKNOWN with a traceback), and the server serves the next stream."""
    method = "DeltaAggregatedResources" if delta else "StreamAggregatedResources"

    async def body():
        async with Harness(BASE, delta=delta) as h:
            for payload, says in ((b"\xff\xff\xff\xff", "Error parsing message"),
                                  ((discovery_pb2.DeltaDiscoveryRequest if delta else discovery_pb2.DiscoveryRequest)(
                                      type_url=T.CLUSTER).SerializeToString(), "must carry node.id")):
                call = h.channel.stream_stream(f"/envoy.service.discovery.v3.AggregatedDiscoveryService/{method}",
                                               request_serializer=None, response_deserializer=None)()
                await call.write(payload)
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await asyncio.wait_for(call.read(), 5)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and says in e.value.details(), e.value
            h.send(type_url=T.CLUSTER)                  # a good stream on the same server
            assert names(await h.recv()) == ["a", "b"]
    run(body())
