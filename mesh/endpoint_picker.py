"""The Gateway API Inference Extension's Endpoint Picker Protocol (v1.0.0):
the names a proxy and an Endpoint Picker (EPP) agree on, defined once.

Proxy -> EPP (ext_proc request): filter metadata `envoy.lb.subset_hint`
{"x-gateway-destination-endpoint-subset": ["ip:port", ...]} limits the pick to
those endpoints (an empty or ineligible list is a 503).

EPP -> proxy: the `x-gateway-destination-endpoint` header AND dynamic metadata
`envoy.lb` {"x-gateway-destination-endpoint": "ip:port[,ip:port...]"}, the
same value in both (the first endpoint is the pick, the rest fallbacks in
order); or an ImmediateResponse: 503 when nothing is eligible, 429 when a
sheddable request meets a saturated pool.

Proxy -> EPP on the response: metadata `envoy.lb`
{"x-gateway-destination-endpoint-served": "ip:port"}, the endpoint that
actually answered (after retries walked the fallback list).
"""
from __future__ import annotations

DESTINATION_ENDPOINT = "x-gateway-destination-endpoint"
DESTINATION_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
SERVED_KEY = "x-gateway-destination-endpoint-served"

# ext_proc processing modes (ProcessingMode fields -> enum names), for the
# gateway's filter and the picker alike (scheduler/README.md measures them).
# The request headers are always sent: Envoy holds them (and so the routing)
# only while the processor has them; skipped, the router picks a host before
# the body is read. ANSWER_MODE: request headers, the buffered body (the
# picker reads `model` and the prompt), response headers (the served endpoint;
# the answer of a `"stream": true` request is switched to STREAMED_RESPONSE_MODE
# by mode_override, the filter allowing exactly that override: the SSE body
# chunk by chunk through the picker). LEAN_MODE: without the response headers;
# Envoy keeps the stream open until the request has ended, whose close ends the
# in-flight count. DUPLEX_MODE: GIE's own (the body FULL_DUPLEX_STREAMED,
# answered after the whole body; no mode override is possible then).
ANSWER_MODE = {"request_header_mode": "SEND", "request_body_mode": "BUFFERED", "request_trailer_mode": "SKIP",
               "response_header_mode": "SEND", "response_body_mode": "NONE", "response_trailer_mode": "SKIP"}
LEAN_MODE = {**ANSWER_MODE, "response_header_mode": "SKIP"}
STREAMED_RESPONSE_MODE = {**ANSWER_MODE, "response_body_mode": "FULL_DUPLEX_STREAMED", "response_trailer_mode": "SEND"}
DUPLEX_MODE = {**STREAMED_RESPONSE_MODE, "request_body_mode": "FULL_DUPLEX_STREAMED", "request_trailer_mode": "SEND"}
# SESSION_MODE: what the picker switches a LEAN request to (mode_override on the request
# headers' answer) when it picks on the headers alone -- a live chat session's next turn goes
# where its history is cached (scheduler.picker.Scheduler.pick_by_session): no body, so one
# message instead of two; response trailers "sent" only so that Envoy keeps the stream open
# until the request has ended (the in-flight count's end; an HTTP/1.1 answer has no trailers, so
# nothing more is sent; with the request body NONE and nothing else asked, Envoy closes the
# stream at once). The filter must allow exactly this override (allowed_override_modes).
SESSION_MODE = {**LEAN_MODE, "request_body_mode": "NONE", "response_trailer_mode": "SEND"}
# gRPC initial metadata on the ext_proc stream of a route in ANSWER_MODE: the picker must then
# keep the response phases it was configured for, so it never picks such a request on headers.
PICKER_MODE_METADATA = "x-mcp-endpoint-picker-mode"
# An InferencePool annotation choosing its routes' mode: `lean` (the default) or
# `answer` (the served endpoint observed, SSE answers streamed through the picker).
MODE_ANNOTATION = "mcp-mesh.io/endpoint-picker-mode"
POOL_MODES = {"lean": LEAN_MODE, "answer": ANSWER_MODE}

# gRPC health services the EPP answers (grpc.health.v1): liveness while the
# process runs; the others only once it has a pool to pick from.
LIVENESS = "liveness"
READINESS_SERVICES = ("readiness", "envoy.service.ext_proc.v3.ExternalProcessor")
HEALTH_SERVICES = (LIVENESS, *READINESS_SERVICES)

# The InferenceObjective a request names (GIE's header), read by the picker.
OBJECTIVE_HEADER = "x-gateway-inference-objective"
# The mesh's session-affinity key: requests of one chat session go where their KV cache is.
SESSION_HEADER = "x-session-id"


def format_endpoints(endpoints: list[str]) -> str:
    return ",".join(endpoints)


def parse_endpoints(value: str) -> list[str]:
    return [e.strip() for e in value.split(",") if e.strip()]
