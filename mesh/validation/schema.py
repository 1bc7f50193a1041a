"""A structural schema, as the Istio CRDs' openAPIV3Schema enforces it.

The API server rejects a field the schema does not know, a value of the wrong
type and two members of a oneof; this module does the same, naming the field
path. Semantic rules (host names, durations, ranges) are in the validators.

Schema notation: a dict is an object (field -> schema), `[s]` a list of s,
`Map(s)` a string-keyed map of s, `Enum(...)` a string enum, and the scalar
names in SCALARS.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

# Istio's durations: Go-style ("1h2m3.5s", "250ms"), as its CRDs accept them.
_DURATION = re.compile(r"^(?:(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))+$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000,
            "m": 60_000_000_000, "h": 3_600_000_000_000}

INT32 = (-(2 ** 31), 2 ** 31 - 1)
UINT32 = (0, 2 ** 32 - 1)
INT64 = (-(2 ** 63), 2 ** 63 - 1)
UINT64 = (0, 2 ** 64 - 1)


@lru_cache(maxsize=4096)
def duration_ns(text: str) -> int | None:
    """'1.5s' -> 1_500_000_000; None when not a duration."""
    if not isinstance(text, str) or not _DURATION.match(text):
        return None
    total = 0.0
    for number, unit in _DURATION_PART.findall(text):
        total += float(number) * _UNIT_NS[unit]
    return int(round(total))


@dataclass(frozen=True)
class Enum:
    values: tuple

    def __init__(self, *values: str):
        object.__setattr__(self, "values", tuple(values))


@dataclass(frozen=True)
class Map:
    value: Any


@dataclass(frozen=True)
class Obj:
    """An object with oneof groups (at most one member set) and required fields."""
    fields: dict
    oneof: tuple = ()
    required: tuple = ()


def _int_range(lo_hi: tuple) -> Callable[[Any], str | None]:
    lo, hi = lo_hi

    def check(v: Any) -> str | None:
        # protobuf JSON also takes 64-bit integers as strings
        if isinstance(v, str) and re.fullmatch(r"-?\d+", v):
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            return f"must be an integer, got {type(v).__name__} {v!r}"
        if not lo <= v <= hi:
            return f"{v} is out of range [{lo}, {hi}]"   # the type is sound
        return None
    return check


def _string(v: Any) -> str | None:
    return None if isinstance(v, str) else f"must be a string, got {type(v).__name__} {v!r}"


def _bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else f"must be a boolean, got {type(v).__name__} {v!r}"


def _number(v: Any) -> str | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return f"must be a number, got {type(v).__name__} {v!r}"
    return None


def _duration(v: Any) -> str | None:
    if not isinstance(v, str):
        return f"must be a duration string such as \"1s\" or \"250ms\", got {type(v).__name__} {v!r}"
    if duration_ns(v) is None:   # a string still: the type is sound
        return f"invalid duration {v!r}: expected a number with a unit (ns, us, ms, s, m, h), e.g. \"1.5s\""
    return None


SCALARS: dict[str, Callable[[Any], str | None]] = {
    "string": _string, "bool": _bool, "double": _number, "duration": _duration,
    "int32": _int_range(INT32), "uint32": _int_range(UINT32),
    "int64": _int_range(INT64), "uint64": _int_range(UINT64),
    "any": lambda v: None,
}


@dataclass
class SchemaErrors:
    errors: list = field(default_factory=list)   # (path, message)
    # A value of the wrong type: semantic rules cannot run on this spec.
    # (Unknown fields, oneof and range violations leave the types sound.)
    wrong_type: bool = False

    def add(self, path: str, message: str, wrong_type: bool = False) -> None:
        self.errors.append((path, message))
        self.wrong_type = self.wrong_type or wrong_type


def check(value: Any, schema: Any, path: str, out: SchemaErrors) -> None:
    """Walk `value` against `schema`, adding (path, message) for each violation."""
    if value is not None:   # an explicit null is the field unset, as protobuf JSON reads it
        compiled(schema)(value, path, out)


# id(schema) -> (schema, checker); holding the schema keeps its id unique.
_COMPILED: dict[int, tuple[Any, Callable]] = {}


def compiled(schema: Any) -> Callable[[Any, str, SchemaErrors], None]:
    """The schema turned into nested closures once: a 10,000-route config
    walks ~300k nodes, and dispatching on the schema's type at each one
    would cost more than the checks themselves."""
    hit = _COMPILED.get(id(schema))
    if hit is None:
        hit = _COMPILED[id(schema)] = (schema, _compile(schema))
    return hit[1]


def _compile(schema: Any) -> Callable[[Any, str, SchemaErrors], None]:
    if isinstance(schema, str):
        scalar = SCALARS[schema]
        if schema == "string":
            def check_string(v, path, out):
                if type(v) is not str:
                    out.add(path, scalar(v), wrong_type=True)
            return check_string

        def check_scalar(v, path, out):
            err = scalar(v)
            if err:
                out.add(path, err, wrong_type=err.startswith("must be"))
        return check_scalar
    if isinstance(schema, Enum):
        values = frozenset(schema.values)
        listed = ", ".join(schema.values)

        def check_enum(v, path, out):
            if not isinstance(v, str) or v not in values:
                out.add(path, f"unsupported value {v!r}: expected one of {listed}")
        return check_enum
    if isinstance(schema, list):
        item = compiled(schema[0])

        def check_list(v, path, out):
            if not isinstance(v, list):
                out.add(path, f"must be a list, got {type(v).__name__}", wrong_type=True)
                return
            for i, x in enumerate(v):
                if x is None:
                    out.add(f"{path}[{i}]", "may not be null", wrong_type=True)
                else:
                    item(x, f"{path}[{i}]", out)
        return check_list
    if isinstance(schema, Map):
        value = compiled(schema.value)

        def check_map(v, path, out):
            if not isinstance(v, dict):
                out.add(path, f"must be a mapping, got {type(v).__name__}", wrong_type=True)
                return
            for k, x in v.items():
                if x is not None:
                    value(x, f"{path}.{k}", out)
        return check_map
    if isinstance(schema, (dict, Obj)):
        obj = schema if isinstance(schema, Obj) else Obj(schema)
        names = obj.fields
        fields = {k: compiled(sub) for k, sub in names.items()}
        oneof, required = obj.oneof, obj.required

        def check_obj(v, path, out):
            if not isinstance(v, dict):
                out.add(path, f"must be a mapping, got {type(v).__name__}", wrong_type=True)
                return
            explained = set()    # required fields an unknown one stands for: no "X is required" too
            for k, x in v.items():
                fn = fields.get(k)
                child = f"{path}.{k}" if path else k
                if fn is None:
                    hint, meant = _unknown_field_hint(str(k), names, v)
                    explained.add(meant)
                    out.add(child, f"unknown field {k!r}{hint}")
                elif x is not None:
                    fn(x, child, out)
            for group in oneof:
                present = [k for k in group if v.get(k) is not None]
                if len(present) > 1:
                    out.add(f"{path}.{present[1]}", f"only one of {', '.join(group)} may be set (found {', '.join(present)})")
            for k in required:
                if v.get(k) in (None, "", [], {}) and k not in explained:
                    out.add(f"{path}.{k}", f"{k} is required")
        return check_obj
    raise TypeError(f"bad schema node {schema!r}")  # pragma: no cover - a schema bug


def _unknown_field_hint(name: str, fields: dict, given: dict) -> tuple[str, str | None]:
    """(the hint for an unknown field, the field it stands for). A misspelling first ("did you
    mean 'subset'?"); else a field one level too shallow: `host` beside `weight` in a route,
    where it belongs under `destination` ("indent it under 'destination'")."""
    hint = _did_you_mean(name, fields)
    if hint:
        return hint, hint.split("'")[1]
    parents = [f for f, sub in fields.items() if name in _object_fields(sub)]
    if parents:
        parent = parents[0]
        where = "indent it under" if parent not in given else "move it into"
        return f" ({where} {parent!r}: it is a field of {parent}, not of this object)", parent
    return "", None


def _object_fields(schema) -> dict:
    if isinstance(schema, Obj):
        return schema.fields
    return schema if isinstance(schema, dict) else {}


def _did_you_mean(name: str, fields: dict) -> str:
    # snake_case (the proto field name) and case slips first, then typos.
    folded = name.replace("_", "").lower()
    close = [f for f in fields if f.lower() == folded]
    if not close:
        close = difflib.get_close_matches(name, list(fields), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""
