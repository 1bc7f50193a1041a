"""The L6 session signature: canonical form, HMAC-SHA256 signing, backend check.

The sidecar's Wasm filter sets the session headers from verified JWT claims
and attaches `x-mcp-session-sig` over them. L7 (routing, other filters) may
read those headers but not change them: the backend calls `verify_session`
and rejects a request whose session headers no longer match the signature.

Wire format of the signature header (the Wasm filter writes exactly this):

    x-mcp-session-sig: v1;h=end-user,x-mcp-tenant,x-mcp-qos-class;s=<64 lower-case hex>

`h` lists the signed headers in signing order (the order the control plane
configured); `s` is HMAC-SHA256(key, canonical) where

    canonical = "mcp-session-v1\\n" + "".join(f"{name}:{value}\\n" for name in h)

with `value` the header's value as received (no trimming, no case folding;
HTTP forbids CR/LF in values so the framing cannot be forged). A header
listed in `h` must be present exactly once. Because `h` itself is covered by
the MAC, dropping a header from the list invalidates the signature; and
`verify_session` insists that every *required* session header present on the
request is covered, so L7 cannot add one either.
"""
from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from mesh import headers as H

SIG_VERSION = "v1"
CANONICAL_PREFIX = b"mcp-session-v1\n"

# Headers that carry session state; any of these on a request must be covered.
SESSION_HEADERS = (H.END_USER, H.TENANT)
# What the control plane signs by default: the session headers and the QoS
# class (the backend's queues trust it, so L7 may not upgrade it either).
DEFAULT_SIGNED_HEADERS = (H.END_USER, H.TENANT, H.QOS_CLASS)

MIN_KEY_BYTES = 16


class SessionError(ValueError):
    """The request's session headers do not match x-mcp-session-sig."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True)
class VerifiedSession:
    signed: dict[str, str]      # header name -> value, as covered by the MAC

    @property
    def end_user(self) -> str | None:
        return self.signed.get(H.END_USER)

    @property
    def tenant(self) -> str | None:
        return self.signed.get(H.TENANT)

    @property
    def qos_class(self) -> str | None:
        return self.signed.get(H.QOS_CLASS)


def canonical(pairs: Iterable[tuple[str, str]]) -> bytes:
    out = bytearray(CANONICAL_PREFIX)
    for name, value in pairs:
        out += name.encode("latin-1") + b":" + value.encode("latin-1") + b"\n"
    return bytes(out)


def sign(pairs: Sequence[tuple[str, str]], key: bytes) -> str:
    """The x-mcp-session-sig value for these (name, value) pairs, in order."""
    low = [(n.lower(), v) for n, v in pairs]
    mac = hmac.new(key, canonical(low), hashlib.sha256)
    return f"{SIG_VERSION};h={','.join(n for n, _ in low)};s={mac.hexdigest()}"


def sign_headers(headers: Mapping[str, str], key: bytes,
                 names: Sequence[str] = DEFAULT_SIGNED_HEADERS) -> str:
    """Sign the headers of `names` that are present (as the filter does)."""
    low = {k.lower(): v for k, v in headers.items()}
    return sign([(n, low[n]) for n in names if n in low], key)


def parse_signature(value: str) -> tuple[list[str], str]:
    parts = value.strip().split(";")
    if len(parts) != 3 or parts[0] != SIG_VERSION:
        raise SessionError(f"malformed {H.SESSION_SIG}: expected '{SIG_VERSION};h=...;s=...'")
    if not parts[1].startswith("h=") or not parts[2].startswith("s="):
        raise SessionError(f"malformed {H.SESSION_SIG}: expected 'h=' then 's='")
    names = [n for n in parts[1][2:].split(",") if n] if parts[1][2:] else []
    if len(set(names)) != len(names):
        raise SessionError(f"{H.SESSION_SIG} lists a header twice")
    mac = parts[2][2:]
    if len(mac) != 64 or any(c not in "0123456789abcdef" for c in mac):
        raise SessionError(f"malformed {H.SESSION_SIG}: s= must be 64 lower-case hex digits")
    return names, mac


def verify_session(headers: Mapping[str, str] | Iterable[tuple[str, str]], key: bytes,
                   required: Sequence[str] = SESSION_HEADERS) -> VerifiedSession:
    """Check a request's session headers against its x-mcp-session-sig.

    `headers` is a mapping or (name, value) pairs (gRPC metadata); names are
    compared case-insensitively. Returns the verified session; raises
    SessionError with the reason otherwise. A request with no session headers
    and no signature is an anonymous session (empty `signed`).
    """
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    seen: dict[str, list[str]] = {}
    for k, v in pairs:
        seen.setdefault(k.lower(), []).append(v if isinstance(v, str) else v.decode("latin-1"))
    sig = seen.get(H.SESSION_SIG)
    present_required = [n for n in required if n in seen]
    if not sig:
        if present_required:
            raise SessionError(f"session header {present_required[0]!r} without {H.SESSION_SIG}")
        return VerifiedSession({})
    if len(sig) != 1:
        raise SessionError(f"{H.SESSION_SIG} appears {len(sig)} times")
    names, mac = parse_signature(sig[0])
    for n in present_required:
        if n not in names:
            raise SessionError(f"session header {n!r} is not covered by {H.SESSION_SIG}")
    signed = {}
    for n in names:
        values = seen.get(n)
        if not values:
            raise SessionError(f"signed header {n!r} is missing")
        if len(values) != 1:
            raise SessionError(f"signed header {n!r} appears {len(values)} times")
        signed[n] = values[0]
    expected = hmac.new(key, canonical(signed.items()), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, mac):
        raise SessionError("session headers do not match their signature (changed after signing, or wrong key)")
    return VerifiedSession(signed)


def check_session(headers, key: bytes, required: Sequence[str] = SESSION_HEADERS) -> str | None:
    """verify_session as a predicate: None when valid, else the reason."""
    try:
        verify_session(headers, key, required)
        return None
    except SessionError as e:
        return e.reason
