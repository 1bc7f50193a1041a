"""The Endpoint Picker Protocol over Envoy's ext_proc stream (one stream per
HTTP request): request headers (and the body, when Envoy is configured to
send it buffered) in; the pick out as the `x-gateway-destination-endpoint`
header and the same value in dynamic metadata `envoy.lb`, or an immediate
503 / 429. The request counts as in flight on its endpoint until the stream
ends (for a streamed answer, when the last chunk has passed).
"""
from __future__ import annotations

import logging
import os
import time

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from mesh import endpoint_picker as epp
from mesh import headers as H
from scheduler.requests import build_request
from scheduler.scheduling import Pick, Refusal

log = logging.getLogger("scheduler.epp")
UPGRADED = ":mcp-upgraded"                # internal key: the class a marked flow was upgraded to
MODEL_HEADER = "x-gateway-model-name"     # body-based routing: the `model` the body named


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


def _mutation(pick: Pick, model: str | None, upgraded: str | None = None) -> tuple[pb.CommonResponse, struct_pb2.Struct]:
    value = epp.format_endpoints(pick.endpoints)
    common = pb.CommonResponse()
    for name, v in ((epp.DESTINATION_ENDPOINT, value), (MODEL_HEADER, model), (H.QOS_CLASS, upgraded)):
        if v:
            opt = common.header_mutation.set_headers.add()
            opt.header.key, opt.header.raw_value = name, v.encode()
            opt.append_action = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
    metadata = struct_pb2.Struct()
    metadata.update({epp.DESTINATION_NAMESPACE: {epp.DESTINATION_ENDPOINT: value}})
    return common, metadata


def _refuse(refusal: Refusal) -> pb.ProcessingResponse:
    out = pb.ProcessingResponse()
    out.immediate_response.status.code = http_status_pb2.StatusCode.Value(
        {503: "ServiceUnavailable", 429: "TooManyRequests"}[refusal.status])
    out.immediate_response.body = refusal.reason.encode() + b"\n"
    out.immediate_response.details = "endpoint_picker:" + refusal.reason.replace(" ", "_")
    return out


def _source_address(request: pb.ProcessingRequest) -> str | None:
    """The downstream address Envoy sends as the `source.address` request attribute."""
    for attrs in request.attributes.values():
        if "source.address" in attrs.fields:
            return attrs.fields["source.address"].string_value or None
    return None


_FLOW_MARKS = None


def _flow_marks(state):
    """The loop's flow marks (scheduler/loop/marks.py): state.flow_marks, else $MCP_EPP_FLOW_MARKS."""
    global _FLOW_MARKS
    marks = getattr(state, "flow_marks", None)
    if marks is None and os.environ.get("MCP_EPP_FLOW_MARKS"):
        if _FLOW_MARKS is None:
            from scheduler.loop.marks import FlowMarks
            _FLOW_MARKS = FlowMarks(os.environ["MCP_EPP_FLOW_MARKS"])
        marks = _FLOW_MARKS
    return marks


class EndpointPicker(pb_grpc.ExternalProcessorServicer):
    """`state` gives the pool view, the loads and the Scheduler (scheduler.server.PickerState)."""

    def __init__(self, state):
        self.state = state

    async def Process(self, request_iterator, context):
        headers: dict[str, str] = {}
        subset = None
        body = bytearray()
        picked: str | None = None
        try:
            async for request in request_iterator:
                kind = request.WhichOneof("request")
                if kind == "request_headers":
                    headers, subset = _headers(request.request_headers), _subset(request)
                    marks = _flow_marks(self.state)
                    if marks is not None:          # the loop's upgrade-flow: a marked flow is served critical
                        upgraded = marks.lookup(_source_address(request), headers.get("x-forwarded-for"))
                        if upgraded:
                            headers[H.QOS_CLASS] = upgraded
                            headers[UPGRADED] = upgraded
                    if request.request_headers.end_of_stream:
                        response, picked = self._decide(headers, b"", subset, "request_headers")
                    else:
                        response = pb.ProcessingResponse(request_headers=pb.HeadersResponse())
                elif kind == "request_body":
                    body += request.request_body.body
                    if request.request_body.end_of_stream and picked is None:
                        response, picked = self._decide(headers, bytes(body), subset, "request_body")
                    else:
                        response = pb.ProcessingResponse(request_body=pb.BodyResponse())
                elif kind == "request_trailers":
                    response = pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
                elif kind == "response_headers":
                    served = _served(request)
                    if served and picked and served != picked:
                        # A retry walked the fallback list: count the request where it runs.
                        self.state.scheduler.finished(picked)
                        self.state.scheduler.started(served)
                        picked = served
                    response = pb.ProcessingResponse(response_headers=pb.HeadersResponse())
                elif kind == "response_body":
                    response = pb.ProcessingResponse(response_body=pb.BodyResponse())
                else:
                    response = pb.ProcessingResponse(response_trailers=pb.TrailersResponse())
                yield response
        finally:
            if picked:
                self.state.scheduler.finished(picked)

    def _decide(self, headers: dict, body: bytes, subset, phase: str) -> tuple[pb.ProcessingResponse, str | None]:
        started = time.perf_counter()
        view = self.state.view()
        if view is None:
            return _refuse(Refusal(503, "no pool configuration loaded")), None
        request, model = build_request(headers, body, view.objectives, subset)
        result = self.state.scheduler.pick(request, [e.key for e in view.endpoints], self.state.loads())
        self.state.record(result, time.perf_counter() - started)
        if isinstance(result, Refusal):
            return _refuse(result), None
        self.state.scheduler.started(result.endpoints[0])
        common, metadata = _mutation(result, model, headers.get(UPGRADED))
        out = pb.ProcessingResponse(dynamic_metadata=metadata)
        if phase == "request_headers":
            out.request_headers.response.CopyFrom(common)
        else:
            out.request_body.response.CopyFrom(common)
        return out, result.endpoints[0]
