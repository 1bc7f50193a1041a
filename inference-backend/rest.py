"""KServe v2 REST front end (aiohttp), with the binary-tensor extension.

A body with `Inference-Header-Content-Length: N` is N bytes of JSON followed
by the inputs' raw bytes, each input declaring `parameters.binary_data_size`
(what tritonclient.http sends by default). Outputs come back binary when the
request asks (`outputs[].parameters.binary_data`, or `binary_data_output`
with no outputs listed) and as JSON `data` otherwise.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Awaitable, Callable, NamedTuple

from aiohttp import web

from mesh.qos import QosClass
from inference_backend import datatypes, fastjson, triton_http
from inference_backend.errors import InferenceError, InvalidArgument, NotFound, TooLarge
from inference_backend.model_server import ModelServer
from inference_backend.rest_body import BodyDecoder
from inference_backend.request_meta import QosAdmission, response_parameters, timing_pairs

log = logging.getLogger("inference_backend")
SERVER_NAME = "mcp-mesh-inference"
SERVER_VERSION = "0.1.0"
EXTENSIONS = ["binary_tensor_data", "schedule_policy", "sequence", "model_stream_infer", "orca_load_report", "hot_reload",
              # Triton's names: perf_analyzer reads server-side statistics only when "statistics" is listed
              "model_configuration", "statistics", "model_repository", "parameters"]
HEADER_LENGTH = "Inference-Header-Content-Length"
HEADER_LENGTH_LOWER = HEADER_LENGTH.lower()


def error_response(e: InferenceError) -> web.Response:
    return web.json_response({"error": e.message}, status=e.http_status)


class Answer(NamedTuple):
    """An infer answer, whatever front end sends it."""
    status: int
    headers: list[tuple[str, str]]      # besides Content-Type and Content-Length
    body: bytes
    content_type: str
    charset: str | None = None          # Content-Type: {content_type}; charset={charset}


def error_answer(status: int, message: str) -> Answer:
    """The {"error": ...} body web.json_response would send."""
    return Answer(status, [], json.dumps({"error": message}).encode(), "application/json", "utf-8")


class InferCore:
    """The KServe v2 infer semantics, once: the aiohttp route below and the fast lane
    (rest_fast.py) both call answer()."""

    def __init__(self, server: ModelServer, max_body_bytes: int, only_class: QosClass | None = None):
        self.server = server
        self.max_body_bytes = max_body_bytes
        self.admission = QosAdmission(server.session_key, server.telemetry, only_class, server.session_max_age)
        self.bodies = BodyDecoder(max_body_bytes)

    async def answer(self, name: str, version: str, headers, read_body: Callable[[], Awaitable[bytes]],
                     method: str = "POST") -> Answer:
        """`headers`: the request's (name, value) pairs; `read_body` raises TooLarge over the limit.
        Never raises: a failure is its error answer."""
        try:
            return await self._infer(name, version, headers, read_body, method)
        except InferenceError as e:     # every answer is counted, refusals and failures too
            self.server.telemetry.requests.add(1, {"model": name, "protocol": "http", "code": e.code.name})
            return error_answer(e.http_status, e.message)
        except Exception as e:  # never take the server down for one request
            log.exception("REST infer failed")
            self.server.telemetry.requests.add(1, {"model": name, "protocol": "http", "code": "INTERNAL"})
            return error_answer(500, f"internal error: {type(e).__name__}: {e}")

    async def _infer(self, name, version, headers, read_body, method) -> Answer:
        t0 = time.monotonic_ns()
        served = self.server.get(name, version)
        try:
            return await self._answer(served, headers, read_body, method, t0)
        except InferenceError:
            served.stats.on_failure(served.model.version, time.monotonic_ns() - t0)
            raise

    async def _answer(self, served, headers, read_body, method: str, t0: int) -> Answer:
        server, admission = self.server, self.admission
        with served.arrival():          # the batcher's idle dispatch waits for this one
            qos = admission.admit(headers, served.name, method)
            body = await read_body()
            header_len = next((v for k, v in headers if k.lower() == HEADER_LENGTH_LOWER), None)
            if header_len is not None:
                try:
                    n = int(header_len)
                except ValueError:
                    raise InvalidArgument(f"{HEADER_LENGTH} {header_len!r} is not an integer") from None
                if not 0 <= n <= len(body):
                    raise InvalidArgument(f"{HEADER_LENGTH} {n} is outside the {len(body)}-byte body")
                view = memoryview(body)         # the tensors are decoded in place (np.frombuffer), not copied
                json_part, binary = bytes(view[:n]), view[n:]
            else:
                json_part, binary = body, b""
            # large JSON is parsed in the parser process, never on this loop (rest_body)
            decoded = await self.bodies.decode(json_part, binary, served.model)
            doc, names, binary_out, params = decoded.doc, decoded.outputs, decoded.binary_outputs, decoded.parameters
            pending = served.prepare(decoded.arrays, names, params)
            priority = admission.priority(params, qos, served.batcher.settings.default_priority_level, served.name)
        result = await served.infer(pending, qos, priority)
        server.telemetry.request_duration.record((result.queue_us + result.compute_us) / 1e6,
                                                 {"model": served.name, "priority_level": str(result.level)})
        server.telemetry.requests.add(1, {"model": served.name, "protocol": "http", "code": "OK"})
        server.telemetry.record_spans(served.name, result.level, pending.arrival_ns, result,
                                      str(doc.get("id", "")), "http")
        t_out = time.monotonic_ns()
        all_binary = not names and bool(params.get("binary_data_output", False))
        out_docs, chunks = [], []
        for name, array in result.outputs.items():
            spec = served.model.outputs[name]
            d = {"name": name, "datatype": spec.datatype, "shape": list(array.shape)}
            if all_binary or binary_out.get(name):
                raw = datatypes.to_raw(array)
                d["parameters"] = {"binary_data_size": len(raw)}
                chunks.append(raw)
            else:
                data = fastjson.output_data(array)
                d["data"] = datatypes.to_list(array) if data is None else data
            out_docs.append(d)
        response = {"model_name": served.name, "model_version": result.version,
                    "outputs": out_docs, "parameters": response_parameters(result)}
        if "id" in doc:
            response["id"] = doc["id"]
        headers = timing_pairs(result, served.load.header_value())
        text = fastjson.dumps(response)
        end = time.monotonic_ns()
        served.stats.on_success(result.version, pending.rows, result.batch_size, end - t0, result.queue_us * 1000,
                                result.assemble_us * 1000, result.compute_us * 1000, end - t_out)
        if chunks:
            headers.append((HEADER_LENGTH, str(len(text))))
            return Answer(200, headers, text + b"".join(chunks), "application/octet-stream")
        return Answer(200, headers, text, "application/json")


def build_app(server: ModelServer, max_body_bytes: int, only_class: QosClass | None = None,
              core: InferCore | None = None) -> web.Application:
    """`core`: the infer semantics to share with a fast lane (rest_fast.py); made here if None."""
    app = web.Application(client_max_size=max_body_bytes)
    routes = web.RouteTableDef()
    core = core or InferCore(server, max_body_bytes, only_class)

    async def close_bodies(_app):
        core.bodies.close()
    app.on_cleanup.append(close_bodies)

    @routes.get("/v2/health/live")
    async def live(_):
        return web.Response(status=200 if server.live else 503)

    @routes.get("/v2/health/ready")
    async def ready(_):
        return web.Response(status=200 if server.reports_ready else 503)

    @routes.get("/v2")
    async def server_metadata(_):
        return web.json_response({"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS})

    def _model(request):
        return server.get(request.match_info["name"], request.match_info.get("version", ""))

    @routes.get("/v2/models/{name}")
    @routes.get("/v2/models/{name}/versions/{version}")
    async def model_metadata(request):
        try:
            served = _model(request)
        except InferenceError as e:
            return error_response(e)
        m = served.model
        doc = m.metadata()
        doc.update({"execution_provider": m.provider, "device": m.device,
                    "load_seconds": round(m.load_seconds, 4), "warmup_seconds": round(m.warmup_seconds, 4)})
        return web.json_response(doc)

    @routes.get("/v2/models/{name}/ready")
    @routes.get("/v2/models/{name}/versions/{version}/ready")
    async def model_ready(request):
        try:
            _model(request)
        except NotFound as e:
            return error_response(e)
        except InferenceError:
            return web.Response(status=503)
        return web.Response(status=200)

    @routes.post("/v2/models/{name}/infer")
    @routes.post("/v2/models/{name}/versions/{version}/infer")
    async def infer(request):
        async def read_body() -> bytes:
            try:
                return await request.read()
            except web.HTTPRequestEntityTooLarge:
                raise TooLarge(f"request body exceeds {max_body_bytes} bytes") from None

        a = await core.answer(request.match_info["name"], request.match_info.get("version", ""),
                              request.headers.items(), read_body, request.method)
        return web.Response(status=a.status, body=a.body, headers=a.headers, content_type=a.content_type,
                            charset=a.charset)

    @routes.get("/metrics")
    async def metrics(_):
        return web.Response(body=server.telemetry.prometheus_text(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    app.add_routes(triton_http.routes(server))      # before /v2/models/{name}: /v2/models/stats
    app.add_routes(routes)
    return app
