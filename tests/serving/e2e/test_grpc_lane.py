"""The gRPC lane (serving/grpc/server.py on serving/h2), observed from outside: a standalone
GrpcLane with test services driven by real grpcio clients (sync and grpc.aio), and a real
`mcpctl serve --model builtin:relu` whose KServe v2 / health / reflection answers on
`--grpc-frontend fast` must equal grpcio's. Hostile HTTP/2 written by hand is tested on bytes
(tests/serving/unit/test_h2_connection.py, test_h2_abuse.py, test_grpc_server.py) and through
sockets beside grpc-core in test_h2_abuse_sockets.py."""
from __future__ import annotations

import asyncio
import pickle
import queue
import socket
import threading
import time

import grpc
import numpy as np
import pytest

from mcp26.demo.stack.inference_server import InferenceServer
from mcp26.serving.grpc.server import GrpcLane

pytestmark = pytest.mark.e2e

MB = 1 << 20
BIN = bytes(range(256))                     # every byte value, for `-bin` metadata
ABORT_DETAILS = "précondition échouée ü % 100%25 %zz 日本 ✓"
CLIENT_OPTIONS = [("grpc.max_receive_message_length", 64 * MB), ("grpc.max_send_message_length", 64 * MB)]



# ---------------------------------------------------------------------------------------------
# a standalone lane with test services, on an asyncio loop in a background thread


class Recorder:
    """Thread-safe events the handlers set (started / cancelled / finished, per tag)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.events: dict = {}
        self.inflight = 0
        self.peak = 0

    def event(self, kind: str, tag: str) -> threading.Event:
        with self.lock:
            return self.events.setdefault((kind, tag), threading.Event())


def services(rec: Recorder):
    async def echo(req, ctx):
        md = dict(ctx.invocation_metadata())
        mode = md.get("mode")
        if mode == "abort":
            await ctx.abort(grpc.StatusCode.FAILED_PRECONDITION, ABORT_DETAILS)
        if mode == "raise":
            raise RuntimeError("boom")
        if mode == "trailers":
            await ctx.send_initial_metadata((("i", "1"), ("i-bin", BIN)))
            ctx.set_trailing_metadata((("t-bin", BIN), ("t", "v")))
        if mode == "meta":
            return pickle.dumps(tuple((k, v) for k, v in ctx.invocation_metadata()))
        if mode == "double":
            return req + req
        return req

    async def slow(req, ctx):
        """Sleeps float(req) seconds; records started / cancelled / finished under metadata `tag`."""
        tag = dict(ctx.invocation_metadata())["tag"]
        rec.event("started", tag).set()
        try:
            await asyncio.sleep(float(req))
        except asyncio.CancelledError:
            rec.event("cancelled", tag).set()
            raise
        rec.event("finished", tag).set()
        return b"slept " + req

    async def delay(req, ctx):
        rec.inflight += 1                   # the loop's thread only: no lock needed
        rec.peak = max(rec.peak, rec.inflight)
        try:
            await asyncio.sleep(0.3)
        finally:
            rec.inflight -= 1
        return req

    async def ustream(req, ctx):
        for i in range(3):
            yield req + bytes([i])

    async def ustream_write(req, ctx):      # writes with context.write, returns None
        for i in range(3):
            await ctx.write(req + bytes([10 + i]))

    async def sunary(it, ctx):
        parts = [r async for r in it]
        return b"|".join(parts)

    async def bidi(it, ctx):
        async for r in it:
            yield r[::-1]

    async def bidi_read(req_iter, ctx):     # context.read / context.write style
        while True:
            r = await ctx.read()
            if not r:
                break
            await ctx.write(b"<" + r + b">")

    async def ctx_info(req, ctx):
        if req == b"set_code":                  # status set without abort, no answer
            ctx.set_code(grpc.StatusCode.NOT_FOUND)
            ctx.set_details("no such thing ü")
            return None
        return pickle.dumps((ctx.time_remaining(), ctx.peer(), ctx.cancelled()))

    async def ustream_abort(req, ctx):          # two messages, then abort
        yield b"m1"
        yield b"m2"
        await ctx.abort(grpc.StatusCode.OUT_OF_RANGE, "stopped after 2 ü %")

    async def sunary_early(it, ctx):            # answers after the first message, the client still sending
        async for r in it:
            return b"first " + r
        return b"none"

    async def flood(req, ctx):                  # int(req) writes of 256 KiB, each counted once it returns
        for i in range(int(req)):
            await ctx.write(bytes([i]) * (256 << 10))
            rec.inflight += 1                   # here: writes completed (the loop's thread only)

    async def noread(it, ctx):                  # does not read for 1 s, then counts what came
        await asyncio.sleep(1.0)
        return str(len([r async for r in it])).encode()

    return grpc.method_handlers_generic_handler("t.S", {
        "Ctx": grpc.unary_unary_rpc_method_handler(ctx_info),
        "UA": grpc.unary_stream_rpc_method_handler(ustream_abort),
        "CE": grpc.stream_unary_rpc_method_handler(sunary_early),
        "NoRead": grpc.stream_unary_rpc_method_handler(noread),
        "Flood": grpc.unary_stream_rpc_method_handler(flood),
        "Echo": grpc.unary_unary_rpc_method_handler(echo),
        "Slow": grpc.unary_unary_rpc_method_handler(slow),
        "Delay": grpc.unary_unary_rpc_method_handler(delay),
        "U": grpc.unary_stream_rpc_method_handler(ustream),
        "UW": grpc.unary_stream_rpc_method_handler(ustream_write),
        "C": grpc.stream_unary_rpc_method_handler(sunary),
        "B": grpc.stream_stream_rpc_method_handler(bidi),
        "BR": grpc.stream_stream_rpc_method_handler(bidi_read),
    })


class LaneThread:
    def __init__(self, max_receive: int = 64 * MB, max_send: int = 64 * MB, **lane_options):
        self.rec = Recorder()
        self.loop = asyncio.new_event_loop()
        self.lane = GrpcLane(max_receive, max_send, **lane_options)
        self.lane.add_generic_rpc_handlers((services(self.rec),))
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = self.run(self.lane.start("127.0.0.1", 0))
        self.stopped = False

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def run(self, coro, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def submit(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def on_loop(self, fn):
        async def call():
            return fn()
        return self.run(call())

    def peers(self) -> set[str]:
        return self.on_loop(lambda: {c.peer for c in self.lane.connections})

    def close(self) -> None:
        if not self.stopped:
            try:
                self.run(self.lane.stop(0))
            except Exception:      # noqa: BLE001 - best effort at teardown
                pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def lt():
    lane = LaneThread()
    yield lane
    lane.close()


@pytest.fixture(scope="module")
def ch(lt):
    channel = grpc.insecure_channel(lt.target, options=CLIENT_OPTIONS)
    yield channel
    channel.close()


def serves(lt: LaneThread) -> None:
    """A fresh grpcio channel gets a correct answer."""
    with grpc.insecure_channel(lt.target) as fresh:
        assert fresh.unary_unary("/t.S/Echo")(b"still here", timeout=5) == b"still here"


# ---------------------------------------------------------------------------------------------
# 1. real grpcio clients


def test_lane_four_call_shapes_sync_client(ch):
    r, call = ch.unary_unary("/t.S/Echo").with_call(b"hi", timeout=5)
    assert r == b"hi" and call.code() == grpc.StatusCode.OK
    assert list(ch.unary_stream("/t.S/U")(b"a", timeout=5)) == [b"a\x00", b"a\x01", b"a\x02"]
    assert list(ch.unary_stream("/t.S/UW")(b"w", timeout=5)) == [b"w\x0a", b"w\x0b", b"w\x0c"]
    assert ch.stream_unary("/t.S/C")(iter([b"abc", b"", b"de"]), timeout=5) == b"abc||de"
    assert ch.stream_unary("/t.S/C")(iter([]), timeout=5) == b""
    assert list(ch.stream_stream("/t.S/B")(iter([b"abc", b"de"]), timeout=5)) == [b"cba", b"ed"]
    assert list(ch.stream_stream("/t.S/BR")(iter([b"x", b"yz"]), timeout=5)) == [b"<x>", b"<yz>"]


def test_lane_bidi_interleaved_sync_client(ch):
    """Each answer must come back before the client sends the next request (and before it half-closes)."""
    q: queue.Queue = queue.Queue()

    def requests():
        while (m := q.get()) is not None:
            yield m

    answers = ch.stream_stream("/t.S/B")(requests(), timeout=10)
    for m in (b"abc", bytes(range(256)) * 400, b"z"):
        q.put(m)
        assert next(answers) == m[::-1]
    q.put(None)
    assert list(answers) == []
    assert answers.code() == grpc.StatusCode.OK


def test_lane_four_call_shapes_aio_client(lt):
    async def main():
        async with grpc.aio.insecure_channel(lt.target) as channel:
            assert await channel.unary_unary("/t.S/Echo")(b"aio", timeout=5) == b"aio"
            assert [m async for m in channel.unary_stream("/t.S/U")(b"q", timeout=5)] == [b"q\x00", b"q\x01", b"q\x02"]

            async def gen():
                for m in (b"1", b"22", b"333"):
                    yield m
            assert await channel.stream_unary("/t.S/C")(gen(), timeout=5) == b"1|22|333"
            call = channel.stream_stream("/t.S/B")(timeout=5)
            for m in (b"one", b"two", b"three"):       # send one, read one
                await call.write(m)
                assert await call.read() == m[::-1]
            await call.done_writing()
            assert await call.read() == grpc.aio.EOF
            assert await call.code() == grpc.StatusCode.OK
            call = channel.stream_stream("/t.S/BR")(timeout=5)
            await call.write(b"r")
            assert await call.read() == b"<r>"
            await call.done_writing()
            assert await call.read() == grpc.aio.EOF
            # metadata both ways on aio
            call = channel.unary_unary("/t.S/Echo")(b"m", metadata=(("mode", "trailers"),), timeout=5)
            assert await call == b"m"
            assert ("t-bin", BIN) in tuple(await call.trailing_metadata())
            assert ("i-bin", BIN) in tuple(await call.initial_metadata())
    asyncio.run(main())


def test_lane_trailing_and_initial_metadata_bin_round_trip(ch):
    r, call = ch.unary_unary("/t.S/Echo").with_call(b"t", metadata=(("mode", "trailers"),), timeout=5)
    assert r == b"t"
    trailers = tuple(call.trailing_metadata())
    assert ("t-bin", BIN) in trailers and ("t", "v") in trailers
    initial = tuple(call.initial_metadata())
    assert ("i-bin", BIN) in initial and ("i", "1") in initial


def test_lane_invocation_metadata_seen_by_handler(ch):
    sent = (("mode", "meta"), ("k", "v a l"), ("k2-bin", b"\x00\xff\x10" + BIN), ("empty-bin", b"\x01"))
    seen = pickle.loads(ch.unary_unary("/t.S/Echo")(b"", metadata=sent, timeout=5))
    assert ("k", "v a l") in seen
    assert ("k2-bin", b"\x00\xff\x10" + BIN) in seen and ("empty-bin", b"\x01") in seen
    assert all(isinstance(v, bytes) for k, v in seen if k.endswith("-bin"))
    keys = {k for k, _ in seen}
    assert not keys & {"content-type", "te", "grpc-timeout", ":path", ":authority"}, keys


def test_lane_abort_details_non_ascii_and_percent(ch):
    with pytest.raises(grpc.RpcError) as e:
        ch.unary_unary("/t.S/Echo")(b"x", metadata=(("mode", "abort"),), timeout=5)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert e.value.details() == ABORT_DETAILS


def test_lane_context_status_time_remaining_peer_and_stream_abort(ch):
    remaining, peer, cancelled = pickle.loads(ch.unary_unary("/t.S/Ctx")(b"", timeout=5))
    assert 3 < remaining <= 5.5 and peer.startswith("ipv4:127.0.0.1:") and cancelled is False
    remaining, _, _ = pickle.loads(ch.unary_unary("/t.S/Ctx")(b""))
    assert remaining is None
    with pytest.raises(grpc.RpcError) as e:
        ch.unary_unary("/t.S/Ctx")(b"set_code", timeout=5)
    assert (e.value.code(), e.value.details()) == (grpc.StatusCode.NOT_FOUND, "no such thing ü")
    got = []
    with pytest.raises(grpc.RpcError) as e:
        for m in ch.unary_stream("/t.S/UA")(b"", timeout=5):
            got.append(m)
    assert got == [b"m1", b"m2"]
    assert (e.value.code(), e.value.details()) == (grpc.StatusCode.OUT_OF_RANGE, "stopped after 2 ü %")


def test_lane_stream_unary_answer_before_client_finishes(ch):
    def requests():
        yield b"one"
        for _ in range(50):
            time.sleep(0.005)
            yield b"x" * 10_000
    assert ch.stream_unary("/t.S/CE")(requests(), timeout=5) == b"first one"
    assert ch.unary_unary("/t.S/Echo")(b"after", timeout=5) == b"after"


def test_lane_handler_exception_is_unknown(ch):
    with pytest.raises(grpc.RpcError) as e:
        ch.unary_unary("/t.S/Echo")(b"x", metadata=(("mode", "raise"),), timeout=5)
    assert e.value.code() == grpc.StatusCode.UNKNOWN
    assert ch.unary_unary("/t.S/Echo")(b"after", timeout=5) == b"after"


def test_lane_deadline_exceeded_cancels_handler(lt, ch):
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        ch.unary_unary("/t.S/Slow")(b"30", metadata=(("tag", "deadline"),), timeout=0.4)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - t0 < 3
    assert lt.rec.event("started", "deadline").is_set()
    assert lt.rec.event("cancelled", "deadline").wait(3), "the handler kept running past its deadline"
    assert not lt.rec.event("finished", "deadline").is_set()


def test_lane_client_cancel_cancels_handler(lt, ch):
    fut = ch.unary_unary("/t.S/Slow").future(b"30", metadata=(("tag", "cancel"),), timeout=20)
    assert lt.rec.event("started", "cancel").wait(5)
    assert fut.cancel()
    assert lt.rec.event("cancelled", "cancel").wait(3), "client cancel did not cancel the handler"
    assert not lt.rec.event("finished", "cancel").is_set()
    assert ch.unary_unary("/t.S/Echo")(b"next", timeout=5) == b"next"


def test_lane_ten_megabytes_both_ways(ch):
    echo = ch.unary_unary("/t.S/Echo")
    rng = np.random.default_rng(7)
    for _ in range(2):                  # 40 MB over one connection: both windows refilled many times
        big = rng.bytes(10 * MB)
        assert echo(big, timeout=30) == big
    big = rng.bytes(3 * MB)
    assert echo(big, metadata=(("mode", "double"),), timeout=30) == big + big
    msgs = [rng.bytes(MB + i) for i in range(4)]
    assert list(ch.stream_stream("/t.S/B")(iter(msgs), timeout=30)) == [m[::-1] for m in msgs]


def test_lane_concurrent_large_answers_share_the_connection_window(ch):
    """20 x 2 MB answers at once: more than any window, streams wait on the connection's and the client's."""
    echo = ch.unary_unary("/t.S/Echo")
    bodies = [bytes([i]) * (2 * MB) + i.to_bytes(4, "big") for i in range(20)]
    futures = [echo.future(b, timeout=30) for b in bodies]
    assert all(f.result() == b for f, b in zip(futures, bodies))


def test_lane_unread_request_stream_is_flow_controlled(ch):
    """A handler that does not read must hold the client back (grpcio: 4 of 1 MB messages get out
    in the second it waits); the lane must not take in whatever the client sends."""
    sent = [0]

    def requests():
        for _ in range(64):
            sent[0] += 1
            yield b"\x07" * MB
    fut = ch.stream_unary("/t.S/NoRead").future(requests(), timeout=20)
    time.sleep(0.8)
    taken = sent[0]
    assert fut.result() == b"64"
    assert taken <= 24, f"the client got {taken} MB out to a handler that read none of it"


def test_lane_oversized_metadata_fails_only_that_call(lt, ch):
    """Metadata over 16 KiB: grpcio answers that call RESOURCE_EXHAUSTED; the connection and a
    call in flight on it are unharmed."""
    slow = ch.unary_unary("/t.S/Slow").future(b"0.5", metadata=(("tag", "beside-big-md"),), timeout=10)
    assert lt.rec.event("started", "beside-big-md").wait(5)
    with pytest.raises(grpc.RpcError) as e:
        ch.unary_unary("/t.S/Echo")(b"a", metadata=(("big", "v" * 17_000),), timeout=5)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (e.value.code(), e.value.details())
    assert slow.result(5) == b"slept 0.5"


def test_lane_max_message_limits_resource_exhausted():
    small = LaneThread(max_receive=1 * MB, max_send=1 * MB)
    try:
        with grpc.insecure_channel(small.target, options=CLIENT_OPTIONS) as channel:
            echo = channel.unary_unary("/t.S/Echo")
            assert echo(b"ok", timeout=5) == b"ok"
            with pytest.raises(grpc.RpcError) as e:
                echo(b"\x01" * (2 * MB), timeout=10)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert echo(b"next", timeout=5) == b"next"      # the same connection serves the next call
            assert len(small.peers()) == 1
            exact = b"\x02" * MB                            # exactly at the limit: accepted
            assert echo(exact, timeout=10) == exact
            # an answer over max_send
            with pytest.raises(grpc.RpcError) as e:
                echo(b"\x03" * (MB // 2 + 1), metadata=(("mode", "double"),), timeout=10)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            # a streaming request with one message over the limit
            with pytest.raises(grpc.RpcError) as e:
                list(channel.stream_stream("/t.S/B")(iter([b"a", b"\x04" * (2 * MB)]), timeout=10))
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert echo(b"again", timeout=5) == b"again"
            assert len(small.peers()) == 1
    finally:
        small.close()


def test_lane_compressed_message_over_limit_is_resource_exhausted():
    """grpcio checks max_receive after decompressing and answers RESOURCE_EXHAUSTED."""
    small = LaneThread(max_receive=1 * MB, max_send=1 * MB)
    try:
        with grpc.insecure_channel(small.target, options=CLIENT_OPTIONS) as channel:
            echo = channel.unary_unary("/t.S/Echo")
            with pytest.raises(grpc.RpcError) as e:
                echo(b"\x00" * (2 * MB), compression=grpc.Compression.Gzip, timeout=10)   # ~2 KB on the wire
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (e.value.code(), e.value.details())
            assert echo(b"next", timeout=5) == b"next"
    finally:
        small.close()


def test_lane_gzip_and_deflate_requests(ch):
    echo = ch.unary_unary("/t.S/Echo")
    body = b"zz" * 50_000 + bytes(range(256))
    assert echo(body, compression=grpc.Compression.Gzip, timeout=5) == body
    assert echo(body, compression=grpc.Compression.Deflate, timeout=5) == body
    assert list(ch.stream_stream("/t.S/B")(iter([body, b"ab"]), compression=grpc.Compression.Gzip,
                                           timeout=5)) == [body[::-1], b"ba"]


def test_lane_five_hundred_concurrent_calls_one_channel(lt, ch):
    delay = ch.unary_unary("/t.S/Delay")
    t0 = time.monotonic()
    futures = [delay.future(i.to_bytes(4, "big") * (1 + i % 7), timeout=20) for i in range(500)]
    results = [f.result() for f in futures]
    elapsed = time.monotonic() - t0
    assert results == [i.to_bytes(4, "big") * (1 + i % 7) for i in range(500)]
    assert lt.rec.peak >= 250, f"only {lt.rec.peak} calls ran at once"
    assert elapsed < 10, elapsed       # 500 x 0.3 s one by one would be 150 s


def test_lane_unknown_method_unimplemented(ch):
    for path in ("/t.S/Nope", "/no.Such/Echo"):
        with pytest.raises(grpc.RpcError) as e:
            ch.unary_unary(path)(b"", timeout=5)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with pytest.raises(grpc.RpcError) as e:
        list(ch.stream_stream("/t.S/Nope")(iter([b"a"]), timeout=5))
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_lane_stop_grace_finishes_in_flight_then_refuses():
    lane = LaneThread()
    try:
        channel = grpc.insecure_channel(lane.target)
        slow = channel.unary_unary("/t.S/Slow")
        short = slow.future(b"0.5", metadata=(("tag", "stop-short"),), timeout=20)
        long = slow.future(b"30", metadata=(("tag", "stop-long"),), timeout=20)
        assert lane.rec.event("started", "stop-short").wait(5) and lane.rec.event("started", "stop-long").wait(5)
        t0 = time.monotonic()
        stopping = lane.submit(lane.lane.stop(2.0))
        assert short.result(10) == b"slept 0.5"                  # in flight: finishes within the grace
        stopping.result(10)
        lane.stopped = True
        took = time.monotonic() - t0
        assert 1.5 < took < 5, took                               # waited the grace for the long one, then cut it
        assert lane.rec.event("cancelled", "stop-long").wait(3)
        assert not lane.rec.event("finished", "stop-long").is_set()
        with pytest.raises(grpc.RpcError):
            long.result(10)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", lane.port), timeout=2).close()
        with grpc.insecure_channel(lane.target) as fresh, pytest.raises(grpc.RpcError) as e:
            fresh.unary_unary("/t.S/Echo")(b"x", timeout=2)
        assert e.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        channel.close()
    finally:
        lane.close()


def test_lane_stop_grace_returns_early_when_calls_finish():
    lane = LaneThread()
    try:
        with grpc.insecure_channel(lane.target) as channel:
            fut = channel.unary_unary("/t.S/Slow").future(b"0.3", metadata=(("tag", "early"),), timeout=20)
            assert lane.rec.event("started", "early").wait(5)
            t0 = time.monotonic()
            lane.run(lane.lane.stop(10.0), timeout=15)
            lane.stopped = True
            assert time.monotonic() - t0 < 3
            assert fut.result(5) == b"slept 0.3"
    finally:
        lane.close()


# ---------------------------------------------------------------------------------------------
# 2. mcpctl serve: --grpc-frontend fast answers as grpcio does


def kserve_answers(target: str) -> dict:
    from google.protobuf import json_format
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
    from mcp26.inference.protos import grpc_service_pb2 as pb, grpc_service_pb2_grpc as pbg

    out: dict = {}

    def record(name, fn, clear=()):
        try:
            msg = fn()
        except grpc.RpcError as e:
            out[name] = ("error", e.code(), e.details())
            return
        msgs = msg if isinstance(msg, list) else [msg]
        for m in msgs:
            for path in clear:
                target_msg = m
                for part in path[:-1]:
                    target_msg = getattr(target_msg, part)
                target_msg.ClearField(path[-1])
        out[name] = ("ok", [json_format.MessageToDict(m, preserving_proto_field_name=True) for m in msgs])

    x = np.random.default_rng(3).standard_normal((2, 256)).astype(np.float32)

    def infer_request(rid: str, model: str = "relu"):
        return pb.ModelInferRequest(model_name=model, id=rid, inputs=[pb.ModelInferRequest.InferInputTensor(
            name="INPUT0", datatype="FP32", shape=[2, 256])], raw_input_contents=[x.tobytes()])

    with grpc.insecure_channel(target) as channel:
        stub = pbg.GRPCInferenceServiceStub(channel)
        record("ServerLive", lambda: stub.ServerLive(pb.ServerLiveRequest(), timeout=10))
        record("ServerReady", lambda: stub.ServerReady(pb.ServerReadyRequest(), timeout=10))
        record("ServerMetadata", lambda: stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=10))
        record("ModelReady", lambda: stub.ModelReady(pb.ModelReadyRequest(name="relu"), timeout=10))
        record("ModelMetadata", lambda: stub.ModelMetadata(pb.ModelMetadataRequest(name="relu"), timeout=10))
        record("ModelMetadataUnknown", lambda: stub.ModelMetadata(pb.ModelMetadataRequest(name="nope"), timeout=10))
        record("ModelInfer", lambda: stub.ModelInfer(infer_request("r1"), timeout=10), clear=[("parameters",)])
        record("ModelInferUnknown", lambda: stub.ModelInfer(infer_request("r2", "nope"), timeout=10))
        record("ModelStreamInfer", lambda: sorted(stub.ModelStreamInfer(iter([infer_request("s1"), infer_request("s2")]),
                                                                         timeout=10),
                                                  key=lambda r: r.infer_response.id),
               clear=[("infer_response", "parameters")])
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService", "no.Such"):
            record(f"Health[{service}]", lambda: health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10))
        refl = reflection_pb2_grpc.ServerReflectionStub(channel)
        record("Reflection", lambda: list(refl.ServerReflectionInfo(iter([
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="inference.GRPCInferenceService"),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="no.Such")]), timeout=10)))
        # the infer answer is right, not only equal between the two
        r = stub.ModelInfer(infer_request("check"), timeout=10)
        np.testing.assert_array_equal(np.frombuffer(r.raw_output_contents[0], np.float32).reshape(2, 256), np.maximum(x, 0))
    return out


def test_mcpctl_serve_grpc_fast_answers_as_grpcio():
    servers = [InferenceServer("builtin:relu", "--grpc-frontend", kind, admin=False) for kind in ("fast", "grpcio")]
    starters = [threading.Thread(target=s.start) for s in servers]
    try:
        for t in starters:
            t.start()
        for t in starters:
            t.join(120)
        for s in servers:
            assert s.ready, f"mcpctl serve did not become ready:\n{s.log_tail()}"
        fast, grpcio = (kserve_answers(s.grpc) for s in servers)
    finally:
        for s in servers:
            s.stop()
    assert fast.keys() == grpcio.keys()
    for name in grpcio:
        assert fast[name] == grpcio[name], name
    assert grpcio["ModelInferUnknown"][:2] == ("error", grpc.StatusCode.NOT_FOUND)
    assert grpcio["ServerLive"] == ("ok", [{"live": True}])
    assert len(grpcio["ModelStreamInfer"][1]) == 2
