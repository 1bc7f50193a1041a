"""OpenAI-compatible generation on the serving REST port: /v1/completions,
/v1/chat/completions, /v1/models, and GET /v1/load for the Endpoint Picker.

The fields the official `openai` client sends are read (model, prompt /
messages, max_tokens / max_completion_tokens, temperature, top_p, seed, n=1,
stop, stream, stream_options.include_usage, user); any other field is
ignored, as OpenAI does. One extension: `"return_token_ids": true` adds each
choice's generated token ids (`token_ids`) to a non-streamed answer.
Tokenisation and the chat template: inference.tokenizer. The loop:
inference.generation (every step through the model's batcher, so the
request's x-mcp-qos-class and the KV cache apply).

Errors are OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`:
400 invalid_request_error (bad field, context_length_exceeded), 403
permission_error (session check, a priority worker's other classes), 404
model_not_found, 413 body too large, 429 (queue full / timed out in it,
code rate_limit_exceeded), 500 server_error, 503 not ready. An error after a
stream began is one more event, `data: {"error": {...}}`, then the stream ends.

Model names: the served model's own name, and with `--openai-model
NAME=MODEL[:VERSION]` other names mapped to a served model (and, with
VERSION, only while that version is served: 404 otherwise). The answer's
`model` is the name asked for.
"""
from __future__ import annotations

import json
import logging
import time
import uuid

from aiohttp import web

from mcp26.mesh import headers as H
from mcp26.mesh.qos import QosClass
from mcp26.inference.decoder import MAX_CONTEXT
from mcp26.inference.errors import InferenceError, NotFound
from mcp26.inference.generation import Generation, SamplingParams
from mcp26.inference.load_state import server_snapshot
from mcp26.inference.request_meta import QosAdmission
from mcp26.inference.tokenizer import chat_prompt, encode

log = logging.getLogger("mcp26.inference")
MAX_BODY_BYTES = 1 << 20        # a prompt is at most MAX_CONTEXT byte tokens; 1 MiB is ample for JSON around it
DEFAULT_MAX_TOKENS = 16         # completions: OpenAI's default
DEFAULT_CHAT_MAX_TOKENS = 128   # chat: OpenAI's is "the rest of the context"; capped here, and to the context
MAX_STOP = 4
ROLES = ("system", "developer", "user", "assistant", "tool")
_TYPES = {400: "invalid_request_error", 403: "permission_error", 404: "invalid_request_error",
          413: "invalid_request_error", 429: "requests", 503: "server_error"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.code}}

    @classmethod
    def of(cls, e: InferenceError) -> "ApiError":
        code = {429: "rate_limit_exceeded", 404: "model_not_found"}.get(e.http_status)
        return cls(e.http_status, e.message, None, code)


def parse_model_map(items: list[str] | None) -> dict[str, tuple[str, str]]:
    """`NAME=MODEL[:VERSION]` flags -> {NAME: (MODEL, VERSION or "")}; ValueError names the bad one."""
    out = {}
    for item in items or []:
        name, sep, target = item.partition("=")
        model, _, version = target.partition(":")
        if not sep or not name or not model:
            raise ValueError(f"--openai-model {item!r}: expected NAME=MODEL[:VERSION]")
        out[name] = (model, version)
    return out


def register(app: web.Application, server, model_map: dict | None = None,
             only_class: QosClass | None = None) -> None:
    OpenAIApi(server, model_map or {}, only_class).add_routes(app)


class OpenAIApi:
    def __init__(self, server, model_map: dict, only_class: QosClass | None):
        self.server = server
        self.model_map = model_map
        self.created = int(time.time())
        self.admission = QosAdmission(server.session_key, server.telemetry, only_class, server.session_max_age)

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_get("/v1/models/{model}", self.get_model)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/load", self.load)

    # -- models ----------------------------------------------------------------------------
    def _names(self) -> list[tuple[str, object]]:
        out = []
        for name, served in self.server.models.items():
            if served.decoder:
                out.append((name, served))
        for alias, (model, version) in self.model_map.items():
            served = self.server.models.get(model)
            if served is not None and served.decoder and (not version or version == served.model.version):
                out.append((alias, served))
        return out

    def _card(self, name: str, served) -> dict:
        return {"id": name, "object": "model", "created": self.created, "owned_by": "mcp-mesh",
                "root": served.name, "version": served.model.version}

    async def list_models(self, _request):
        return web.json_response({"object": "list", "data": [self._card(n, s) for n, s in self._names()]})

    async def get_model(self, request):
        name = request.match_info["model"]
        for n, s in self._names():
            if n == name:
                return web.json_response(self._card(n, s))
        return self._error(ApiError(404, f"The model '{name}' does not exist", "model", "model_not_found"))

    def _resolve(self, name) -> object:
        if not isinstance(name, str) or not name:
            raise ApiError(400, "you must provide a model parameter", "model")
        model, version = self.model_map.get(name, (name, ""))
        try:
            served = self.server.get(model, version)
        except NotFound:
            raise ApiError(404, f"The model '{name}' does not exist", "model", "model_not_found") from None
        if not served.decoder:
            raise ApiError(400, f"model '{name}' is not a decoder; completions need one (builtin:tiny-decoder)",
                           "model")
        return served

    # -- load --------------------------------------------------------------------------------
    async def load(self, _request):
        return web.json_response(server_snapshot(self.server))

    # -- generation --------------------------------------------------------------------------
    async def completions(self, request):
        return await self._handle(request, chat=False)

    async def chat_completions(self, request):
        return await self._handle(request, chat=True)

    async def _handle(self, request, chat: bool):
        model_label = "?"
        t0 = time.monotonic()
        try:
            doc = await _read_json(request)
            served = self._resolve(doc.get("model"))
            model_label = served.name
            qos = self.admission.admit(request.headers.items(), served.name, request.method)
            prompt = _chat_prompt(doc) if chat else _completion_prompt(doc, served.model.extra.get("vocab", 256))
            sampling, stream, usage_in_stream = _sampling(doc, chat, len(prompt))
            gen = Generation(served, prompt, sampling, qos, None, served.generation_load)
            answer = _Answer(doc["model"], chat, gen, bool(doc.get("return_token_ids")))
            started = time.perf_counter()
            deltas = self._timed(gen.stream(), served.name, t0)
            if stream:
                response = await self._stream(request, served, answer, usage_in_stream, deltas)
            else:
                async for _ in deltas:
                    pass
                response = web.json_response(answer.whole(), headers={H.ORCA_LOAD_REPORT: served.load.header_value()})
            flows = self.server.flow_publisher        # `mcpctl serve --flow-ring`: this flow's figures
            if flows is not None:
                flows.publish(request.transport, len(gen.tokens), time.perf_counter() - started, gen.cached_tokens,
                              len(gen.prompt))
            self._count(model_label, "OK")
            return response
        except ApiError as e:
            self._count(model_label, str(e.status))
            return self._error(e)
        except InferenceError as e:
            self._count(model_label, e.code.name)
            return self._error(ApiError.of(e))
        except (ConnectionResetError, web.HTTPException):
            raise
        except Exception as e:  # never take the server down for one request
            log.exception("OpenAI API request failed")
            self._count(model_label, "INTERNAL")
            return self._error(ApiError(500, f"internal error: {type(e).__name__}: {e}"))

    async def _timed(self, deltas, model: str, t0: float):
        """The generation's deltas, timed into vLLM's histograms: the first token's wait, each
        gap between tokens, and (once it ends) the whole request."""
        t = self.server.telemetry
        last = None
        async for delta in deltas:
            now = time.monotonic()
            (t.ttft.series(model) if last is None else t.tpot.series(model)).observe(now - (t0 if last is None else last))
            last = now
            yield delta
        t.e2e.series(model).observe(time.monotonic() - t0)

    async def _stream(self, request, served, answer: "_Answer", usage_in_stream: bool, deltas):
        """Server-sent events. The response starts with the first text (so an error before
        it, e.g. a full queue, is still an HTTP status), then one chunk per delta."""
        response = None

        async def start():
            nonlocal response
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                                   H.ORCA_LOAD_REPORT: served.load.header_value()})
            await response.prepare(request)
            if answer.chat:
                await _event(response, answer.chunk({"role": "assistant", "content": ""}))
        try:
            async for delta in deltas:
                if response is None:
                    await start()
                await _event(response, answer.chunk(delta))
        except (InferenceError, ApiError) as e:
            if response is None:
                raise
            err = e if isinstance(e, ApiError) else ApiError.of(e)
            await _event(response, err.body())
            await response.write(b"data: [DONE]\n\n")
            return response
        if response is None:
            await start()
        await _event(response, answer.chunk(None, finish=True))
        if usage_in_stream:
            await _event(response, answer.usage_chunk())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _error(self, e: ApiError) -> web.Response:
        return web.json_response(e.body(), status=e.status)

    def _count(self, model: str, code: str) -> None:
        self.server.telemetry.count_request(model, "openai", code)


class _Answer:
    """The OpenAI objects of one generation: whole, or as stream chunks."""

    def __init__(self, model: str, chat: bool, gen: Generation, token_ids: bool):
        self.model, self.chat, self.gen, self.token_ids = model, chat, gen, token_ids
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def usage(self) -> dict:
        g = self.gen
        return {"prompt_tokens": len(g.prompt), "completion_tokens": len(g.tokens),
                "total_tokens": len(g.prompt) + len(g.tokens),
                "prompt_tokens_details": {"cached_tokens": g.cached_tokens}}

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": f"mcp-{self.gen.served.model.version}"}

    def whole(self) -> dict:
        g = self.gen
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": g.text, "refusal": None},
                      "logprobs": None, "finish_reason": g.finish_reason}
        else:
            choice = {"index": 0, "text": g.text, "logprobs": None, "finish_reason": g.finish_reason}
        if self.token_ids:
            choice["token_ids"] = list(g.tokens)
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": [choice],
                "usage": self.usage()}

    def chunk(self, delta, finish: bool = False) -> dict:
        reason = self.gen.finish_reason if finish else None
        if self.chat:
            choice = {"index": 0, "delta": {} if finish else (delta if isinstance(delta, dict) else {"content": delta}),
                      "logprobs": None, "finish_reason": reason}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": "" if finish else delta, "logprobs": None, "finish_reason": reason}
        return {**self._head("text_completion"), "choices": [choice]}

    def usage_chunk(self) -> dict:
        return {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [],
                "usage": self.usage()}


async def _event(response: web.StreamResponse, doc: dict) -> None:
    await response.write(b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n")


async def _read_json(request) -> dict:
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise ApiError(413, f"request body exceeds {MAX_BODY_BYTES} bytes")
    body = bytearray()
    async for chunk in request.content.iter_chunked(1 << 16):
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise ApiError(413, f"request body exceeds {MAX_BODY_BYTES} bytes")
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise ApiError(400, f"request body is not valid JSON: {type(e).__name__}") from None
    if not isinstance(doc, dict):
        raise ApiError(400, "request body must be a JSON object")
    return doc


def _completion_prompt(doc: dict, vocab: int) -> list[int]:
    p = doc.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]                       # a batch of one prompt
    if isinstance(p, str):
        ids = encode(p)
    elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        if min(p) < 0 or max(p) >= vocab:
            raise ApiError(400, f"prompt token ids must be in 0..{vocab - 1}", "prompt")
        ids = list(p)
    elif isinstance(p, list) and len(p) > 1:
        raise ApiError(400, "one prompt per request is served (send the others as their own requests)", "prompt")
    else:
        raise ApiError(400, "prompt must be a string, a list of token ids, or a list of one of those", "prompt")
    if not ids:
        raise ApiError(400, "prompt is empty (there is no beginning-of-text token to start from)", "prompt")
    return ids


def _chat_prompt(doc: dict) -> list[int]:
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ApiError(400, f"messages[{i}].role must be one of {', '.join(ROLES)}", f"messages[{i}].role")
    try:
        return encode(chat_prompt(messages))
    except ValueError as e:
        raise ApiError(400, str(e), "messages") from None


def _number(doc: dict, name: str, default, lo: float, hi: float, integer: bool = False):
    v = doc.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        raise ApiError(400, f"{name} must be {'an integer' if integer else 'a number'}", name)
    if not lo <= v <= hi:
        raise ApiError(400, f"{name} must be between {lo} and {hi}, got {v}", name)
    return v


def _sampling(doc: dict, chat: bool, prompt_len: int) -> tuple[SamplingParams, bool, bool]:
    n = _number(doc, "n", 1, 1, 128, integer=True)
    if n != 1:
        raise ApiError(400, "only n=1 is supported", "n")
    room = MAX_CONTEXT - prompt_len
    name = "max_completion_tokens" if chat and doc.get("max_completion_tokens") is not None else "max_tokens"
    given = _number(doc, name, None, 1, 1 << 31, integer=True)
    if prompt_len >= MAX_CONTEXT or (given is not None and given > room):
        raise ApiError(400, f"This model's maximum context length is {MAX_CONTEXT} tokens. However, you requested "
                            f"{prompt_len + (given or 1)} tokens ({prompt_len} in the prompt, {given or 1} in the "
                            f"completion).", name, "context_length_exceeded")
    max_tokens = given if given is not None else min(DEFAULT_CHAT_MAX_TOKENS if chat else DEFAULT_MAX_TOKENS, room)
    stop = doc.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif not (isinstance(stop, list) and len(stop) <= MAX_STOP and all(isinstance(s, str) for s in stop)):
        raise ApiError(400, f"stop must be a string or a list of at most {MAX_STOP} strings", "stop")
    seed = doc.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ApiError(400, "seed must be a non-negative integer", "seed")
    stream = doc.get("stream") or False
    if not isinstance(stream, bool):
        raise ApiError(400, "stream must be a boolean", "stream")
    options = doc.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", "stream_options")
    sampling = SamplingParams(max_tokens=max_tokens, temperature=float(_number(doc, "temperature", 1.0, 0, 2)),
                              top_p=float(_number(doc, "top_p", 1.0, 0, 1)), seed=seed, stop=stop)
    if sampling.top_p <= 0:
        raise ApiError(400, "top_p must be greater than 0", "top_p")
    return sampling, stream, bool(options.get("include_usage"))
