"""The L6 session signature: canonical form, HMAC-SHA256 signing, backend check.

The sidecar's Wasm filter sets the session headers from verified JWT claims
and attaches `x-mcp-session-sig` over them, bound to the request it was made
for. L7 (routing, other filters) may read those headers but not change them:
the backend calls `verify_session` and rejects a request whose session headers
no longer match the signature, or whose signature was made for another
request or too long ago. This docstring is the one wire definition; the C
filter (wasm-filters/src/header_contract.c) and the Lua equivalent mirror it
and tests check them byte for byte against `sign`.

Wire format (version 2; the Wasm filter writes exactly this):

    x-mcp-session-sig: v2;t=<issued, unix seconds>;h=end-user,x-mcp-tenant,x-mcp-qos-class;s=<64 lower-case hex>

`h` lists the signed headers in signing order (the order the control plane
configured); `s` is HMAC-SHA256(key, canonical) where

    canonical = "mcp-session-v2\\n"
              + f"t:{t}\\n"                   # issue time, decimal unix seconds
              + f":method:{method}\\n"        # the request's method
              + f"x-request-id:{rid}\\n"      # its x-request-id ("" when it has none)
              + "".join(f"{name}:{value}\\n" for name in h)

with every value as received (no trimming, no case folding; HTTP forbids CR/LF
in values, so the framing cannot be forged; the three request lines come first
and always, so a signed header cannot pose as one). A header listed in `h`
must be present exactly once. Because `h` itself is covered by the MAC,
dropping a header from the list invalidates the signature; `verify_session`
insists that every *required* session header present on the request is
covered, so L7 cannot add one either.

What is bound, and why not more (threat model in wasm-filters/README.md,
"Session signature"): the method, x-request-id (Envoy's connection manager
generates one before any filter runs, and keeps it through routing and
retries) and the issue time. `:path` and `:authority` are *not* bound: the
router applies a VirtualService `rewrite` (prefix / host rewrite) after the
filter signed, so the backend legitimately sees other values than the filter
did. The backend accepts a signature only while `now - t <= max_age + skew`
and `t <= now + skew` (defaults 30 s and 5 s).

Claim values: a value is carried only if `carriable(value)`: 1..1024 bytes
of visible ASCII, SP and HTAB, with no SP/HTAB at either end. HTTP/1 strips
leading and trailing whitespace from a field value, so a signature over
`' jane '` could never verify; trimming would make two IdP identities
(`' admin'`, `'admin'`) one. The filter therefore does not write (nor sign) a
claim it cannot carry, exactly as for control characters, and `sign` /
`verify_session` refuse such values.

v1 (`mcp-session-v1`, no request binding, valid forever) is no longer
accepted.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import time
from dataclasses import dataclass
from collections.abc import Iterable, Mapping, Sequence

from mcp26.mesh import headers as H

SIG_VERSION = "v2"
CANONICAL_PREFIX = b"mcp-session-v2\n"
REQUEST_ID = "x-request-id"
METHOD = ":method"

# Freshness: a signature is accepted for MAX_AGE_S after it was issued, with
# CLOCK_SKEW_S allowed either way between the signing proxy's and the backend's
# clocks.
DEFAULT_MAX_AGE_S = 30.0
DEFAULT_CLOCK_SKEW_S = 5.0

MAX_VALUE = 1024            # the filter's limit on a claim value (bytes)

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
    issued_at: int | None = None

    @property
    def end_user(self) -> str | None:
        return self.signed.get(H.END_USER)

    @property
    def tenant(self) -> str | None:
        return self.signed.get(H.TENANT)

    @property
    def qos_class(self) -> str | None:
        return self.signed.get(H.QOS_CLASS)


def carriable(value: str | bytes) -> bool:
    """Can this claim value travel in a header unchanged (see the module docstring)?"""
    b = value.encode("latin-1") if isinstance(value, str) else bytes(value)
    if not 0 < len(b) <= MAX_VALUE or b[0] in b" \t" or b[-1] in b" \t":
        return False
    return all((c >= 0x20 or c == 9) and c < 0x7F for c in b)


def canonical(pairs: Iterable[tuple[str, str]], *, issued_at: int, method: str, request_id: str) -> bytes:
    out = bytearray(CANONICAL_PREFIX)
    for name, value in (("t", str(issued_at)), (METHOD, method), (REQUEST_ID, request_id), *pairs):
        out += name.encode("latin-1") + b":" + value.encode("latin-1") + b"\n"
    return bytes(out)


def sign(pairs: Sequence[tuple[str, str]], key: bytes, *, method: str, request_id: str = "",
         issued_at: int | None = None) -> str:
    """The x-mcp-session-sig value for these (name, value) pairs, in order, bound to a request."""
    low = [(n.lower(), v) for n, v in pairs]
    for n, v in low:
        if not carriable(v):
            raise ValueError(f"{n}: {v!r} cannot be carried in a header unchanged")
    t = int(time.time()) if issued_at is None else int(issued_at)
    mac = hmac.new(key, canonical(low, issued_at=t, method=method, request_id=request_id), hashlib.sha256)
    return f"{SIG_VERSION};t={t};h={','.join(n for n, _ in low)};s={mac.hexdigest()}"


def sign_headers(headers: Mapping[str, str], key: bytes, names: Sequence[str] = DEFAULT_SIGNED_HEADERS, *,
                 method: str | None = None, issued_at: int | None = None) -> str:
    """Sign the headers of `names` that are present (as the filter does), bound to the
    request's method (`method`, else the `:method` header, else POST: gRPC) and x-request-id."""
    low = {k.lower(): v for k, v in headers.items()}
    return sign([(n, low[n]) for n in names if n in low], key, method=method or low.get(METHOD, "POST"),
                request_id=low.get(REQUEST_ID, ""), issued_at=issued_at)


def parse_signature(value: str) -> tuple[int, list[str], str]:
    """-> (issued_at, signed header names, hex MAC)."""
    parts = value.strip().split(";")
    if len(parts) != 4 or parts[0] != SIG_VERSION:
        raise SessionError(f"malformed {H.SESSION_SIG}: expected '{SIG_VERSION};t=...;h=...;s=...'")
    if not parts[1].startswith("t=") or not parts[2].startswith("h=") or not parts[3].startswith("s="):
        raise SessionError(f"malformed {H.SESSION_SIG}: expected 't=', 'h=' then 's='")
    t = parts[1][2:]
    if not t.isdigit() or not 0 < len(t) <= 12 or t[0] == "0":
        raise SessionError(f"malformed {H.SESSION_SIG}: t= must be unix seconds")
    names = [n for n in parts[2][2:].split(",") if n] if parts[2][2:] else []
    if len(set(names)) != len(names):
        raise SessionError(f"{H.SESSION_SIG} lists a header twice")
    if any(n in (METHOD, REQUEST_ID) for n in names):
        raise SessionError(f"{H.SESSION_SIG} lists a request-binding header")
    mac = parts[3][2:]
    if len(mac) != 64 or any(c not in "0123456789abcdef" for c in mac):
        raise SessionError(f"malformed {H.SESSION_SIG}: s= must be 64 lower-case hex digits")
    return int(t), names, mac


def verify_session(headers: Mapping[str, str] | Iterable[tuple[str, str]], key: bytes,
                   required: Sequence[str] = SESSION_HEADERS, *, method: str | None = None,
                   now: float | None = None, max_age: float = DEFAULT_MAX_AGE_S,
                   skew: float = DEFAULT_CLOCK_SKEW_S) -> VerifiedSession:
    """Check a request's session headers against its x-mcp-session-sig.

    `headers` is a mapping or (name, value) pairs (gRPC metadata); names are
    compared case-insensitively. `method` is the request's method (else its
    `:method` header). The request's x-request-id (at most one) is read from
    `headers`. Returns the verified session; raises SessionError with the
    reason otherwise. A request with no session headers and no signature is
    an anonymous session (empty `signed`).
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
    issued_at, names, mac = parse_signature(sig[0])
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
        if not carriable(values[0]):
            raise SessionError(f"signed header {n!r} has a value no filter signs (whitespace at an end, "
                               f"control or non-ASCII bytes)")
        signed[n] = values[0]
    rids = seen.get(REQUEST_ID, [])
    if len(rids) > 1:
        raise SessionError(f"{REQUEST_ID} appears {len(rids)} times")
    if method is None:
        method = (seen.get(METHOD) or [None])[0]
        if method is None:
            raise SessionError("the request's method is unknown: the signature cannot be checked")
    expected = hmac.new(key, canonical(signed.items(), issued_at=issued_at, method=method,
                                       request_id=rids[0] if rids else ""), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, mac):
        raise SessionError("session headers do not match their signature (changed after signing, "
                           "made for another request, or wrong key)")
    # Freshness after the MAC, so an attacker learns nothing from the time check.
    now = time.time() if now is None else now
    if issued_at > now + skew:
        raise SessionError(f"{H.SESSION_SIG} was issued {issued_at - now:.0f}s in the future (clock skew?)")
    if now - issued_at > max_age + skew:
        raise SessionError(f"{H.SESSION_SIG} expired: issued {now - issued_at:.0f}s ago (max {max_age:g}s)")
    return VerifiedSession(signed, issued_at)


def resign(headers: Mapping[str, str], key: bytes, name: str, value: str, *, now: float | None = None) -> str:
    """A new x-mcp-session-sig for `headers` with header `name` set to `value`: for the one trusted
    L7 component that changes a signed header, the Endpoint Picker serving a flow the decision
    loop upgraded (the QoS class). The incoming signature must verify first, so a forged or stale
    one is never laundered (SessionError); the new one keeps its issue time and header list (plus
    `name`). A request without a signature (anonymous) gets one over `name` alone."""
    low = {k.lower(): v for k, v in headers.items()}
    method, rid = low.get(METHOD, "POST"), low.get(REQUEST_ID, "")
    if H.SESSION_SIG not in low:
        return sign([(name, value)], key, method=method, request_id=rid)
    verified = verify_session(low, key, method=method, now=now)
    pairs = {**verified.signed, name: value}
    return sign(list(pairs.items()), key, method=method, request_id=rid, issued_at=verified.issued_at)


def read_key_file(path: str, flag: str = "--session-key-file") -> bytes:
    """The raw session key in `path` (surrounding whitespace stripped), which must be readable
    by its owner only and at least MIN_KEY_BYTES long; ValueError naming `flag` otherwise."""
    import stat
    with open(path, "rb") as f:
        mode = os.fstat(f.fileno()).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ValueError(f"{flag} {path}: mode {stat.S_IMODE(mode):04o}; the key must be readable "
                             f"by its owner only (chmod 600)")
        key = f.read().strip()
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"{flag} {path}: the key has {len(key)} bytes; at least {MIN_KEY_BYTES} are needed")
    return key


def check_session(headers, key: bytes, required: Sequence[str] = SESSION_HEADERS, **binding) -> str | None:
    """verify_session as a predicate: None when valid, else the reason."""
    try:
        verify_session(headers, key, required, **binding)
        return None
    except SessionError as e:
        return e.reason
