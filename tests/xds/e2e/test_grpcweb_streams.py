"""gRPC-Web streams that would hang are answered and released (issue 11, item 11).

A truncated gRPC-Web frame without a content-length (chunked HTTP/1.1, h2c)
streams through the frame check, and a gRPC upstream (grpcio's asyncio
server) then waits forever for the rest of the message; so does a client that
just stops sending. The control plane bounds both with the HCM stream idle
timeout (here 2 s via $MCP_XDS_STREAM_IDLE_TIMEOUT; 300 s by default), and
the frame check answers a message over its limit RESOURCE_EXHAUSTED from the
headers. Real control plane, real gateway Envoy, real grpc.aio upstream.
"""
import asyncio
import os
import re
import shutil
import socket
import tempfile
import threading
import time

import grpc
import pytest

from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.control_plane import GATEWAY_NODE, ControlPlane, mesh_envoy, write_config
from mcp26.xds.cli import STREAM_IDLE_ENV
from mcp26.xds.translate.grpc_web import MAX_REQUEST_MESSAGE
from harness.manifests import documents, manifest

pytestmark = [pytest.mark.e2e, pytest.mark.adversarial]

IDLE_S = 2
BOUND_S = IDLE_S + 4          # answered by then, or the stream was left hanging
CTYPE = "application/grpc-web+proto"


class AioUpstream:
    """grpc.aio echo on its own loop and thread: the server that waits on a cut message."""

    def __init__(self):
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _start(self):
        async def unary(request, context):
            return request
        # As the real backend (inference-backend GRPC_MAX_MESSAGE): the gateway's limit must not rely on it.
        self.server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
        self.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "test.Echo", {"Unary": grpc.unary_unary_rpc_method_handler(unary)})])
        self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        await self.server.start()

    def start(self):
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def stop(self):
        asyncio.run_coroutine_threadsafe(self.server.stop(0), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


def config(gw_port: int, upstream: int) -> str:
    return documents(
        manifest("gateway.yaml", gw_port=gw_port),
        manifest("service_entry.yaml", name="echo", number=81, port_name="grpc", protocol="GRPC", upstream=upstream),
        manifest("gateway_route.yaml", name="gw", host="echo.mesh.local"))


@pytest.fixture(scope="module")
def gw():
    d = tempfile.mkdtemp(prefix="adv-grpcweb-")
    up = AioUpstream().start()
    port = free_port()
    write_config(d, "mesh.yaml", config(port, up.port))
    old = os.environ.get(STREAM_IDLE_ENV)
    os.environ[STREAM_IDLE_ENV] = str(IDLE_S)       # the control plane process inherits it
    try:
        cp = ControlPlane(d).start()
    finally:
        os.environ.pop(STREAM_IDLE_ENV) if old is None else os.environ.__setitem__(STREAM_IDLE_ENV, old)
    envoy = mesh_envoy(cp, labels={"istio": "ingressgateway"}, namespace="default")
    try:
        envoy.start()
        cp.wait_synced(GATEWAY_NODE, types=("CDS", "LDS", "RDS"))
        _wait_route(port)
        yield port, envoy
    finally:
        envoy.stop()
        cp.close()
        up.stop()
        shutil.rmtree(d, ignore_errors=True)


def _frame_header(length: int) -> bytes:
    return b"\x00" + length.to_bytes(4, "big")


def _request(headers: str) -> bytes:
    return (f"POST /test.Echo/Unary HTTP/1.1\r\nhost: echo.mesh.local\r\ncontent-type: {CTYPE}\r\n"
            f"x-grpc-web: 1\r\n{headers}\r\n").encode()


def _read_reply(s: socket.socket, timeout: float) -> tuple[bytes, float]:
    """Everything Envoy sends until it closes or finishes a response; and how long it took."""
    started = time.monotonic()
    s.settimeout(timeout)
    data = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            if head and (b"content-length: 0" in head.lower() or body.endswith(b"\r\n0\r\n\r\n")):
                break
    except socket.timeout:
        pass
    return data, time.monotonic() - started


def _grpc_status(reply: bytes) -> int | None:
    """grpc-status from the response headers (trailers-only) or the trailer frame in the body."""
    m = re.search(rb"grpc-status: ?(\d+)", reply, re.IGNORECASE)
    return int(m.group(1)) if m else None


def _wait_route(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    body = _frame_header(2) + b"ok"
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(_request(f"content-length: {len(body)}\r\n") + body)
                reply, _ = _read_reply(s, 5)
            if _grpc_status(reply) == 0:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError("gateway not routing gRPC-Web")


def _active(envoy, port: int) -> dict:
    stats = envoy.stats(r"(downstream_rq_active|upstream_rq_active)$")
    return {k: v for k, v in stats.items() if f"127.0.0.1_{port}" in k or "echo.mesh.local" in k}


def _wait_released(envoy, port: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while any(_active(envoy, port).values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_active(envoy, port).values()), _active(envoy, port)


@pytest.mark.parametrize("ended", [False, True], ids=["client-stalls", "body-ends"])
def test_truncated_chunked_frame_is_answered_within_the_idle_bound(gw, ended):
    port, envoy = gw
    frame = _frame_header(256) + b"abc"               # says 256 bytes, 3 follow
    body = b"%x\r\n" % len(frame) + frame + b"\r\n" + (b"0\r\n\r\n" if ended else b"")
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(_request("transfer-encoding: chunked\r\n") + body)
        reply, took = _read_reply(s, BOUND_S + 10)
    assert reply and took < BOUND_S, (took, reply)
    assert _grpc_status(reply) is not None, reply        # a gRPC status, not a bare reset
    _wait_released(envoy, port)


def test_many_stalled_streams_are_all_released(gw):
    port, envoy = gw
    frame = _frame_header(1 << 20) + b"x" * 10
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
    try:
        for s in socks:
            s.sendall(_request("transfer-encoding: chunked\r\n") + b"%x\r\n" % len(frame) + frame + b"\r\n")
        time.sleep(0.3)
        assert sum(_active(envoy, port).values()) >= 20     # they are held now ...
        replies = [_read_reply(s, BOUND_S + 10) for s in socks]
    finally:
        for s in socks:
            s.close()
    assert all(r and took < BOUND_S + 1 for r, took in replies), [t for _, t in replies]
    _wait_released(envoy, port)                            # ... and released


def test_frame_over_the_limit_gets_resource_exhausted_before_its_body(gw):
    port, envoy = gw
    size = MAX_REQUEST_MESSAGE + 1
    with socket.create_connection(("127.0.0.1", port)) as s:
        # Only the headers and the frame header: the answer must not wait for the 4 MiB.
        s.sendall(_request(f"content-length: {size + 5}\r\n") + _frame_header(size))
        reply, took = _read_reply(s, BOUND_S + 10)
    assert took < IDLE_S, (took, reply)          # from the frame check, not the idle timeout
    assert _grpc_status(reply) == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], reply
    _wait_released(envoy, port)


def test_a_truncated_frame_over_one_mib_with_a_length_is_answered(gw):
    """Over the frame check's buffering limit: streamed through, bounded by the idle timeout."""
    port, envoy = gw
    body = _frame_header(2 << 20) + b"y" * ((3 << 20) // 2)     # says 2 MiB, 1.5 MiB follow
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(_request(f"content-length: {len(body)}\r\n") + body)
        reply, took = _read_reply(s, BOUND_S + 10)
    assert reply and took < BOUND_S, (took, reply)
    assert _grpc_status(reply) is not None, reply
    _wait_released(envoy, port)
