"""Triton's ModelConfig, ModelStatistics and repository RPCs on inference.GRPCInferenceService.

perf_analyzer (and tritonclient's get_model_config / get_inference_statistics /
get_model_repository_index / load_model / unload_model) call these. They are served by a
generic handler registered beside the KServe v2 core (grpc_service.py), under the same
service name, with the messages of protos/triton_extensions.proto. What they answer:
triton_config.py, statistics.py, repository.py.
"""
from __future__ import annotations

import grpc
from google.protobuf import json_format

from inference_backend import repository
from inference_backend.errors import InferenceError
from inference_backend.model_server import ModelServer
from inference_backend.protos import triton_extensions_pb2 as tpb
from inference_backend.triton_config import config_message

SERVICE = "inference.GRPCInferenceService"


def stats_docs(server: ModelServer, name: str = "", version: str = "") -> list[dict]:
    """Triton's model_stats entries: every known model's (name ""), or one model's."""
    if not name:
        return [doc for served in server.models.values() for doc in served.stats.docs()]
    served = server.lookup(name, version)
    return served.stats.docs(version)


def _params(request) -> dict:
    return {k: getattr(v, v.WhichOneof("parameter_choice")) if v.WhichOneof("parameter_choice") else None
            for k, v in request.parameters.items()}


class TritonExtensions:
    def __init__(self, server: ModelServer):
        self.server = server

    async def _call(self, context, fn):
        try:
            return fn()
        except InferenceError as e:
            await context.abort(e.code, e.message)

    async def ModelConfig(self, request, context):
        return await self._call(context, lambda: tpb.ModelConfigResponse(
            config=config_message(self.server.lookup(request.name, request.version))))

    async def ModelStatistics(self, request, context):
        def answer():
            response = tpb.ModelStatisticsResponse()
            for doc in stats_docs(self.server, request.name, request.version):
                json_format.ParseDict(doc, response.model_stats.add())
            return response
        return await self._call(context, answer)

    async def RepositoryIndex(self, request, context):
        return await self._call(context, lambda: json_format.ParseDict(
            {"models": repository.index(self.server, request.ready)}, tpb.RepositoryIndexResponse()))

    async def RepositoryModelLoad(self, request, context):
        def answer():
            repository.load(self.server, request.model_name, _params(request))
            return tpb.RepositoryModelLoadResponse()
        return await self._call(context, answer)

    async def RepositoryModelUnload(self, request, context):
        def answer():
            repository.unload(self.server, request.model_name, _params(request))
            return tpb.RepositoryModelUnloadResponse()
        return await self._call(context, answer)


def add_to_server(server: ModelServer, grpc_server) -> None:
    ext = TritonExtensions(server)
    methods = {
        "ModelConfig": (tpb.ModelConfigRequest, ext.ModelConfig),
        "ModelStatistics": (tpb.ModelStatisticsRequest, ext.ModelStatistics),
        "RepositoryIndex": (tpb.RepositoryIndexRequest, ext.RepositoryIndex),
        "RepositoryModelLoad": (tpb.RepositoryModelLoadRequest, ext.RepositoryModelLoad),
        "RepositoryModelUnload": (tpb.RepositoryModelUnloadRequest, ext.RepositoryModelUnload),
    }
    handlers = {name: grpc.unary_unary_rpc_method_handler(
        fn, request_deserializer=req.FromString, response_serializer=lambda m: m.SerializeToString())
        for name, (req, fn) in methods.items()}
    grpc_server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
