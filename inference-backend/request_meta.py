"""What REST and gRPC both read off a request's headers, and write onto its answer."""
from __future__ import annotations

from typing import Iterable, Mapping

from mesh import headers as H
from mesh.session import SessionError, verify_session
from inference_backend.batcher import Result
from inference_backend.errors import InvalidArgument, PermissionDenied
from mesh.qos import QosClass


def check_session(headers: Mapping[str, str] | Iterable[tuple[str, str]], key: bytes | None) -> None:
    """With --session-key-file: the L6 session headers must match x-mcp-session-sig."""
    if key is None:
        return
    try:
        verify_session(headers, key)
    except SessionError as e:
        raise PermissionDenied(f"session check failed: {e.reason}") from None


def check_class(value: str | None, only_class: QosClass | None) -> None:
    """A priority worker (inference_backend.priority_worker) serves one class only:
    anything else, or no class, is refused before any decoding work. The
    protocol's `priority` parameter does not count: it is the client's word,
    the class header is the mesh's (set by the sidecar from the verified caller)."""
    if only_class is not None and (value or "").strip().lower() != only_class.header_value:
        raise PermissionDenied(f"this port serves only {H.QOS_CLASS}: {only_class.header_value} "
                               f"(got {value!r}); send other classes to the main port")


def priority_param(params: Mapping) -> int | None:
    value = params.get("priority")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"parameter priority must be a non-negative integer (1 is the highest), got {value!r}")
    return value


def timing_pairs(result: Result, load_report: str) -> list[tuple[str, str]]:
    """Server-side queue and compute time, and the ORCA load report."""
    return [(H.QUEUE_TIME_US, str(result.queue_us)), (H.COMPUTE_TIME_US, str(result.compute_us)),
            (H.ORCA_LOAD_REPORT, load_report)]


def response_parameters(result: Result) -> dict:
    out = {"queue_time_us": result.queue_us, "compute_time_us": result.compute_us,
           "batch_size": result.batch_size, "priority_level": result.level}
    out.update(result.parameters)
    return out
