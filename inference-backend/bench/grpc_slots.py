"""Engine slots over KServe v2 gRPC: concurrent unary ModelInfer calls
multiplexed on a few HTTP/2 channels.

Requests are serialised once per priority and sent as bytes, and responses
are not parsed: the hot path does only what the server's answer requires of a
client, which is what Python can afford here. Two clients:
- `h2` (the default, `H2Slot`): our own HTTP/2 connections (h2_grpc.py), the
  request's header block encoded once per priority; ~5x less CPU a call than
  grpcio's (inference-backend/README.md, "mcp-bench's own gRPC client").
- `grpcio` (`GrpcSlot`, `--grpc-client grpcio`): grpcio's synchronous channel,
  calls as futures whose completion is handed to the event loop with
  call_soon_threadsafe (against `mcpctl serve`, c=32, 1,430-1,600 req/s where
  grpc.aio's coroutine per call drove 1,120-1,470).
The model's metadata is read through grpcio either way (once, at setup).
"""
from __future__ import annotations

import asyncio

import grpc
import numpy as np

from mcp26.inference.bench import errors
from mcp26.inference.bench.engine import OnDone
from mcp26.inference.bench.h2_grpc import H2GrpcConnection, header_block
from mcp26.inference.bench.target import Target, TargetError
from mcp26.inference.protos import grpc_service_pb2 as pb
from mcp26.mesh.headers import COMPUTE_TIME_US, QOS_CLASS, QUEUE_TIME_US

INFER = "/inference.GRPCInferenceService/ModelInfer"
METADATA = "/inference.GRPCInferenceService/ModelMetadata"


def _identity(b: bytes) -> bytes:
    return b


def open_channels(t: Target, count: int) -> list[grpc.Channel]:
    # distinct channel args stop grpc from sharing one subchannel (one TCP connection)
    return [grpc.insecure_channel(t.authority, options=[("mcp-bench.channel", i)])
            for i in range(max(1, count))]


async def fetch_metadata(t: Target, channel: grpc.Channel, timeout: float = 5.0) -> dict:
    call = channel.unary_unary(METADATA, request_serializer=pb.ModelMetadataRequest.SerializeToString,
                               response_deserializer=pb.ModelMetadataResponse.FromString)
    request = pb.ModelMetadataRequest(name=t.model, version=t.version or "")
    try:
        md = await asyncio.to_thread(call, request, timeout=timeout)
    except grpc.RpcError as e:
        if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            raise TargetError(f"cannot reach gRPC {t.authority}: {e.code().name} {e.details()}") from None
        raise TargetError(f"gRPC ModelMetadata {t.model!r} on {t.authority}: "
                          f"{e.code().name} {e.details()}") from None
    return {"name": md.name, "inputs": [{"name": i.name, "datatype": i.datatype, "shape": list(i.shape)}
                                        for i in md.inputs]}


def _raw(dtype: str, values: np.ndarray) -> bytes:
    if dtype == "BYTES":  # Triton's raw BYTES: 4-byte little-endian length, then the bytes
        out = bytearray()
        for v in values:
            b = str(v).encode()
            out += len(b).to_bytes(4, "little") + b
        return bytes(out)
    return values.astype(values.dtype.newbyteorder("<"), copy=False).tobytes()


def infer_request(t: Target, tensors, priority_level: int | None) -> bytes:
    req = pb.ModelInferRequest(model_name=t.model, model_version=t.version or "")
    for name, dtype, shape, values in tensors:
        req.inputs.add(name=name, datatype=dtype, shape=shape)
        req.raw_input_contents.append(_raw(dtype, values))
    if priority_level is not None:
        req.parameters["priority"].int64_param = priority_level
    return req.SerializeToString()


_KEYS = (QUEUE_TIME_US, COMPUTE_TIME_US)          # as grpcio's metadata spells them
_RAW_KEYS = tuple(k.encode() for k in _KEYS)       # as a decoded header block does (H2Slot)


def _timing(md, keys: tuple = _KEYS) -> tuple[float | None, float | None]:
    q = c = None
    for key, value in md or ():
        if key == keys[0]:
            q = float(value)
        elif key == keys[1]:
            c = float(value)
    return q, c


class GrpcSlot:
    def __init__(self, channel: grpc.Channel, payloads: list[bytes],
                 qos_headers: list[str | None], timeout: float):
        self.call = channel.unary_unary(INFER, request_serializer=_identity,
                                        response_deserializer=_identity)
        self.payloads = payloads
        self.metadata = [((QOS_CLASS, h),) if h else None for h in qos_headers]
        self.timeout = timeout          # the deadline travels with the call
        self.loop: asyncio.AbstractEventLoop | None = None

    def start(self, prio: int, on_done: OnDone) -> None:
        loop = self.loop or asyncio.get_running_loop()
        self.loop = loop
        future = self.call.future(self.payloads[prio], metadata=self.metadata[prio], timeout=self.timeout)
        # runs on a grpc thread: hand the finished call to the event loop
        future.add_done_callback(lambda f: loop.call_soon_threadsafe(_finish, f, on_done))

    def expire(self, older_than: float) -> None:
        pass   # gRPC deadlines end late calls with DEADLINE_EXCEEDED

    def close(self) -> None:
        pass


def _finish(call, on_done: OnDone) -> None:
    code = call.code()
    if code != grpc.StatusCode.OK:
        label = errors.TIMEOUT if code == grpc.StatusCode.DEADLINE_EXCEEDED else errors.grpc_error(code.value[0])
        on_done(label, None, None)
        return
    q, c = _timing(call.initial_metadata())
    if q is None and c is None:
        q, c = _timing(call.trailing_metadata())
    on_done(None, q, c)


async def close_channels(channels) -> None:
    for c in channels:
        c.close()


async def open_connections(t: Target, count: int) -> list[H2GrpcConnection]:
    conns = []
    try:
        for _ in range(max(1, count)):
            conns.append(H2GrpcConnection())
            await conns[-1].connect(t.host, t.port)
    except (OSError, asyncio.TimeoutError) as e:
        for c in conns:
            c.close()
        raise TargetError(f"cannot connect to gRPC {t.authority}: {e}") from None
    return conns


class H2Slot:
    """One call at a time on a shared H2GrpcConnection."""

    def __init__(self, conn: H2GrpcConnection, t: Target, payloads: list[bytes],
                 qos_headers: list[str | None], timeout: float):
        self.conn = conn
        self.payloads = payloads
        self.blocks = [header_block(t.authority, INFER, ((QOS_CLASS, h),) if h else (), timeout)
                       for h in qos_headers]
        self.call = None
        self.on_done: OnDone | None = None

    def start(self, prio: int, on_done: OnDone) -> None:
        self.on_done = on_done
        self.call = self.conn.call(self.blocks[prio], self.payloads[prio], self._done)

    def _done(self, status: int | None, headers: list, trailers: list) -> None:
        self.call = None
        on_done, self.on_done = self.on_done, None
        if status is None:
            on_done(errors.CLOSED, None, None)
        elif status:
            on_done(errors.TIMEOUT if status == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
                    else errors.grpc_error(status), None, None)
        else:
            q, c = _timing(headers, _RAW_KEYS)
            if q is None and c is None:
                q, c = _timing(trailers, _RAW_KEYS)
            on_done(None, q, c)

    def expire(self, older_than: float) -> None:
        call = self.call
        if call is not None and call.started < older_than:
            self.conn.cancel(call)
            self.call = None
            on_done, self.on_done = self.on_done, None
            on_done(errors.TIMEOUT, None, None)

    def close(self) -> None:
        pass            # the connections are closed by their owner (runner)
