"""From Envoy objects back to the YAML that produced them (file:line).

Two registries, so that new route kinds and backends plug in without
touching the explainer:

    RULE_SOURCES[kind](config, meta) -> RuleSource | None
        the rule a route came from, given the route's `mcp-mesh` metadata
        (routes.SOURCE_METADATA: resource ref, rule path, match index).
        VirtualService today; a Gateway API HTTPRoute registers here.
    BACKENDS: [describe(config, snapshot, cluster_name) -> dict | None]
        what a destination cluster is (service, port, subset, which
        endpoints it selects, the DestinationRule subset's file:line).
        The first that answers wins; an InferencePool backend goes first.
"""
from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import json_format

from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.xds.model.type_urls import ENDPOINT
from mcp26.xds.translate.index import build_index
from mcp26.xds.translate.routes import SOURCE_METADATA    # the route metadata translation writes


def where(res: Resource, path: str = "") -> str:
    return f"{res.file}:{res.line_of(path) if path else res.line}"


def find_resource(config: MeshConfig, ref: str) -> Resource | None:
    return next((r for r in config if r.ref == ref), None)


@dataclass
class RuleSource:
    resource: Resource
    rule_path: str                    # spec.http[2]
    match_path: str = ""              # spec.http[2].match[0], "" when the rule has no match
    delegated_from: str = ""

    @property
    def rule(self) -> dict:
        node = self.resource.spec
        for part in self.rule_path.replace("]", "").split(".")[1:]:
            key, _, idx = part.partition("[")
            node = node.get(key) if isinstance(node, dict) else None
            if idx and isinstance(node, list):
                node = node[int(idx)] if int(idx) < len(node) else None
        return node if isinstance(node, dict) else {}

    def at(self, field: str = "") -> str:
        """file:line of a field of the rule (or the rule itself)."""
        return where(self.resource, f"{self.rule_path}.{field}" if field else self.rule_path)

    def as_dict(self) -> dict:
        out = {"resource": self.resource.ref, "rule": self.rule_path, "at": self.at()}
        if self.match_path:
            out["match"] = self.match_path
            out["match_at"] = where(self.resource, self.match_path)
        if self.delegated_from:
            out["delegated_from"] = self.delegated_from
        return out


def route_metadata(route) -> dict:
    if SOURCE_METADATA not in route.metadata.filter_metadata:
        return {}
    return json_format.MessageToDict(route.metadata.filter_metadata[SOURCE_METADATA])


def _virtual_service_rule(config: MeshConfig, meta: dict) -> RuleSource | None:
    res = find_resource(config, str(meta.get("resource") or ""))
    if res is None:
        return None
    rule = str(meta.get("rule") or "")
    match = f"{rule}.match[{int(meta['match'])}]" if "match" in meta else ""
    return RuleSource(res, rule, match, str(meta.get("delegated_from") or ""))


def _scheduling_policy_rule(config: MeshConfig, meta: dict) -> RuleSource | None:
    """A route an L7SchedulingPolicy's routing fields made (translate/route_configs.py)."""
    res = find_resource(config, str(meta.get("resource") or ""))
    return RuleSource(res, "spec", "spec.matchHeaders") if res is not None else None


RULE_SOURCES = {"VirtualService": _virtual_service_rule, "L7SchedulingPolicy": _scheduling_policy_rule}


def rule_source(config: MeshConfig, route) -> RuleSource | None:
    meta = route_metadata(route)
    kind = str(meta.get("resource") or "").split("/", 1)[0]
    tracer = RULE_SOURCES.get(kind)
    return tracer(config, meta) if tracer else None


# -- backends --------------------------------------------------------------
def _endpoints(snapshot: dict, cluster: str) -> list[str]:
    cla = (snapshot.get(ENDPOINT) or {}).get(cluster)
    if cla is None:
        return []
    return [f"{lb.endpoint.address.socket_address.address}:{lb.endpoint.address.socket_address.port_value}"
            for group in cla.endpoints for lb in group.lb_endpoints]


def _istio_service(config: MeshConfig, snapshot: dict, cluster: str) -> dict | None:
    parts = cluster.split("|")
    if len(parts) != 4:
        return None
    direction, port, subset, host = parts
    idx = build_index(config)
    out = {"service": host, "port": int(port) if port.isdigit() else port, "subset": subset,
           "direction": direction, "endpoints": _endpoints(snapshot, cluster)}
    svc = idx.services.get(host)
    if svc is not None:
        out["service_at"] = where(svc.source)
    dr = idx.destination_rule(host)
    if dr is not None:
        out["destination_rule"] = dr.ref
        subsets = dr.spec.get("subsets") or []
        for i, s in enumerate(subsets):
            if isinstance(s, dict) and str(s.get("name")) == subset:
                out["selects"] = dict(s.get("labels") or {})
                out["subset_at"] = where(dr, f"spec.subsets[{i}]")
        if subset and "subset_at" not in out:
            out["problem"] = f"{dr.ref} has no subset {subset!r}: Envoy answers 503 (no healthy upstream)"
    elif subset:
        out["problem"] = f"no DestinationRule for {host} defines subset {subset!r}: Envoy answers 503"
    return out


BACKENDS = [_istio_service]


def describe_backend(config: MeshConfig, snapshot: dict, cluster: str) -> dict:
    for describe in BACKENDS:
        found = describe(config, snapshot, cluster)
        if found is not None:
            return found
    return {}


def destination_at(src: RuleSource, backend: dict) -> str:
    """file:line of the `route[i]` destination of the rule naming this backend."""
    host, subset = str(backend.get("service") or ""), str(backend.get("subset") or "")
    for i, d in enumerate(src.rule.get("route") or []):
        dest = (d or {}).get("destination") or {}
        h = str(dest.get("host") or "")
        if str(dest.get("subset") or "") == subset and (h == host or host.startswith(h + ".")):
            return src.at(f"route[{i}]")
    return src.at("route") if src.rule.get("route") else src.at()
