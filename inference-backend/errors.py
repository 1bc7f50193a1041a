"""Errors a request can end in, each with its gRPC status and HTTP status.

One table so that REST and gRPC always answer the same failure the same way.
Overload is RESOURCE_EXHAUSTED / 429 rather than UNAVAILABLE: the mesh's
error class for it is `overload`, and Envoy does not retry it by default
(retrying into a full queue only deepens it).
"""
from __future__ import annotations

import grpc


class InferenceError(Exception):
    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    http_status: int = 500

    def __init__(self, message: str):
        self.message = message
        super().__init__(message)


class InvalidArgument(InferenceError):
    code, http_status = grpc.StatusCode.INVALID_ARGUMENT, 400


class NotFound(InferenceError):
    code, http_status = grpc.StatusCode.NOT_FOUND, 404


class Overloaded(InferenceError):
    """Queue full, or timed out in the queue under timeout_action REJECT."""
    code, http_status = grpc.StatusCode.RESOURCE_EXHAUSTED, 429


class PermissionDenied(InferenceError):
    code, http_status = grpc.StatusCode.PERMISSION_DENIED, 403


class Unavailable(InferenceError):
    """Not ready (loading, or shutting down)."""
    code, http_status = grpc.StatusCode.UNAVAILABLE, 503


class TooLarge(InferenceError):
    code, http_status = grpc.StatusCode.RESOURCE_EXHAUSTED, 413


class Internal(InferenceError):
    code, http_status = grpc.StatusCode.INTERNAL, 500


class Unsupported(InferenceError):
    """A request for a feature this server does not offer (Triton's UNSUPPORTED)."""
    code, http_status = grpc.StatusCode.UNIMPLEMENTED, 400
