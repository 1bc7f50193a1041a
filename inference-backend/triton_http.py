"""Triton's HTTP model-configuration, statistics and repository endpoints (the REST side of
triton_rpcs.py):

  GET  /v2/models/NAME[/versions/V]/config     the model's configuration (triton_config.py)
  GET  /v2/models[/NAME[/versions/V]]/stats    {"model_stats": [...]} (statistics.py)
  POST /v2/repository/index                    [{"name", "version", "state", "reason"?}], body {"ready": bool}?
  POST /v2/repository/models/NAME/load         {} ({"parameters": {...}}? body)
  POST /v2/repository/models/NAME/unload

Errors are {"error": "..."} with the status the gRPC side's code maps to.
"""
from __future__ import annotations

import json

from aiohttp import web

from mcp26.inference import repository
from mcp26.inference.errors import InferenceError, InvalidArgument
from mcp26.inference.triton_config import config_doc
from mcp26.inference.triton_rpcs import all_stats_docs


def _error(e: InferenceError) -> web.Response:
    return web.json_response({"error": e.message}, status=e.http_status)


async def _body(request) -> dict:
    if not request.can_read_body:
        return {}
    text = await request.read()
    if not text.strip():
        return {}
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise InvalidArgument(f"request body is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise InvalidArgument("request body must be a JSON object")
    return doc


def routes(server) -> list[web.RouteDef]:
    """Register these before /v2/models/{name}, which would take `stats` for a model name."""
    table = web.RouteTableDef()

    @table.get("/v2/models/stats")
    @table.get("/v2/models/{name}/stats")
    @table.get("/v2/models/{name}/versions/{version}/stats")
    async def stats(request):
        try:
            docs = await all_stats_docs(server, request.match_info.get("name", ""),
                                        request.match_info.get("version", ""))
        except InferenceError as e:
            return _error(e)
        return web.json_response({"model_stats": docs})

    @table.get("/v2/models/{name}/config")
    @table.get("/v2/models/{name}/versions/{version}/config")
    async def config(request):
        try:
            served = server.lookup(request.match_info["name"], request.match_info.get("version", ""))
        except InferenceError as e:
            return _error(e)
        return web.json_response(config_doc(served))

    @table.post("/v2/repository/index")
    async def index(request):
        try:
            doc = await _body(request)
        except InferenceError as e:
            return _error(e)
        return web.json_response(repository.index(server, bool(doc.get("ready", False))))

    @table.post("/v2/repository/models/{name}/load")
    @table.post("/v2/repository/models/{name}/unload")
    async def load_unload(request):
        try:
            doc = await _body(request)
            params = doc.get("parameters") or {}
            if not isinstance(params, dict):
                raise InvalidArgument("'parameters' must be an object")
            action = repository.load if request.path.endswith("/load") else repository.unload
            action(server, request.match_info["name"], params)
        except InferenceError as e:
            return _error(e)
        return web.Response(status=200)

    return list(table)
