"""KServe v2 gRPC front end: inference.GRPCInferenceService on grpc.aio.

Inputs come as `raw_input_contents` (what tritonclient sends) or typed
`contents`; outputs always go back as `raw_output_contents`, which every
KServe client reads. Server-side queue/compute time and the ORCA load report
travel in trailing metadata (Envoy reads ORCA from trailers for gRPC) and, for
streams, in each response's parameters.
"""
from __future__ import annotations

import asyncio
import logging
import time

import grpc
import numpy as np

from mcp26.mesh.qos import QosClass
from mcp26.inference import datatypes
from mcp26.inference.errors import InferenceError, InvalidArgument, NotFound
from mcp26.inference.model_server import ModelServer
from mcp26.inference.protos import grpc_service_pb2 as pb
from mcp26.inference.protos import grpc_service_pb2_grpc as pb_grpc
from mcp26.inference.request_meta import RESULT_PARAMETERS, QosAdmission, timing_pairs
from mcp26.inference.rest import EXTENSIONS, SERVER_NAME, SERVER_VERSION

log = logging.getLogger("mcp26.inference")


def param_value(p: pb.InferParameter):
    which = p.WhichOneof("parameter_choice")
    return getattr(p, which) if which else None


def set_param(p: pb.InferParameter, value) -> None:
    if isinstance(value, bool):
        p.bool_param = value
    elif isinstance(value, int):
        if value >= 0:
            p.uint64_param = value
        else:
            p.int64_param = value
    elif isinstance(value, float):
        p.double_param = value
    else:
        p.string_param = str(value)


def _typed_contents(name: str, datatype: str, shape, contents: pb.InferTensorContents) -> np.ndarray:
    field = datatypes.CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidArgument(f"input {name!r}: {datatype} cannot travel in typed contents; use raw_input_contents")
    values = getattr(contents, field)
    count = datatypes.element_count(shape)
    if len(values) != count:      # before converting any of them
        raise InvalidArgument(f"input {name!r}: {len(values)} values in contents.{field} for shape {list(shape)} ({count})")
    if datatype == "BYTES":
        return datatypes.from_list(name, datatype, shape, list(values))
    return np.array(values, dtype=datatypes.DTYPES[datatype]).reshape(shape)


def decode_request(served, request: pb.ModelInferRequest) -> tuple[dict, dict, list[str]]:
    """Tensors, parameters and requested outputs of a ModelInferRequest (InvalidArgument on any fault)."""
    raw = request.raw_input_contents
    inputs = request.inputs
    if raw and len(raw) != len(inputs):
        raise InvalidArgument(f"{len(raw)} raw_input_contents for {len(inputs)} inputs")
    if not inputs:
        raise InvalidArgument("request has no inputs")
    arrays = {}
    for i, t in enumerate(inputs):
        name, datatype = t.name, t.datatype     # (each read of a field makes a new str)
        if name in arrays:
            raise InvalidArgument(f"input {name!r} is given twice")
        dtype = datatypes.DTYPES.get(datatype)
        if dtype is None:
            raise InvalidArgument(f"input {name!r}: unknown datatype {datatype!r}")
        shape, size = served.model.raw_plan(name, datatype, t.shape)
        if raw:
            if t.HasField("contents"):
                raise InvalidArgument(f"input {name!r}: contents and raw_input_contents are exclusive")
            data = raw[i]
            if len(data) == size:       # the common case, its size known: no more checks
                arrays[name] = np.ndarray(shape, dtype, data)     # a read-only view
            else:                       # BYTES, or a size that is wrong (from_raw says how)
                arrays[name] = datatypes.from_raw(name, datatype, shape, data)
        else:
            arrays[name] = _typed_contents(name, datatype, shape, t.contents)
    # (each look at a map or repeated field makes its Python view: not for the usual empty ones)
    params = {k: param_value(v) for k, v in request.parameters.items()} if len(request.parameters) else {}
    return arrays, params, [o.name for o in request.outputs] if len(request.outputs) else []


def model_metadata(served) -> tuple[pb.ModelMetadataResponse, tuple]:
    m = served.model
    # The protocol's message has no field for it: the provider rides in metadata.
    trailers = (("x-mcp-execution-provider", m.provider), ("x-mcp-model-load-seconds", f"{m.load_seconds:.4f}"))
    return pb.ModelMetadataResponse(
        name=m.name, versions=served.versions(), platform=getattr(m, "platform", "onnxruntime_onnx"),
        inputs=[pb.ModelMetadataResponse.TensorMetadata(name=s.name, datatype=s.datatype, shape=list(s.shape))
                for s in m.inputs.values()],
        outputs=[pb.ModelMetadataResponse.TensorMetadata(name=s.name, datatype=s.datatype, shape=list(s.shape))
                 for s in m.outputs.values()]), trailers


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, server: ModelServer, only_class: QosClass | None = None):
        self.server = server
        self.admission = QosAdmission(server.session_key, server.telemetry, only_class, server.session_max_age)

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=self.server.live)

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=self.server.reports_ready)

    async def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=SERVER_VERSION, extensions=EXTENSIONS)

    async def ModelReady(self, request, context):
        try:
            self.server.get(request.name, request.version)
        except NotFound as e:
            await context.abort(e.code, e.message)
        except InferenceError:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=True)

    async def ModelMetadata(self, request, context):
        try:
            served = self.server.get(request.name, request.version)
        except InferenceError as e:
            await context.abort(e.code, e.message)
        response, trailers = model_metadata(served)
        context.set_trailing_metadata(trailers)
        return response

    def _prepare(self, request: pb.ModelInferRequest, metadata):
        """Everything before the batcher: admission, session check, decoding."""
        served = self.server.get(request.model_name, request.model_version)
        with served.arrival():
            qos = self.admission.admit(metadata, served.name)
            arrays, params, outputs = decode_request(served, request)
            pending = served.prepare(arrays, outputs, params)
            priority = self.admission.priority(params, qos, served.batcher.settings.default_priority_level, served.name)
        return served, pending, qos, priority

    def _respond(self, request: pb.ModelInferRequest, served, pending, result, t0: int) -> tuple[pb.ModelInferResponse, list]:
        t_out = time.monotonic_ns()
        t = self.server.telemetry
        t.request_duration.series(served.name, str(result.level)).observe((result.queue_us + result.compute_us) / 1e6)
        t.requests.series(served.name, "grpc", "OK").inc(1)
        t.record_spans(served.name, result.level, pending.arrival_ns, result, request.id, "grpc")
        response = pb.ModelInferResponse(model_name=served.name, model_version=result.version, id=request.id)
        params = response.parameters        # response_parameters(result), set without the dict
        for name, attr in RESULT_PARAMETERS:
            params[name].uint64_param = getattr(result, attr)
        for k, v in result.parameters.items():
            set_param(params[k], v)
        for name, array in result.outputs.items():
            spec = served.model.outputs[name]
            response.outputs.add(name=name, datatype=spec.datatype, shape=array.shape)
            response.raw_output_contents.append(datatypes.to_raw(array))
        end = time.monotonic_ns()
        served.stats.on_success(result.version, pending.rows, result.batch_size, end - t0, result.queue_us * 1000,
                                result.assemble_us * 1000, result.compute_us * 1000, end - t_out)
        return response, timing_pairs(result, served.load.header_value())

    async def _infer(self, request: pb.ModelInferRequest, metadata,
                     run_now: bool = False) -> tuple[pb.ModelInferResponse, list]:
        t0 = time.monotonic_ns()
        served = None
        try:
            served, pending, qos, priority = self._prepare(request, metadata)
            result = await served.infer(pending, qos, priority, run_now=run_now)
        except InferenceError:
            if served is None:      # found, then refused: Triton counts it as the model's failure
                served = self.server.models.get(request.model_name)
            if served is not None:
                served.stats.on_failure(served.model.version, time.monotonic_ns() - t0)
            raise
        return self._respond(request, served, pending, result, t0)

    def _count(self, request: pb.ModelInferRequest, code: grpc.StatusCode) -> None:
        """Refusals and failures are counted like answers (mcp_inference_requests_total{code})."""
        self.server.telemetry.count_request(request.model_name, "grpc", code.name)

    async def ModelInfer(self, request, context):
        try:
            # a unary call: a lone request runs at once (ServedModel.infer), unless other calls read
            # on this loop turn start after it (the lane says so): then they are batched together,
            # as a stream's requests are
            starting = getattr(context, "calls_starting", None)
            run_now = not (starting and starting())
            response, trailers = await self._infer(request, context.invocation_metadata() or (), run_now=run_now)
        except InferenceError as e:
            self._count(request, e.code)
            await context.abort(e.code, e.message)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # one bad request never takes the server down
            log.exception("gRPC infer failed")
            self._count(request, grpc.StatusCode.INTERNAL)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(e).__name__}: {e}")
        context.set_trailing_metadata(tuple(trailers))
        return response

    async def ModelStreamInfer(self, request_iterator, context):
        """Requests on a stream run concurrently (so they batch); each answer, or its
        error, comes back as soon as it is ready, matched by `id` as in Triton."""
        metadata = context.invocation_metadata() or ()
        out: asyncio.Queue = asyncio.Queue()
        tasks: set = set()

        async def one(req):
            try:
                response, _ = await self._infer(req, metadata)
                await out.put(pb.ModelStreamInferResponse(infer_response=response))
            except InferenceError as e:
                self._count(req, e.code)
                await out.put(pb.ModelStreamInferResponse(
                    error_message=e.message, infer_response=pb.ModelInferResponse(
                        model_name=req.model_name, model_version=req.model_version, id=req.id)))
            except Exception as e:
                log.exception("gRPC stream infer failed")
                self._count(req, grpc.StatusCode.INTERNAL)
                await out.put(pb.ModelStreamInferResponse(error_message=f"internal error: {type(e).__name__}: {e}"))

        async def read():
            try:
                async for req in request_iterator:
                    task = asyncio.create_task(one(req))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                if tasks:
                    await asyncio.gather(*list(tasks), return_exceptions=True)
            finally:
                await out.put(None)

        reader = asyncio.create_task(read())
        try:
            while (item := await out.get()) is not None:
                yield item
        finally:
            reader.cancel()
            for task in list(tasks):
                task.cancel()


def add_to_server(server: ModelServer, grpc_server: grpc.aio.Server, only_class: QosClass | None = None) -> None:
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(server, only_class), grpc_server)
