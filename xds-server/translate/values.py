"""Istio scalar values (durations, percentages, string matches) as Envoy protos.

Specs come validated, but a value this module cannot read raises ConfigError
naming the resource and field instead of a Python traceback: a change set is
taken whole or not at all.
"""
from __future__ import annotations

import re

from envoy.type.matcher.v3 import regex_pb2, string_pb2
from envoy.type.v3 import percent_pb2
from google.protobuf import duration_pb2

from mcp26.mesh.resources import Resource
from mcp26.mesh.diagnostics import ConfigError

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|us|µs|ns|m|s)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def fail(res: Resource, path: str, message: str) -> ConfigError:
    return ConfigError([res.diagnostic(path, message)])


def seconds(res: Resource, path: str, value) -> float:
    """A Go/protobuf duration ("1.5s", "100ms", "1h30m") in seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise fail(res, path, f"not a duration: {value!r} (expected e.g. 1s, 100ms, 1m30s)")
    return total


def duration(res: Resource, path: str, value) -> duration_pb2.Duration:
    secs = seconds(res, path, value)
    d = duration_pb2.Duration()
    d.seconds = int(secs)
    d.nanos = int(round((secs - int(secs)) * 1e9))
    return d


def fractional_percent(value: float) -> percent_pb2.FractionalPercent:
    """Istio's Percent (a double, 0-100) as istiod writes it: per million."""
    fp = percent_pb2.FractionalPercent()
    fp.numerator = int(round(float(value) * 10000))
    fp.denominator = percent_pb2.FractionalPercent.MILLION
    return fp


def percentage(spec: dict | None, legacy: int | None = None) -> percent_pb2.FractionalPercent:
    """`percentage: {value: X}`; the deprecated integer `percent`; else 100%."""
    if isinstance(spec, dict) and spec.get("value") is not None:
        return fractional_percent(spec["value"])
    if legacy is not None:
        fp = percent_pb2.FractionalPercent()
        fp.numerator = int(legacy)
        fp.denominator = percent_pb2.FractionalPercent.HUNDRED
        return fp
    return fractional_percent(100)


def string_match(spec: dict) -> string_pb2.StringMatcher | None:
    """Istio StringMatch {exact|prefix|regex} -> StringMatcher; None when empty."""
    m = string_pb2.StringMatcher()
    if "exact" in spec:
        m.exact = str(spec["exact"])
    elif "prefix" in spec:
        m.prefix = str(spec["prefix"])
    elif "regex" in spec:
        m.safe_regex.CopyFrom(regex(spec["regex"]))
    else:
        return None
    return m


def regex(pattern: str) -> regex_pb2.RegexMatcher:
    # Envoy's default engine is RE2, the engine validation checks with.
    return regex_pb2.RegexMatcher(regex=str(pattern))
