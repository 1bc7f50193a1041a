"""Regexes as Envoy compiles them: RE2 (google-re2), Istio's 1024-byte limit."""
from __future__ import annotations

from functools import lru_cache

try:
    import re2 as _re2
    _OPTIONS = _re2.Options()
    _OPTIONS.log_errors = False   # RE2 would print every rejected pattern to stderr
except ImportError:  # pragma: no cover - google-re2 is a declared dependency
    _re2 = None

MAX_REGEX_LENGTH = 1024   # Istio's approximation of Envoy's re2.max_program_size


@lru_cache(maxsize=4096)
def regex_error(pattern: str) -> str | None:
    """None when Envoy would accept `pattern`, else the reason (RE2's own words)."""
    if len(pattern) > MAX_REGEX_LENGTH:
        return f"regex is too large, max length allowed is {MAX_REGEX_LENGTH}"
    if _re2 is None:  # pragma: no cover
        raise RuntimeError("google-re2 is required to validate regexes as Envoy does (pip install google-re2)")
    try:
        _re2.compile(pattern, options=_OPTIONS)
    except _re2.error as e:
        msg = e.args[0] if e.args else str(e)
        if isinstance(msg, bytes):
            msg = msg.decode("utf-8", "replace")
        return (f"invalid regex {pattern!r}: {msg}; Istio uses RE2 style regex-based match "
                "(https://github.com/google/re2/wiki/Syntax)")
    return None
