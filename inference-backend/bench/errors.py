"""Error labels: `<mesh error class>/<detail>`, e.g. `client/http-404`,
`overload/RESOURCE_EXHAUSTED`, `unavailable/connect`, `timeout/deadline`.

The class half is always one of mesh.error_classes.ERROR_CLASSES, so REST and
gRPC runs report on one scale; gRPC codes map through the mesh's own table.
"""
from __future__ import annotations

from mcp26.mesh.error_classes import ERROR_CLASSES, GRPC_STATUS, error_class

GRPC_STATUS_NAMES = {v: k for k, v in GRPC_STATUS.items()}

CONNECT = "unavailable/connect"            # TCP connect refused / failed
CLOSED = "unavailable/connection-closed"   # peer closed with a request in flight
TIMEOUT = "timeout/deadline"               # no answer within --timeout
PROTOCOL = "server/bad-response"           # not parseable as HTTP/1.1


def http_error(status: int) -> str | None:
    """None for 2xx/3xx; else the class of an HTTP status, KServe-style:
    401/403 auth, 408/504 timeout, 429 overload, 502/503 unavailable."""
    if status < 400:
        return None
    if status in (401, 403):
        cls = "auth"
    elif status in (408, 504):
        cls = "timeout"
    elif status == 429:
        cls = "overload"
    elif status in (502, 503):
        cls = "unavailable"
    elif status < 500:
        cls = "client"
    else:
        cls = "server"
    return f"{cls}/http-{status}"


def grpc_error(code: int) -> str | None:
    if code == 0:
        return None
    return f"{error_class(code)}/{GRPC_STATUS_NAMES.get(code, str(code))}"


def error_class_of(label: str) -> str:
    cls = label.split("/", 1)[0]
    assert cls in ERROR_CLASSES, label
    return cls
