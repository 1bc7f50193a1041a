"""Envoy's request matching over a RouteConfiguration, as the router does it.

Pure functions on the protobuf messages the translator emits, so an
explanation is exactly as good as the match rules below are faithful to
Envoy (source/common/router/config_impl.cc, source/common/http/header_utility.cc):

- virtual host: the Host header lower-cased, as sent (a port stays on it);
  exact domain, then suffix wildcards `*.foo` longest first, then prefix
  wildcards `foo.*` longest first, then `*`. A wildcard never matches the
  empty string.
- routes in order, the first that matches wins. A route matches when its path
  matcher, every header matcher and every query parameter matcher match.
- path: `prefix` on the whole :path, `path` / `safe_regex` /
  `path_separated_prefix` / a URI template on the path without query and
  fragment; `case_sensitive` (default true) applies to all but regexes.
- header: all values of the name joined with ","; an absent header matches
  only `present_match: false` (or, inverted, `present_match: true`).
- query parameter: the first value of the name; `present_match` needs the name.
"""
from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

try:                                  # Envoy's regex engine; Python's `re` differs at the edges
    import re2 as _re2
    REGEX_ENGINE = "RE2"
except ImportError:                   # pragma: no cover - depends on the environment
    _re2 = None
    REGEX_ENGINE = "Python re (google-re2 is not installed: RE2-only syntax may differ)"


@dataclass
class Request:
    host: str
    path: str = "/"
    method: str = "GET"
    headers: dict = field(default_factory=dict)     # lower-case name -> [values]
    scheme: str = "http"

    def header(self, name: str) -> str | None:
        """All values of `name` joined with ',' as Envoy matches them; None when absent."""
        name = name.lower()
        if name == ":authority" or name == "host":
            return self.host
        if name == ":method":
            return self.method
        if name == ":path":
            return self.path
        if name == ":scheme":
            return self.scheme
        values = self.headers.get(name)
        return ",".join(values) if values else None


def normalized_path(path: str) -> str:
    """normalize_path (RFC 3986 dot segments), which the translator's HCMs turn on."""
    base, sep, query = path.partition("?")
    if not base.startswith("/"):
        return path
    out = posixpath.normpath(base)
    out = "/" + out.lstrip("/")
    if base.endswith("/") and out != "/":
        out += "/"
    return out + sep + query


def _path_only(path: str) -> str:
    return path.split("?", 1)[0].split("#", 1)[0]


def regex_full_match(pattern: str, value: str) -> bool:
    if _re2 is not None:
        return _re2.fullmatch(pattern, value) is not None
    return re.fullmatch(pattern, value) is not None


# -- virtual hosts ---------------------------------------------------------
def select_virtual_host(route_config, host: str):
    """(virtual host, how it was chosen) or (None, why not)."""
    host = host.lower()
    exact, suffix, prefix, default = {}, [], [], None
    for vh in route_config.virtual_hosts:
        for d in vh.domains:
            d = d.lower()
            if d == "*":
                default = default or vh
            elif d.startswith("*"):
                suffix.append((d[1:], vh, d))
            elif d.endswith("*"):
                prefix.append((d[:-1], vh, d))
            else:
                exact.setdefault(d, vh)
    if host in exact:
        return exact[host], f"exact domain {host!r}"
    # Longest first; a wildcard must cover at least one character.
    for part, vh, d in sorted(suffix, key=lambda t: -len(t[0])):
        if len(host) > len(part) and host.endswith(part):
            return vh, f"suffix wildcard {d!r}"
    for part, vh, d in sorted(prefix, key=lambda t: -len(t[0])):
        if len(host) > len(part) and host.startswith(part):
            return vh, f"prefix wildcard {d!r}"
    if default is not None:
        return default, "default domain '*'"
    return None, f"no virtual host has a domain matching {host!r}"


# -- string matchers -------------------------------------------------------
def string_match(sm, value: str) -> bool:
    """envoy.type.matcher.v3.StringMatcher."""
    kind = sm.WhichOneof("match_pattern")
    if kind == "safe_regex":
        return regex_full_match(sm.safe_regex.regex, value)
    expected = getattr(sm, kind)
    if sm.ignore_case:
        value, expected = value.lower(), expected.lower()
    if kind == "exact":
        return value == expected
    if kind == "prefix":
        return value.startswith(expected)
    if kind == "suffix":
        return value.endswith(expected)
    if kind == "contains":
        return expected in value
    return False


def describe_string_match(sm) -> str:
    kind = sm.WhichOneof("match_pattern")
    value = sm.safe_regex.regex if kind == "safe_regex" else getattr(sm, kind)
    return f"{'regex' if kind == 'safe_regex' else kind} {value!r}" + (" (any case)" if sm.ignore_case else "")


def describe_header(hm) -> str:
    kind = hm.WhichOneof("header_match_specifier")
    neg = "not " if hm.invert_match else ""
    if kind == "string_match":
        return f"{hm.name} {neg}{describe_string_match(hm.string_match)}"
    if kind == "present_match" or kind is None:
        present = hm.present_match if kind else True
        return f"{hm.name} {'absent' if present == hm.invert_match else 'present'}"
    if kind == "safe_regex_match":
        return f"{hm.name} {neg}regex {hm.safe_regex_match.regex!r}"
    return f"{hm.name} {neg}{kind} {getattr(hm, kind)!r}"


def header_matches(hm, req: Request) -> bool:
    value = req.header(hm.name)
    kind = hm.WhichOneof("header_match_specifier")
    if value is None:
        if hm.treat_missing_header_as_empty:
            value = ""
        else:
            present_true = kind in ("present_match", None) and (hm.present_match if kind else True)
            return present_true if hm.invert_match else (kind == "present_match" and not hm.present_match)
    if kind == "string_match":
        match = string_match(hm.string_match, value)
    elif kind in ("present_match", None):
        match = hm.present_match if kind else True
    elif kind == "exact_match":
        match = not hm.exact_match or value == hm.exact_match
    elif kind == "safe_regex_match":
        match = regex_full_match(hm.safe_regex_match.regex, value)
    elif kind == "prefix_match":
        match = value.startswith(hm.prefix_match)
    elif kind == "suffix_match":
        match = value.endswith(hm.suffix_match)
    elif kind == "contains_match":
        match = hm.contains_match in value
    elif kind == "range_match":
        match = value.lstrip("-").isdigit() and hm.range_match.start <= int(value) < hm.range_match.end
    else:
        match = False
    return match != hm.invert_match


def query_matches(qm, req: Request) -> bool:
    params = {}
    for k, v in parse_qsl(req.path.partition("?")[2], keep_blank_values=True):
        params.setdefault(k, v)                   # the first value counts
    if qm.name not in params:
        return False
    if qm.WhichOneof("query_parameter_match_specifier") == "string_match":
        return string_match(qm.string_match, params[qm.name])
    return qm.present_match


# -- paths -----------------------------------------------------------------
def _template_regex(template: str) -> str:
    """A URI template (/foo/{bar}/**) as a regex: {x} and * one segment, ** and {x=**} the rest."""
    out = []
    for seg in template.split("/"):
        if seg in ("**", ) or re.fullmatch(r"\{\w+=\*\*\}", seg):
            out.append(".*")
        elif seg == "*" or re.fullmatch(r"\{\w+(=\*)?\}", seg):
            out.append("[^/]+")
        else:
            out.append(re.escape(seg))
    return "/".join(out)


def describe_path(m) -> str:
    kind = m.WhichOneof("path_specifier")
    ci = " (any case)" if m.HasField("case_sensitive") and not m.case_sensitive.value else ""
    if kind == "safe_regex":
        return f"path regex {m.safe_regex.regex!r}"
    if kind == "path_match_policy":
        return f"path template {_template(m)!r}{ci}"
    label = {"path": "path exact", "prefix": "path prefix", "path_separated_prefix": "path segment prefix"}.get(kind, kind)
    return f"{label} {getattr(m, kind)!r}{ci}" if kind else "any path"


def _template(m) -> str:
    from envoy.extensions.path.match.uri_template.v3 import uri_template_match_pb2
    cfg = uri_template_match_pb2.UriTemplateMatchConfig()
    m.path_match_policy.typed_config.Unpack(cfg)
    return cfg.path_template


def path_matches(m, req: Request) -> bool:
    kind = m.WhichOneof("path_specifier")
    sensitive = not m.HasField("case_sensitive") or m.case_sensitive.value
    fold = (lambda s: s) if sensitive else str.lower
    if kind == "prefix":
        return fold(req.path).startswith(fold(m.prefix))
    path = _path_only(req.path)
    if kind == "path":
        return fold(path) == fold(m.path)
    if kind == "safe_regex":
        return regex_full_match(m.safe_regex.regex, path)
    if kind == "path_separated_prefix":
        p = m.path_separated_prefix
        return fold(path) == fold(p) or fold(path).startswith(fold(p) + "/")
    if kind == "path_match_policy":
        return regex_full_match(_template_regex(_template(m)), path)
    return False


# -- routes ----------------------------------------------------------------
@dataclass
class RouteCheck:
    matched: bool
    reason: str = ""             # why not, for a route passed over
    passed: int = 0              # conditions that held before the one that failed (closeness)


def check_route(route, req: Request) -> RouteCheck:
    m = route.match
    if not path_matches(m, req):
        return RouteCheck(False, f"{describe_path(m)} does not match {_path_only(req.path)!r}" if
                          m.WhichOneof("path_specifier") != "prefix" else
                          f"{describe_path(m)} does not match {req.path!r}", 0)
    passed = 1
    for hm in m.headers:
        if not header_matches(hm, req):
            seen = req.header(hm.name)
            got = "absent" if seen is None else repr(seen)
            return RouteCheck(False, f"header {describe_header(hm)} does not hold (request: {got})", passed)
        passed += 1
    for qm in m.query_parameters:
        if not query_matches(qm, req):
            kind = qm.WhichOneof("query_parameter_match_specifier")
            want = describe_string_match(qm.string_match) if kind == "string_match" else "present"
            return RouteCheck(False, f"query parameter {qm.name} {want} does not hold", passed)
        passed += 1
    if m.HasField("runtime_fraction"):
        # Decided per request by Envoy: explain as if it holds.
        pass
    return RouteCheck(True, "", passed)


def describe_match(m) -> str:
    parts = [describe_path(m)]
    parts += [f"header {describe_header(h)}" for h in m.headers]
    for q in m.query_parameters:
        kind = q.WhichOneof("query_parameter_match_specifier")
        parts.append(f"query {q.name} " + (describe_string_match(q.string_match) if kind == "string_match" else "present"))
    return ", ".join(parts)
