"""VirtualService delegation: a root route's `delegate` pulls in the http
routes of another VirtualService (which has no hosts of its own), each with
its matches merged into the root route's, as istiod merges them.

Merging a root match R with a delegate match D: D's conditions, plus every
condition of R that D does not set; where both set one, they must agree --
D's uri within R's (prefix under prefix, exact under prefix or equal),
equal scalars, no header/query/label given two values -- or the pair is
dropped (istiod's conflict rule). One level only: a delegate's own
`delegate` routes are ignored, as in Istio.
"""
from __future__ import annotations

from typing import Iterator

from mcp26.mesh.resources import Resource
from mcp26.xds.translate.index import MeshIndex

_MAPS = ("headers", "withoutHeaders", "queryParams", "sourceLabels")


def _uri_within(child: dict, root: dict) -> bool:
    if child == root:
        return True
    if "prefix" in root:
        p = str(root["prefix"])
        if "prefix" in child:
            return str(child["prefix"]).startswith(p)
        if "exact" in child:
            return str(child["exact"]).startswith(p)
    return False                      # regexes cannot be compared: a conflict


def merge_match(root: dict, child: dict) -> dict | None:
    out = dict(child)
    for key, value in root.items():
        if key == "name":
            continue
        if key not in out:
            out[key] = value
        elif key in _MAPS:
            merged = dict(value or {})
            for k, v in (out[key] or {}).items():
                if k in merged and merged[k] != v:
                    return None
                merged[k] = v
            out[key] = merged
        elif key == "uri":
            if not _uri_within(out["uri"] or {}, value or {}):
                return None
        elif key == "gateways":
            common = [g for g in out[key] or [] if g in (value or [])]
            if not common:
                return None
            out[key] = common
        elif out[key] != value:
            return None
    name = ".".join(str(n) for n in (root.get("name"), child.get("name")) if n)
    if name:
        out["name"] = name
    return out


def _matches(http: dict) -> list[dict]:
    return [m for m in http.get("match") or [] if isinstance(m, dict)]


def http_entries(idx: MeshIndex, vs: Resource) -> Iterator[tuple[Resource, dict, str, list[dict]]]:
    """(resource the route came from, http route, its field path, effective matches)."""
    for i, http in enumerate(vs.spec.get("http") or []):
        if not isinstance(http, dict):
            continue
        if not http.get("delegate"):
            yield vs, http, f"spec.http[{i}]", _matches(http)
            continue
        ref = http["delegate"] or {}
        child_vs = idx.virtual_service(str(ref.get("namespace") or vs.namespace), str(ref.get("name") or ""))
        if child_vs is None:
            continue                  # istiod drops a root route whose delegate is missing
        root = _matches(http)
        for j, child in enumerate(child_vs.spec.get("http") or []):
            if not isinstance(child, dict) or child.get("delegate"):
                continue
            mine = _matches(child)
            if not root or not mine:
                matches = mine or root
            else:
                matches = [m for m in (merge_match(r, c) for r in root for c in mine) if m is not None]
                if not matches:
                    continue
            yield child_vs, child, f"spec.http[{j}]", matches
