"""`mcpctl route explain`: which rule a request takes and where it goes.

The directory is loaded as the control plane loads it (its Wasm modules
read and checked too), translated for one proxy with the control plane's
own translator, and the request is run
through the RouteConfiguration that proxy would get (envoy_match has
Envoy's matching rules). Every step names the YAML that produced it.
"""
from __future__ import annotations

from dataclasses import dataclass

from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from google.protobuf import json_format

from mcp26.mesh.diagnostics import ConfigError
from mcp26.mesh.resources import MeshConfig
from mcp26.xds.explain import envoy_match, sources
from mcp26.xds.incremental_load import IncrementalLoader
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.model.type_urls import LISTENER, ROUTE
from mcp26.xds.translate import Overlay, TranslateOptions, translate
from mcp26.xds.wasm_modules import WasmModuleStore

PASSED_OVER_SHOWN = 10
FAULT_FILTER = "envoy.filters.http.fault"


class ExplainError(Exception):
    """Bad input: one line for the user, exit 2."""


@dataclass
class Proxy:
    node: ProxyNode
    description: str


def load(directory: str) -> MeshConfig:
    """The directory as the control plane loads it (all or nothing)."""
    try:
        return IncrementalLoader()(directory)
    except ConfigError as e:
        raise _explain_error(e) from None


def _explain_error(e: ConfigError) -> ExplainError:
    first = e.diagnostics[0] if e.diagnostics else None
    more = f" (and {len(e.diagnostics) - 1} more)" if len(e.diagnostics) > 1 else ""
    return ExplainError(f"{first}{more}" if first else str(e))


def proxy_for(config: MeshConfig, gateway: str | None = None, sidecar: str | None = None) -> Proxy:
    """The proxy to explain for: a gateway Envoy (--gateway NS/NAME) or a sidecar in a namespace."""
    if sidecar:
        return Proxy(ProxyNode(f"sidecar~127.0.0.1~explain.{sidecar}~{sidecar}.svc.cluster.local",
                               namespace=sidecar, kind="sidecar"), f"sidecar in namespace {sidecar}")
    gateways = config.of_kind("Gateway")
    if gateway:
        ns, sep, name = gateway.partition("/")
        if not sep or not ns or not name:
            raise ExplainError(f"--gateway must be NAMESPACE/NAME, got {gateway!r}")
        found = next((g for g in gateways if (g.namespace, g.name) == (ns, name)), None)
        if found is None:
            known = ", ".join(sorted(f"{g.namespace}/{g.name}" for g in gateways)) or "none"
            raise ExplainError(f"no Gateway {gateway} in the directory (Gateways: {known})")
    elif len(gateways) == 1:
        found = gateways[0]
    else:
        raise ExplainError("name the proxy: --gateway NAMESPACE/NAME or --sidecar NAMESPACE "
                           f"({len(gateways)} Gateways in the directory)")
    labels = {str(k): str(v) for k, v in (found.spec.get("selector") or {}).items()}
    node = ProxyNode(f"router~127.0.0.1~{found.name}.{found.namespace}~{found.namespace}.svc.cluster.local",
                     namespace=found.namespace, kind="router", labels=labels)
    return Proxy(node, f"gateway {found.namespace}/{found.name} ({sources.where(found)})")


def _hcm_route_names(listener, host: str) -> list[str]:
    """RDS names of the listener's HTTP chains; an SNI chain matching `host` first."""
    host = host.split(":")[0].lower()
    named, plain = [], []
    for chain in listener.filter_chains:
        for f in chain.filters:
            hcm = hcm_pb2.HttpConnectionManager()
            if f.typed_config.Unpack(hcm) and hcm.HasField("rds"):
                sni = list(chain.filter_chain_match.server_names)
                if not sni:
                    plain.append(hcm.rds.route_config_name)
                elif any(s == host or (s.startswith("*") and host.endswith(s[1:])) for s in sni):
                    named.append(hcm.rds.route_config_name)
    return named + plain


def _listener(snapshot: dict, port: int | None, host: str):
    listeners = [lis for lis in (snapshot.get(LISTENER) or {}).values() if not lis.HasField("api_listener")]
    http = [(lis, _hcm_route_names(lis, host)) for lis in listeners]
    http = [(lis, names) for lis, names in http if names]
    ports = sorted({lis.address.socket_address.port_value for lis, _ in http})
    if port is None:
        if len(ports) != 1:
            raise ExplainError(f"name the port with --port (HTTP listeners on: {', '.join(map(str, ports)) or 'none'})")
        port = ports[0]
    for lis, names in http:
        if lis.address.socket_address.port_value == port:
            return lis, names[0]
    raise ExplainError(f"this proxy has no HTTP listener on port {port} "
                       f"(HTTP listeners on: {', '.join(map(str, ports)) or 'none'})")


def parse_header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip() or (name.startswith(":") and not name[1:].strip()):
        raise ExplainError(f"-H must be NAME:VALUE, got {text!r}")
    return name.strip().lower(), value.strip()


def explain(config: MeshConfig, proxy: Proxy, request: envoy_match.Request, port: int | None = None,
            options=None) -> dict:
    try:        # as the control plane does when it loads the config: a bad module rejects it
        overlay = Overlay(wasm_modules=WasmModuleStore().load(config))
    except ConfigError as e:
        raise _explain_error(e) from None
    snapshot = translate(config, proxy.node, options or TranslateOptions(), overlay)
    listener, rc_name = _listener(snapshot, port, request.host)
    request = envoy_match.Request(request.host, envoy_match.normalized_path(request.path), request.method,
                                  request.headers, request.scheme)
    out = {"proxy": {"id": proxy.node.id, "kind": proxy.node.kind, "namespace": proxy.node.namespace,
                     "description": proxy.description},
           "request": {"host": request.host, "path": request.path, "method": request.method,
                       "headers": request.headers},
           "listener": {"name": listener.name, "address": listener.address.socket_address.address,
                        "port": listener.address.socket_address.port_value, "route_config": rc_name},
           "regex_engine": envoy_match.REGEX_ENGINE}
    rc = (snapshot.get(ROUTE) or {}).get(rc_name)
    vh, how = envoy_match.select_virtual_host(rc, request.host) if rc is not None else (None, "no routes")
    if vh is None:
        out["virtual_host"] = None
        out["response"] = {"status": 404, "why": how,
                           "domains": sorted(d for v in (rc.virtual_hosts if rc else []) for d in v.domains)}
        return out
    out["virtual_host"] = {"name": vh.name, "chosen_by": how, "domains": list(vh.domains)}
    passed_over, matched, best = [], None, None
    for i, route in enumerate(vh.routes):
        check = envoy_match.check_route(route, request)
        src = sources.rule_source(config, route)
        if check.matched:
            matched = (i, route, src)
            break
        entry = {"index": i, "name": route.name, "match": envoy_match.describe_match(route.match),
                 "reason": check.reason, "source": src.as_dict() if src else None}
        passed_over.append(entry)
        if best is None or check.passed > best[0]:
            best = (check.passed, entry)
    out["passed_over"] = passed_over[:PASSED_OVER_SHOWN]
    out["passed_over_total"] = len(passed_over)
    if matched is None:
        out["route"] = None
        out["response"] = {"status": 404, "why": "no route of the virtual host matches",
                           "closest": best[1] if best else None}
        return out
    i, route, src = matched
    out["route"] = {"index": i, "name": route.name, "match": envoy_match.describe_match(route.match),
                    "source": src.as_dict() if src else {"note": "istiod's default route (no VirtualService rule)"}}
    out["action"] = _action(config, snapshot, route, src)
    return out


def _at(src, field: str) -> str | None:
    """file:line of `field` of the rule when the rule sets it, else None (a default)."""
    return src.at(field) if src is not None and field in src.rule else None


def _action(config: MeshConfig, snapshot: dict, route, src) -> dict:
    out: dict = {}
    if route.HasField("redirect"):
        r = route.redirect
        out["redirect"] = {k: v for k, v in json_format.MessageToDict(r).items()}
        out["redirect"]["status"] = {0: 301, 1: 302, 2: 303, 3: 307, 4: 308}.get(r.response_code, 301)
        out["redirect"]["at"] = _at(src, "redirect")
    elif route.HasField("direct_response"):
        d = route.direct_response
        out["direct_response"] = {"status": d.status, "body": d.body.inline_string or None,
                                  "at": _at(src, "directResponse")}
    elif route.HasField("route"):
        a = route.route
        weighted = [(c.name, c.weight.value) for c in a.weighted_clusters.clusters] if a.HasField("weighted_clusters") \
            else [(a.cluster, 100)]
        total = sum(w for _, w in weighted) or 1
        clusters = []
        for name, weight in weighted:
            backend = sources.describe_backend(config, snapshot, name)
            entry = {"cluster": name, "weight": weight, "percent": round(100 * weight / total, 2), **backend}
            if src is not None:
                entry["at"] = sources.destination_at(src, backend)
            clusters.append(entry)
        out["clusters"] = clusters
        rewrites = {}
        if a.prefix_rewrite:
            rewrites["prefix_rewrite"] = a.prefix_rewrite
        if a.HasField("regex_rewrite"):
            rewrites["regex_rewrite"] = {"pattern": a.regex_rewrite.pattern.regex,
                                         "substitution": a.regex_rewrite.substitution}
        if a.host_rewrite_literal:
            rewrites["host_rewrite"] = a.host_rewrite_literal
        if rewrites:
            rewrites["at"] = _at(src, "rewrite") or _at(src, "headers")
            out["rewrite"] = rewrites
        timeout = a.timeout.ToTimedelta().total_seconds() if a.HasField("timeout") else None
        out["timeout"] = {"seconds": timeout or None, "at": _at(src, "timeout"),
                          **({"note": "none (istiod turns Envoy's 15s default off)"} if not timeout else {})}
        if a.HasField("retry_policy"):
            rp = a.retry_policy
            out["retries"] = {"attempts": rp.num_retries.value, "retry_on": rp.retry_on,
                              "per_try_timeout": rp.per_try_timeout.ToTimedelta().total_seconds()
                              if rp.HasField("per_try_timeout") else None,
                              "at": _at(src, "retries") or "istiod's default retry policy"}
        else:
            out["retries"] = {"attempts": 0, "at": _at(src, "retries")}
        mirrors = [m.cluster for m in a.request_mirror_policies]
        if mirrors:
            out["mirrors"] = {"clusters": mirrors, "at": _at(src, "mirror") or _at(src, "mirrors")}
    headers = {"set_or_add": {h.header.key: h.header.value for h in route.request_headers_to_add},
               "remove": list(route.request_headers_to_remove)}
    if headers["set_or_add"] or headers["remove"]:
        headers["at"] = _at(src, "headers")
        out["request_headers"] = headers
    if FAULT_FILTER in route.typed_per_filter_config:
        f = fault_pb2.HTTPFault()
        route.typed_per_filter_config[FAULT_FILTER].Unpack(f)
        out["fault"] = {**json_format.MessageToDict(f), "at": _at(src, "fault")}
    return out


# -- text ------------------------------------------------------------------
def format_text(r: dict) -> str:
    req = r["request"]
    lines = [f"Request:   {req['method']} http://{req['host']}{req['path']}"
             + "".join(f"\n           {k}: {','.join(v)}" for k, v in sorted(req["headers"].items())),
             f"Proxy:     {r['proxy']['description']}",
             f"Listener:  {r['listener']['name']} (route configuration {r['listener']['route_config']})"]
    vh = r.get("virtual_host")
    if vh is None:
        resp = r["response"]
        lines.append(f"Virtual host: none - {resp['why']}; domains: {', '.join(resp['domains']) or 'none'}")
        lines.append(f"Result:    {resp['status']} Not Found (Envoy: route_not_found, NR)")
        return "\n".join(lines)
    lines.append(f"Virtual host: {vh['name']} (by {vh['chosen_by']})")
    if r["passed_over"]:
        shown = len(r["passed_over"])
        more = f", first {shown} shown" if r["passed_over_total"] > shown else ""
        lines.append(f"Passed over ({r['passed_over_total']}{more}):")
        for p in r["passed_over"]:
            lines.append(f"  #{p['index']} {p['match']}")
            lines.append(f"      {p['reason']}" + (f"  [{_src_text(p['source'])}]" if p["source"] else ""))
    route = r.get("route")
    if route is None:
        resp = r["response"]
        lines.append(f"Result:    {resp['status']} Not Found - {resp['why']} (Envoy: route_not_found, NR)")
        if resp.get("closest"):
            c = resp["closest"]
            lines.append(f"Closest:   #{c['index']}: {c['reason']}" + (f"  [{_src_text(c['source'])}]" if c["source"] else ""))
        return "\n".join(lines)
    lines.append(f"Matched:   #{route['index']} {route['match']}")
    src = route["source"]
    lines.append(f"           {_src_text(src) if 'resource' in src else src['note']}")
    a = r["action"]
    if "redirect" in a:
        rd = a["redirect"]
        lines.append(f"Redirect:  {rd['status']} " + ", ".join(f"{k}={v}" for k, v in rd.items() if k not in ("status", "at", "responseCode"))
                     + (f"  [{rd['at']}]" if rd["at"] else ""))
    if "direct_response" in a:
        d = a["direct_response"]
        lines.append(f"Response:  {d['status']} direct" + (f" body {d['body']!r}" if d["body"] else "") + (f"  [{d['at']}]" if d["at"] else ""))
    for c in a.get("clusters", []):
        sel = ", ".join(f"{k}={v}" for k, v in (c.get("selects") or {}).items())
        lines.append(f"Cluster:   {c['cluster']}  weight {c['weight']} ({c['percent']}%)" + (f"  [{c['at']}]" if c.get("at") else ""))
        if c.get("subset"):
            lines.append(f"           subset {c['subset']} selects {sel or 'nothing'}" + (f"  [{c['subset_at']}]" if c.get("subset_at") else ""))
        if c.get("endpoints"):
            lines.append(f"           endpoints: {', '.join(c['endpoints'])}")
        if c.get("problem"):
            lines.append(f"           problem: {c['problem']}")
    for key, label in (("rewrite", "Rewrite"), ("request_headers", "Headers"), ("fault", "Fault"), ("mirrors", "Mirror")):
        if key in a:
            body = {k: v for k, v in a[key].items() if k != "at"}
            lines.append(f"{label + ':':10} {_compact(body)}" + (f"  [{a[key]['at']}]" if a[key].get("at") else ""))
    if "timeout" in a:
        t = a["timeout"]
        lines.append(f"Timeout:   {str(t['seconds']) + 's' if t['seconds'] else t.get('note')}" + (f"  [{t['at']}]" if t["at"] else ""))
    if "retries" in a:
        rt = a["retries"]
        text = f"{rt['attempts']} on {rt.get('retry_on')}" if rt["attempts"] else "off"
        if rt.get("per_try_timeout"):
            text += f", {rt['per_try_timeout']}s per try"
        lines.append(f"Retries:   {text}" + (f"  [{rt['at']}]" if rt.get("at") else ""))
    return "\n".join(lines)


def _src_text(s: dict) -> str:
    text = f"{s['resource']} {s['rule']} at {s['at']}"
    if s.get("match_at"):
        text += f", match at {s['match_at']}"
    if s.get("delegated_from"):
        text += f", delegated from {s['delegated_from']}"
    return text


def _compact(d) -> str:
    if isinstance(d, dict):
        return ", ".join(f"{k}={_compact(v)}" for k, v in d.items() if v not in (None, [], {}))
    return str(d)
