"""What REST and gRPC both read off a request's headers, and write onto its answer."""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping

from mcp26.mesh import headers as H
from mcp26.mesh.session import DEFAULT_MAX_AGE_S, SessionError, verify_session
from mcp26.inference.batcher import Result
from mcp26.inference.errors import InvalidArgument, PermissionDenied
from mcp26.mesh.qos import QosClass

log = logging.getLogger("mcp26.inference")


def wire_pairs(headers: Mapping[str, str] | Iterable[tuple[str, str]],
               only: str | None = None) -> list[tuple[str, str]]:
    """(name, value) pairs with each value as the bytes it came in, one character per byte;
    `only`: just the pairs of that (lower-case) name, the others not converted.

    The signature covers bytes (mesh.session encodes values as latin-1), while
    aiohttp decodes a value as UTF-8 with surrogateescape and gRPC as UTF-8: a
    non-ASCII value (`end-user: €`) is turned back into its bytes here, so the
    session check judges it (403) instead of failing to encode it (500)."""
    out = []
    for k, v in headers.items() if isinstance(headers, Mapping) else headers:
        if only is not None and k.lower() != only:
            continue
        if isinstance(v, str):
            v = v.encode("utf-8", "surrogateescape")
        out.append((k, bytes(v).decode("latin-1")))
    return out


class QosAdmission:
    """Which QoS class a request is served at, and whether its `priority` parameter counts.

    Without --session-key-file the backend trusts `x-mcp-qos-class` as it comes
    (nothing could tell a mesh-set class from a client's). With a key, a class
    is honoured only when x-mcp-session-sig covers it: an unsigned class header
    is ignored (the request gets the default level) and the protocol's
    `priority` parameter, the client's own word, may lower the request but not
    raise it above the default level. Both are counted in
    mcp_inference_qos_ignored_total{reason} and logged (at most every 10 s)."""

    LOG_EVERY_S = 10.0

    def __init__(self, key: bytes | None, telemetry, only_class: QosClass | None = None,
                 max_age: float = DEFAULT_MAX_AGE_S):
        self.key = key
        self.max_age = max_age              # --session-max-age: how long a signature stays valid
        self.telemetry = telemetry
        self.only_class = only_class        # a priority worker's: see check_class
        self._last_log = 0.0
        self._unlogged = 0

    def admit(self, headers: Mapping[str, str] | Iterable[tuple[str, str]], model: str,
              method: str = "POST") -> str | None:
        """Session check (with a key), then the class the request is served at (None: the
        protocol's priority parameter or the default level). Cheap: before any body work."""
        # Without a key only the class header is read, so only its value is converted.
        pairs = wire_pairs(headers, only=H.QOS_CLASS if self.key is None else None)
        raws = [v for k, v in pairs if k.lower() == H.QOS_CLASS]
        raw = raws[0] if raws else None
        if self.key is None:
            if len(raws) > 1:    # which one the sidecar set cannot be told: neither is taken
                raise InvalidArgument(f"{H.QOS_CLASS} appears {len(raws)} times")
            qos = raw
        else:
            try:
                # The signature binds the method, x-request-id (in `pairs`) and its issue time
                # (fresh for max_age, mesh.session's skew allowed): another request's is refused.
                qos = verify_session(pairs, self.key, method=method, max_age=self.max_age).qos_class
            except SessionError as e:
                raise PermissionDenied(f"session check failed: {e.reason}") from None
            except (UnicodeError, ValueError) as e:   # whatever a value holds: a reason, not a 500
                raise PermissionDenied(f"session check failed: unreadable session header ({e})") from None
            if qos is None and raw is not None:
                self._ignored(model, "unsigned_class",
                              f"{H.QOS_CLASS}: {raw!r} is not covered by {H.SESSION_SIG}; served at the default level")
        check_class(qos, self.only_class)
        return qos

    def priority(self, params: Mapping, qos: str | None, default_level: int, model: str) -> int | None:
        """The protocol's priority parameter as far as it counts (see the class docstring)."""
        value = priority_param(params)
        if self.key is not None and qos is None and value and value < default_level:
            self._ignored(model, "priority_parameter",
                          f"parameter priority {value} would raise an unsigned request above the default "
                          f"level {default_level}; served at the default level")
            return None
        return value

    def _ignored(self, model: str, reason: str, message: str) -> None:
        self.telemetry.qos_ignored.add(1, {"model": model, "reason": reason})
        now = time.monotonic()
        if now - self._last_log >= self.LOG_EVERY_S:
            more = f" (and {self._unlogged} more since the last such line)" if self._unlogged else ""
            log.warning("QoS not honoured: %s%s", message, more)
            self._last_log, self._unlogged = now, 0
        else:
            self._unlogged += 1


def check_class(value: str | None, only_class: QosClass | None) -> None:
    """A priority worker (inference.priority_worker) serves one class only:
    anything else, or no class, is refused before any decoding work. The
    protocol's `priority` parameter does not count: it is the client's word,
    the class header is the mesh's (set by the sidecar from the verified caller;
    with a session key, only a signed class counts: QosAdmission)."""
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


# The answer's parameters every Result carries, as (name, Result attribute): REST's JSON
# (response_parameters) and gRPC's parameters map (grpc_service). Non-negative integers.
RESULT_PARAMETERS = (("queue_time_us", "queue_us"), ("compute_time_us", "compute_us"),
                     ("batch_size", "batch_size"), ("priority_level", "level"))


def response_parameters(result: Result) -> dict:
    out = {name: getattr(result, attr) for name, attr in RESULT_PARAMETERS}
    out.update(result.parameters)
    return out
