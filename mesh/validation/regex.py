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

# Envoy NACKs a regex whose compiled RE2 program is larger than its runtime
# `re2.max_program_size.error_level`, 100 unless the bootstrap raises it (Istio's
# does; ours does not). A bootstrap that raises it should raise this with it.
RE2_MAX_PROGRAM_SIZE = 100


@lru_cache(maxsize=4096)
def regex_error(pattern: str) -> str | None:
    """None when Envoy would accept `pattern`, else the reason (RE2's own words)."""
    if len(pattern) > MAX_REGEX_LENGTH:
        return f"regex is too large, max length allowed is {MAX_REGEX_LENGTH}"
    if _re2 is None:  # pragma: no cover
        raise RuntimeError("google-re2 is required to validate regexes as Envoy does (pip install google-re2)")
    try:
        compiled = _re2.compile(pattern, options=_OPTIONS)
    except _re2.error as e:
        msg = e.args[0] if e.args else str(e)
        if isinstance(msg, bytes):
            msg = msg.decode("utf-8", "replace")
        return (f"invalid regex {pattern!r}: {msg}; Istio uses RE2 style regex-based match "
                "(https://github.com/google/re2/wiki/Syntax)")
    if compiled.programsize > RE2_MAX_PROGRAM_SIZE:
        return (f"regex {pattern!r} compiles to an RE2 program of size {compiled.programsize}, over the "
                f"{RE2_MAX_PROGRAM_SIZE} Envoy accepts (re2.max_program_size.error_level); simplify it")
    return None
