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

from mcp26.mesh.qos import QosClass
from mcp26.inference import datatypes, json_codec, triton_http
from mcp26.inference.errors import InferenceError, InvalidArgument, NotFound, TooLarge
from mcp26.inference.batch_queue import Pending
from mcp26.inference.model_server import ModelServer, when_done
from mcp26.inference.rest_body import Body, BodyDecoder
from mcp26.inference.request_meta import QosAdmission, response_parameters, timing_pairs

log = logging.getLogger("mcp26.inference")
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
    """The KServe v2 infer semantics, once: the aiohttp route below calls answer(), the fast
    lane (rest_fast.py) answer_soon(); both take the same steps (admission, split_body, the
    body's decoding, _prepare, then _reply or _failed)."""

    def __init__(self, server: ModelServer, max_body_bytes: int, only_class: QosClass | None = None):
        self.server = server
        self.max_body_bytes = max_body_bytes
        self.admission = QosAdmission(server.session_key, server.telemetry, only_class, server.session_max_age)
        self.bodies = BodyDecoder(max_body_bytes)

    async def answer(self, name: str, version: str, headers, read_body: Callable[[], Awaitable[bytes]],
                     method: str = "POST") -> Answer:
        """`headers`: the request's (name, value) pairs; `read_body` raises TooLarge over the limit.
        Never raises: a failure is its error answer."""
        t0 = time.monotonic_ns()
        served = None
        try:
            served = self.server.get(name, version)
            with served.arrival():          # the batcher's idle dispatch waits for this one
                qos = self.admission.admit(headers, served.name, method)
                json_part, binary = split_body(headers, await read_body())
                # large JSON is parsed in the parser process, never on this loop (rest_body)
                decoded = await self.bodies.decode(json_part, binary, served.model)
                pending, priority = self._prepare(served, decoded, qos)
            result = await served.infer(pending, qos, priority)
            return self._reply(served, decoded, pending.rows, pending.arrival_ns, result, t0)
        except Exception as e:  # never take the server down for one request
            return self._failed(name, served, t0, e)

    def answer_soon(self, name: str, version: str, headers, body: bytes, done: Callable[[Answer], None]) -> None:
        """answer() for a body already read whose JSON part is at most INLINE_JSON_BYTES (so
        decoded here), without a task: `done(answer)` is called on this loop, from the batch's
        completion. Without the task per request builtin:relu REST answers 1.27x the req/s at
        c=1 and 1.21x at c=16 (inference-backend/README.md, "Fast path")."""
        t0 = time.monotonic_ns()
        served = None
        try:
            served = self.server.get(name, version)
            with served.arrival():
                qos = self.admission.admit(headers, served.name, "POST")
                json_part, binary = split_body(headers, body)
                decoded = self.bodies.decode_inline(json_part, binary, served.model)
                pending, priority = self._prepare(served, decoded, qos)
            future = served.submit(pending, qos, priority)
        except Exception as e:
            done(self._failed(name, served, t0, e))
            return
        # not `pending` itself: the future's callback would hold the future (a reference cycle,
        # left to the cyclic GC; measured: relu REST c=64 p99 7.5 -> 11.4 ms)
        rows, arrival_ns = pending.rows, pending.arrival_ns

        def finished(f) -> None:
            try:
                answer = self._reply(served, decoded, rows, arrival_ns, f.result(), t0)
            except Exception as e:
                answer = self._failed(name, served, t0, e)
            done(answer)
        when_done(future, finished)

    def _failed(self, name: str, served, t0: int, e: Exception) -> Answer:
        """The error answer for `e`, counted (every answer is, refusals and failures too)."""
        name = served.name if served is not None else name
        if isinstance(e, InferenceError):
            if served is not None:
                served.stats.on_failure(served.model.version, time.monotonic_ns() - t0)
            self.server.telemetry.requests.add(1, {"model": name, "protocol": "http", "code": e.code.name})
            return error_answer(e.http_status, e.message)
        log.error("REST infer failed", exc_info=e)
        self.server.telemetry.requests.add(1, {"model": name, "protocol": "http", "code": "INTERNAL"})
        return error_answer(500, f"internal error: {type(e).__name__}: {e}")

    def _prepare(self, served, decoded: Body, qos: str | None) -> tuple[Pending, int | None]:
        pending = served.prepare(decoded.arrays, decoded.outputs, decoded.parameters)
        priority = self.admission.priority(decoded.parameters, qos, served.batcher.settings.default_priority_level,
                                           served.name)
        return pending, priority

    def _reply(self, served, decoded: Body, rows: int, arrival_ns: int, result, t0: int) -> Answer:
        server = self.server
        doc, names, binary_out, params = decoded.doc, decoded.outputs, decoded.binary_outputs, decoded.parameters
        t = server.telemetry
        t.request_duration.series(served.name, str(result.level)).observe((result.queue_us + result.compute_us) / 1e6)
        t.requests.series(served.name, "http", "OK").inc(1)
        t.record_spans(served.name, result.level, arrival_ns, result, str(doc.get("id", "")), "http")
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
                data = json_codec.output_data(array)
                d["data"] = datatypes.to_list(array) if data is None else data
            out_docs.append(d)
        response = {"model_name": served.name, "model_version": result.version,
                    "outputs": out_docs, "parameters": response_parameters(result)}
        if "id" in doc:
            response["id"] = doc["id"]
        headers = timing_pairs(result, served.load.header_value())
        text = json_codec.dumps(response)
        end = time.monotonic_ns()
        served.stats.on_success(result.version, rows, result.batch_size, end - t0, result.queue_us * 1000,
                                result.assemble_us * 1000, result.compute_us * 1000, end - t_out)
        if chunks:
            headers.append((HEADER_LENGTH, str(len(text))))
            return Answer(200, headers, text + b"".join(chunks), "application/octet-stream")
        return Answer(200, headers, text, "application/json")


def split_body(headers, body: bytes) -> tuple[bytes, bytes]:
    """(JSON part, binary tensors) of a body: Inference-Header-Content-Length splits them."""
    header_len = next((v for k, v in headers if k.lower() == HEADER_LENGTH_LOWER), None)
    if header_len is None:
        return body, b""
    try:
        n = int(header_len)
    except ValueError:
        raise InvalidArgument(f"{HEADER_LENGTH} {header_len!r} is not an integer") from None
    if not 0 <= n <= len(body):
        raise InvalidArgument(f"{HEADER_LENGTH} {n} is outside the {len(body)}-byte body")
    view = memoryview(body)         # the tensors are decoded in place (np.frombuffer), not copied
    return bytes(view[:n]), view[n:]


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
        doc = {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS}
        try:        # what `/infer` stands for (mcp-bench reads it)
            doc["default_model"] = server.default_name()
        except InferenceError:
            pass
        return web.json_response(doc)

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
    @routes.post("/v2/infer")                   # the short form: the default model (README)
    @routes.post("/infer")
    async def infer(request):
        async def read_body() -> bytes:
            try:
                return await request.read()
            except web.HTTPRequestEntityTooLarge:
                raise TooLarge(f"request body exceeds {max_body_bytes} bytes") from None

        a = await core.answer(request.match_info.get("name", ""), request.match_info.get("version", ""),
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
