"""gRPC status code -> mesh error class (the L5 contract, `x-mcp-error-class`)."""
from __future__ import annotations

# Canonical gRPC status codes (grpc/status.proto numbering).
GRPC_STATUS = {
    "OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3,
    "DEADLINE_EXCEEDED": 4, "NOT_FOUND": 5, "ALREADY_EXISTS": 6,
    "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8, "FAILED_PRECONDITION": 9,
    "ABORTED": 10, "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12, "INTERNAL": 13,
    "UNAVAILABLE": 14, "DATA_LOSS": 15, "UNAUTHENTICATED": 16,
}

ERROR_CLASSES = ("ok", "client", "auth", "timeout", "overload", "unavailable", "server")

# Default map; the Wasm filter's config may override entries.
DEFAULT_ERROR_CLASS_MAP = {
    0: "ok",
    1: "client",        # CANCELLED
    2: "server",        # UNKNOWN
    3: "client",        # INVALID_ARGUMENT
    4: "timeout",       # DEADLINE_EXCEEDED
    5: "client",        # NOT_FOUND
    6: "client",        # ALREADY_EXISTS
    7: "auth",          # PERMISSION_DENIED
    8: "overload",      # RESOURCE_EXHAUSTED
    9: "client",        # FAILED_PRECONDITION
    10: "unavailable",  # ABORTED (retryable)
    11: "client",       # OUT_OF_RANGE
    12: "client",       # UNIMPLEMENTED
    13: "server",       # INTERNAL
    14: "unavailable",  # UNAVAILABLE
    15: "server",       # DATA_LOSS
    16: "auth",         # UNAUTHENTICATED
}


def error_class(grpc_status: int, overrides: dict[int, str] | None = None) -> str:
    if overrides and grpc_status in overrides:
        return overrides[grpc_status]
    return DEFAULT_ERROR_CLASS_MAP.get(grpc_status, "server")
