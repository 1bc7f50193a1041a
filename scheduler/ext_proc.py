"""The Endpoint Picker Protocol over Envoy's ext_proc stream (one stream per
HTTP request): request headers and body in; the pick out as the
`x-gateway-destination-endpoint` header and the same value in dynamic
metadata `envoy.lb`, or an immediate 503 / 429. The request counts as in
flight on its endpoint until its stream ends or its answer's last chunk has
passed. The modes (mesh/endpoint_picker.py; Envoy names them in the first
message's `protocol_config`):

- LEAN_MODE (the gateway's): headers, answered at once, then the whole body
  (BUFFERED), answered with the pick; a request without a body is picked on
  its headers. Nothing of the answer: Envoy keeps the stream of a request with
  a body open until the request has ended (the last SSE chunk included), so
  its close ends the in-flight count (a bodiless request's closes at the pick).
- ANSWER_MODE: the response headers too, with `x-gateway-destination-endpoint-served`
  (where retries ran the request: counted there from then on). The answer of
  a `"stream": true` request is switched to FULL_DUPLEX_STREAMED (mode_override,
  which the filter allows for exactly STREAMED_RESPONSE_MODE): every chunk
  passes through at once (echoed as `streamed_response`), the picker counts
  its SSE events, reads the final `usage`, and ends the count at the last chunk.
- DUPLEX_MODE (GIE's own): the body FULL_DUPLEX_STREAMED; Envoy sends headers
  and chunks without waiting, the picker answers the headers (with the pick)
  once the body has ended and echoes the body as one `streamed_response`.
"""
from __future__ import annotations

import json
import logging
import re
import time

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from envoy.type.v3 import http_status_pb2
from google.protobuf import json_format

from mcp26.mesh import endpoint_picker as epp
from mcp26.mesh import headers as H
from mcp26.mesh import session
from mcp26.scheduler.requests import MAX_BODY_PARSED, build_request
from mcp26.scheduler.picker import Pick, Refusal

log = logging.getLogger("scheduler.epp")
UPGRADED = ":mcp-upgraded"                # internal key: the class a marked flow was upgraded to
RESIGNED = ":mcp-resigned"                # internal key: its session signature, re-made with the new class
MODEL_HEADER = "x-gateway-model-name"     # body-based routing: the `model` the body named
_Mode = processing_mode_pb2.ProcessingMode
DUPLEX = _Mode.FULL_DUPLEX_STREAMED
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
_STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')

# The mode a streamed (SSE) answer is switched to, and a request picked on its headers (mesh/endpoint_picker.py).
STREAMED_RESPONSE_MODE = json_format.ParseDict(epp.STREAMED_RESPONSE_MODE, _Mode())
SESSION_MODE = json_format.ParseDict(epp.SESSION_MODE, _Mode())

# Answers without content, built once (serialised per write, never mutated).
_GO_ON = {
    "request_headers": pb.ProcessingResponse(request_headers=pb.HeadersResponse()),
    "request_body": pb.ProcessingResponse(request_body=pb.BodyResponse()),
    "request_trailers": pb.ProcessingResponse(request_trailers=pb.TrailersResponse()),
    "response_headers": pb.ProcessingResponse(response_headers=pb.HeadersResponse()),
    "response_body": pb.ProcessingResponse(response_body=pb.BodyResponse()),
    "response_trailers": pb.ProcessingResponse(response_trailers=pb.TrailersResponse()),
}
_STREAM_RESPONSE = pb.ProcessingResponse(response_headers=pb.HeadersResponse(), mode_override=STREAMED_RESPONSE_MODE)
_REFUSAL_CODES = {503: http_status_pb2.StatusCode.ServiceUnavailable, 429: http_status_pb2.StatusCode.TooManyRequests}


def _headers(msg) -> dict[str, str]:
    return {h.key.lower(): (h.value or h.raw_value.decode("latin-1")) for h in msg.headers.headers}


def _subset(request: pb.ProcessingRequest) -> tuple[str, ...] | None:
    ns = request.metadata_context.filter_metadata.get(epp.SUBSET_NAMESPACE)
    if ns is None or epp.SUBSET_KEY not in ns.fields:
        return None
    value = ns.fields[epp.SUBSET_KEY]
    if value.HasField("list_value"):
        return tuple(v.string_value for v in value.list_value.values)
    return tuple(epp.parse_endpoints(value.string_value))


def _served(request: pb.ProcessingRequest) -> str | None:
    ns = request.metadata_context.filter_metadata.get(epp.DESTINATION_NAMESPACE)
    if ns is not None and epp.SERVED_KEY in ns.fields:
        return ns.fields[epp.SERVED_KEY].string_value or None
    return None


def _picked(pick: Pick, model: str | None, upgrade: tuple, phase: str) -> pb.ProcessingResponse:
    """The pick as the answer to `phase` (request_headers or request_body): header mutation + envoy.lb.
    `upgrade`: the (header, value) pairs of a flow the loop upgraded (the class, its new signature)."""
    value = epp.format_endpoints(pick.endpoints)
    out = pb.ProcessingResponse()
    sets = getattr(out, phase).response.header_mutation.set_headers
    for name, v in ((epp.DESTINATION_ENDPOINT, value), (MODEL_HEADER, model), *upgrade):
        if v:
            sets.add(header=base_pb2.HeaderValue(key=name, raw_value=v.encode()), append_action=_OVERWRITE)
    out.dynamic_metadata.fields[epp.DESTINATION_NAMESPACE].struct_value.fields[
        epp.DESTINATION_ENDPOINT].string_value = value
    return out


def _refuse(refusal: Refusal) -> pb.ProcessingResponse:
    out = pb.ProcessingResponse()
    out.immediate_response.status.code = _REFUSAL_CODES[refusal.status]
    out.immediate_response.body = refusal.reason.encode() + b"\n"
    out.immediate_response.details = "endpoint_picker:" + refusal.reason.replace(" ", "_")
    return out


def _echo(phase: str, body: bytes, end_of_stream: bool) -> pb.ProcessingResponse:
    """FULL_DUPLEX_STREAMED: the processor sends the body on itself, unchanged."""
    out = pb.ProcessingResponse()
    streamed = getattr(out, phase).response.body_mutation.streamed_response
    streamed.body, streamed.end_of_stream = body, end_of_stream
    return out


def _answer_route(context) -> bool:
    """The route asked for ANSWER_MODE (its ext_proc stream carries PICKER_MODE_METADATA: answer)."""
    try:
        metadata = context.invocation_metadata() or ()
    except AttributeError:          # a test double without metadata
        return False
    return any(k == epp.PICKER_MODE_METADATA and v == "answer" for k, v in metadata)


def _source_address(request: pb.ProcessingRequest) -> str | None:
    """The downstream address Envoy sends as the `source.address` request attribute."""
    for attrs in request.attributes.values():
        if "source.address" in attrs.fields:
            return attrs.fields["source.address"].string_value or None
    return None



class SseWatch:
    """What the picker reads of a streamed answer passing through: SSE events and the final `usage`."""
    __slots__ = ("events", "tail", "usage")

    def __init__(self):
        self.events, self.tail, self.usage = 0, b"", None

    def feed(self, chunk: bytes) -> None:
        lines = (self.tail + chunk).split(b"\n")
        self.tail = lines.pop()[-65536:]              # an incomplete line waits for the next chunk (bounded)
        for line in lines:
            if line.startswith(b"data:"):
                self.events += 1
                if b'"usage"' in line:
                    self._read_usage(line[5:])

    def _read_usage(self, data: bytes) -> None:
        try:
            usage = json.loads(data).get("usage")
        except (ValueError, AttributeError, RecursionError):
            return
        if isinstance(usage, dict):
            self.usage = usage


class EndpointPicker(pb_grpc.ExternalProcessorServicer):
    """`state` gives the pool view, the loads and the Scheduler (scheduler.server.PickerState);
    `stream_responses`: switch the answers of `"stream": true` requests to FULL_DUPLEX_STREAMED
    (the filter must allow that mode override, as the mesh's and the harness's gateways do)."""

    def __init__(self, state, stream_responses: bool = True):
        self.state = state
        self.stream_responses = stream_responses

    async def Process(self, request_iterator, context):
        headers: dict[str, str] = {}
        subset = None
        body = bytearray()
        picked: str | None = None
        decided = duplex = streaming = sse = False
        watch: SseWatch | None = None
        by_headers = not _answer_route(context)      # may pick a live session's request on its headers
        try:
            async for request in request_iterator:
                kind = request.WhichOneof("request")
                if request.HasField("protocol_config"):          # the first message says the modes
                    duplex = request.protocol_config.request_body_mode == DUPLEX
                    streaming = request.protocol_config.response_body_mode == DUPLEX
                if kind == "request_body":
                    chunk = request.request_body
                    if decided:     # duplex past the parse limit: the rest streams through
                        if duplex:
                            yield _echo(kind, chunk.body, chunk.end_of_stream)
                            continue
                        # Picked on the headers, yet the body came: the filter does not allow
                        # SESSION_MODE (the saving is lost, the pick stands). Counted for operators.
                        if hasattr(self.state, "session_mode_refused"):
                            self.state.session_mode_refused += 1
                        yield _GO_ON[kind]
                        continue
                    body += chunk.body
                    if duplex and not chunk.end_of_stream and len(body) <= MAX_BODY_PARSED:
                        continue                      # the answers wait for the whole body
                    # BUFFERED sends the body in one message (end_of_stream false only when trailers follow)
                    whole = bytes(body) if chunk.end_of_stream or not duplex else b""
                    sse = self.stream_responses and b'"stream"' in whole and bool(_STREAM_TRUE.search(whole))
                    response, picked = self._decide(headers, whole, subset,
                                                    "request_headers" if duplex else "request_body")
                    decided = True
                    yield response
                    if duplex and not response.HasField("immediate_response"):
                        yield _echo(kind, bytes(body), chunk.end_of_stream)
                    body = bytearray()
                elif kind == "request_headers":
                    headers, subset = self._read(request, _headers(request.request_headers)), _subset(request)
                    if request.request_headers.end_of_stream:
                        response, picked = self._decide(headers, b"", subset, kind)
                        decided = True
                        yield response
                    elif not duplex:
                        fast = self._decide_by_session(headers, subset) if by_headers else None
                        if fast is None:
                            yield _GO_ON[kind]        # the pick waits for the body
                        else:
                            (response, picked), decided = fast, True
                            yield response
                    # duplex: the answer to the headers waits for the body (it carries the pick)
                elif kind == "response_headers":
                    served = _served(request)
                    if served and picked and served != picked:
                        # A retry walked the fallback list: count the request where it runs.
                        self.state.scheduler.finished(picked)
                        self.state.scheduler.started(served)
                        picked = served
                    if sse and not duplex and not request.response_headers.end_of_stream:
                        streaming, watch = True, SseWatch()
                        yield _STREAM_RESPONSE
                    else:
                        yield _GO_ON[kind]
                elif kind == "response_body":
                    chunk = request.response_body
                    if not streaming:
                        yield _GO_ON[kind]
                        continue
                    # Bookkeeping before the yield: Envoy may end the RPC as soon as it has the last
                    # chunk back, and a generator cancelled at its yield never runs what follows.
                    watch = watch or SseWatch()
                    watch.feed(chunk.body)
                    end = chunk.end_of_stream
                    if end:                       # the last chunk: the request is done
                        picked, watch = self._done(picked, watch)
                    yield _echo(kind, chunk.body, end)
                elif kind == "request_trailers":
                    if duplex and not decided:    # the body ended with trailers: pick now, then let them pass
                        response, picked = self._decide(headers, bytes(body), subset, "request_headers")
                        decided = True
                        yield response
                        if response.HasField("immediate_response"):
                            continue
                        yield _echo("request_body", bytes(body), False)
                    yield _GO_ON[kind]
                else:                             # response_trailers: the answer is over
                    picked, watch = self._done(picked, watch)
                    yield _GO_ON[kind]
        finally:
            # The stream ended first (Envoy may close it without a last chunk marked end_of_stream):
            # the request is over, and what streamed through is recorded all the same.
            self._done(picked, watch)

    def _read(self, request: pb.ProcessingRequest, headers: dict[str, str]) -> dict[str, str]:
        marks = getattr(self.state, "flow_marks", None)     # `mcpctl epp serve --flow-marks`
        if marks is not None:          # the loop's upgrade-flow: a marked flow is served critical
            upgraded = marks.lookup(_source_address(request))
            key = getattr(self.state, "session_key", None)
            if upgraded and key:
                # The backend honours only a signed class: re-sign, or the request would be
                # refused (a changed signed header) or served at the default level (unsigned).
                try:
                    headers[RESIGNED] = session.resign(headers, key, H.QOS_CLASS, upgraded)
                except (session.SessionError, ValueError) as e:
                    log.warning("flow upgrade not applied: %s", e)
                    self.state.upgrades_refused = getattr(self.state, "upgrades_refused", 0) + 1
                    upgraded = None
            if upgraded:
                headers[H.QOS_CLASS] = upgraded
                headers[UPGRADED] = upgraded
        return headers

    def _done(self, picked: str | None, watch: SseWatch | None) -> tuple[None, None]:
        """The answer has passed: the request stops counting in flight; what it streamed is recorded."""
        if picked:
            self.state.scheduler.finished(picked)
        if watch is not None and watch.events and hasattr(self.state, "record_stream"):
            self.state.record_stream(watch.events, watch.usage)
        return None, None

    def _decide_by_session(self, headers: dict, subset) -> tuple[pb.ProcessingResponse, str] | None:
        """A live session's request picked on its headers (Scheduler.pick_by_session), its body
        then skipped (SESSION_MODE); None where the body could change the decision: no session,
        or objectives by model name that only the body's `model` would select."""
        if not headers.get(epp.SESSION_HEADER):
            return None
        started = time.perf_counter()
        view = self.state.view()
        if view is None or (view.objectives and not headers.get(epp.OBJECTIVE_HEADER)):
            return None
        request, _ = build_request(headers, b"", view.objectives, subset)
        pick = self.state.scheduler.pick_by_session(request, [e.key for e in view.endpoints], self.state.loads())
        if pick is None:
            return None
        self.state.record(pick, time.perf_counter() - started, by_headers=True)
        response, endpoint = self._commit(pick, None, headers, "request_headers")
        response.mode_override.CopyFrom(SESSION_MODE)
        return response, endpoint

    def _decide(self, headers: dict, body: bytes, subset, phase: str) -> tuple[pb.ProcessingResponse, str | None]:
        started = time.perf_counter()
        view = self.state.view()
        if view is None:
            return _refuse(Refusal(503, "no pool configuration loaded")), None
        request, model = build_request(headers, body, view.objectives, subset)
        result = self.state.scheduler.pick(request, [e.key for e in view.endpoints], self.state.loads())
        self.state.record(result, time.perf_counter() - started, model=model)
        if isinstance(result, Refusal):
            return _refuse(result), None
        return self._commit(result, model, headers, phase)

    def _commit(self, pick: Pick, model: str | None, headers: dict, phase: str) -> tuple[pb.ProcessingResponse, str]:
        """The pick made: counted in flight on its endpoint, answered to `phase` (with the class and
        signature of a flow the loop upgraded)."""
        self.state.scheduler.started(pick.endpoints[0])
        upgrade = ((H.QOS_CLASS, headers.get(UPGRADED)), (H.SESSION_SIG, headers.get(RESIGNED)))
        return _picked(pick, model, upgrade, phase), pick.endpoints[0]
