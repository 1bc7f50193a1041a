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

from mcp26.inference import repository
from mcp26.inference.errors import InferenceError, Unavailable
from mcp26.inference.model_server import ModelServer
from mcp26.inference.protos import triton_extensions_pb2 as tpb
from mcp26.inference.statistics import merge_docs
from mcp26.inference.triton_config import config_message

SERVICE = "inference.GRPCInferenceService"


def stats_docs(server: ModelServer, name: str = "", version: str = "") -> list[dict]:
    """Triton's model_stats entries: every known model's (name ""), or one model's."""
    if not name:
        return [doc for served in server.models.values() for doc in served.stats.docs()]
    served = server.lookup(name, version)
    return served.stats.docs(version)


async def all_stats_docs(server: ModelServer, name: str = "", version: str = "") -> list[dict]:
    """stats_docs summed over every worker process (`mcpctl serve --workers N`): this one's,
    then each peer's, read from its loopback admin listener (GET /admin/statistics)."""
    local = stats_docs(server, name, version)      # NotFound etc. raised here, before any peer is asked
    if not server.peer_admin_ports:
        return local
    import asyncio
    import aiohttp
    query = {"name": name, "version": version}

    async def peer(port: int) -> list[dict]:
        async with session.get(f"http://127.0.0.1:{port}/admin/statistics", params=query) as r:
            doc = await r.json()
            if r.status != 200:
                raise Unavailable(f"worker on admin port {port} did not give its statistics: {doc.get('error')}")
            return doc["model_stats"]
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            groups = await asyncio.gather(*(peer(p) for p in server.peer_admin_ports))
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        raise Unavailable(f"statistics of the other workers unavailable: {type(e).__name__}: {e}") from None
    return merge_docs([local, *groups])


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
        try:
            docs = await all_stats_docs(self.server, request.name, request.version)
        except InferenceError as e:
            await context.abort(e.code, e.message)
        response = tpb.ModelStatisticsResponse()
        for doc in docs:
            json_format.ParseDict(doc, response.model_stats.add())
        return response

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
