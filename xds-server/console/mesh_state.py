"""The mesh as the console shows it, read from the control plane's admin endpoints.

/debug/syncz gives each connected proxy's per-type ACK/NACK state;
/debug/config_dump?node=ID gives that proxy's snapshot (Envoy JSON, from
protobuf's MessageToDict, so lowerCamelCase). An Envoy's own admin
(/clusters?format=json) adds the health Envoy itself observes per endpoint,
which can differ from what EDS said (active health checks, outlier ejection).
"""
from __future__ import annotations

from typing import Any

HCM = "envoy.filters.network.http_connection_manager"
HTTP_PROTOCOL_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def g(d: Any, *path: str, default: Any = None) -> Any:
    """d[a][b]... accepting snake_case or lowerCamelCase keys at each step."""
    for key in path:
        if not isinstance(d, dict):
            return default
        if key in d:
            d = d[key]
        elif _camel(key) in d:
            d = d[_camel(key)]
        else:
            return default
    return d


def proxies(syncz: list[dict]) -> list[dict]:
    order = ["LDS", "RDS", "CDS", "EDS", "ECDS", "SDS"]
    out = []
    for n in syncz:
        types = sorted(n.get("types", {}).items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99)
        out.append({"id": n.get("node", ""), "cluster": n.get("cluster", ""), "protocol": n.get("protocol", ""),
                    "types": [{"type": t, "status": s.get("status", ""), "sent": s.get("sent_version", ""),
                               "acked": s.get("acked_version", ""), "resources": s.get("resources", 0),
                               "error": s.get("error", "") if s.get("status") == "NACKED" else ""}
                              for t, s in types]})
    return out


def _match_text(m: dict) -> str:
    for key in ("prefix", "path", "path_separated_prefix"):
        if g(m, key) is not None:
            text = f"{key} {g(m, key)}"
            break
    else:
        regex = g(m, "safe_regex", "regex")
        text = f"regex {regex}" if regex is not None else "any"
    for h in g(m, "headers", default=[]) or []:
        sm = g(h, "string_match", default={}) or {}
        how = next(iter(sm.items()), ("present", ""))
        text += f" & {g(h, 'name')} {how[0]} {how[1]}".rstrip()
    return text


def _route_clusters(route: dict) -> list[str]:
    action = g(route, "route", default={}) or {}
    if g(action, "cluster"):
        return [g(action, "cluster")]
    weighted = g(action, "weighted_clusters", "clusters", default=[]) or []
    if weighted:
        return [f"{g(c, 'name')} ({g(c, 'weight', default=0)})" for c in weighted]
    if g(route, "direct_response"):
        return [f"direct response {g(route, 'direct_response', 'status')}"]
    if g(route, "redirect"):
        return ["redirect"]
    return []


def _hcms(listener: dict):
    for chain in g(listener, "filter_chains", default=[]) or []:
        for f in g(chain, "filters", default=[]) or []:
            if g(f, "name") == HCM:
                yield g(f, "typed_config", default={}) or {}
    api = g(listener, "api_listener", "api_listener")   # proxyless gRPC
    if api:
        yield api


def routes(resources: dict, node: str = "", locations: dict[str, str] | None = None) -> list[dict]:
    """One row per route: which listener serves it, virtual host, match, target clusters, the
    Istio resource it came from and (`locations`, config_dump's rule_sources) the rule's file:line."""
    by_name = {name: r.get("resource", r) for name, r in (resources.get("RDS") or {}).items()}
    out = []

    def rows(listener: str, rc_name: str, rc: dict):
        for vh in g(rc, "virtual_hosts", default=[]) or []:
            for r in g(vh, "routes", default=[]) or []:
                out.append({"node": node, "listener": listener, "routeConfig": rc_name,
                            "virtualHost": g(vh, "name", default=""), "domains": g(vh, "domains", default=[]),
                            "match": _match_text(g(r, "match", default={}) or {}),
                            "clusters": _route_clusters(r), "source": route_source(r),
                            "at": (locations or {}).get(_rule_key(r), "")})

    for lname, entry in sorted((resources.get("LDS") or {}).items()):
        for hcm in _hcms(entry.get("resource", entry)):
            rds_name = g(hcm, "rds", "route_config_name")
            if rds_name:
                rows(lname, rds_name, by_name.get(rds_name, {}))
            elif g(hcm, "route_config"):
                rows(lname, "(inline)", g(hcm, "route_config"))
    return out


def _rule_key(route: dict) -> str:
    meta = g(route, "metadata", "filter_metadata", default={}).get("mcp-mesh") or {}
    return f"{meta.get('resource')} {meta.get('rule')}"


def route_source(route: dict) -> str:
    """The Istio resource a route came from, as istiod's metadata names it
    (filter_metadata.istio.config: /apis/networking.istio.io/v1/namespaces/NS/virtual-service/NAME)."""
    path = str(g(route, "metadata", "filter_metadata", default={}).get("istio", {}).get("config") or "")
    parts = path.strip("/").split("/")
    if len(parts) >= 4 and parts[-4] == "namespaces":
        kind = "".join(w.capitalize() for w in parts[-2].split("-"))
        return f"{kind} {parts[-3]}/{parts[-1]}"
    return ""


def config_status(configz: dict | None) -> dict | None:
    """The served generation and the last change set rejected whole (/debug/configz)."""
    if configz is None:
        return None
    rejected = configz.get("rejected") or None
    if rejected:
        rejected = {"at": rejected.get("at"), "count": rejected.get("count", 1),
                    "errors": [e.get("text") or e.get("message", "") for e in rejected.get("errors") or []]}
    return {"configDir": configz.get("config_dir"), "generation": configz.get("generation"),
            "appliedAt": configz.get("applied_at"), "resources": configz.get("resources"), "rejected": rejected}


def inference(load: dict | None) -> list[dict] | None:
    """Per served model, the load the Endpoint Picker reads (the model server's /v1/load)."""
    if load is None:
        return None
    return [{"model": m.get("model", ""), "waiting": m.get("waiting", 0), "running": m.get("running", 0),
             "kvCacheUtilization": m.get("kv_cache_utilization"), "prefixCacheHitRate": m.get("prefix_cache_hit_rate"),
             "tokensPerSecond": m.get("tokens_per_second")} for m in load.get("models") or []]


def clusters(resources: dict, observed: dict[str, dict[str, str]] | None = None) -> list[dict]:
    """Clusters with their endpoints; health as EDS says, or as Envoy observes when known."""
    eds = {name: r.get("resource", r) for name, r in (resources.get("EDS") or {}).items()}
    out = []
    for name, entry in sorted((resources.get("CDS") or {}).items()):
        c = entry.get("resource", entry)
        cla = eds.get(g(c, "eds_cluster_config", "service_name") or name) or g(c, "load_assignment") or {}
        eps = []
        for locality in g(cla, "endpoints", default=[]) or []:
            for lb in g(locality, "lb_endpoints", default=[]) or []:
                sa = g(lb, "endpoint", "address", "socket_address", default={}) or {}
                addr = f"{g(sa, 'address')}:{g(sa, 'port_value')}"
                health = (observed or {}).get(name, {}).get(addr) or g(lb, "health_status", default="UNKNOWN")
                eps.append({"address": addr, "health": health,
                            "weight": g(lb, "load_balancing_weight", default=1)})
        opts = g(c, "typed_extension_protocol_options", HTTP_PROTOCOL_OPTIONS, default={}) or {}
        http2 = (g(opts, "explicit_http_config", "http2_protocol_options") is not None
                 or g(opts, "use_downstream_protocol_config") is not None)
        out.append({"name": name, "type": g(c, "type", default="EDS" if g(c, "eds_cluster_config") else ""),
                    "http2": http2, "endpoints": eps})
    return out


def observed_in(cluster: dict, observed: dict[str, dict[str, str]]) -> dict:
    """A clusters() row with each endpoint's health as the gateway Envoy observes it, where it does."""
    seen = observed.get(cluster["name"])
    if not seen:
        return cluster
    return {**cluster, "endpoints": [{**e, "health": seen.get(e["address"]) or e["health"]}
                                     for e in cluster["endpoints"]]}


def observed_health(envoy_clusters: dict) -> dict[str, dict[str, str]]:
    """Envoy admin /clusters?format=json -> {cluster: {host:port: HEALTHY|UNHEALTHY (why)}}."""
    out: dict[str, dict[str, str]] = {}
    for cs in envoy_clusters.get("cluster_statuses", []):
        hosts = out.setdefault(cs.get("name", ""), {})
        for h in cs.get("host_statuses", []):
            sa = g(h, "address", "socket_address", default={}) or {}
            hs = h.get("health_status", {})
            failed = [k for k, v in hs.items() if v is True]  # failed_active_health_check, ...
            eds = hs.get("eds_health_status", "HEALTHY")
            hosts[f"{sa.get('address')}:{sa.get('port_value')}"] = (
                f"UNHEALTHY ({', '.join(failed)})" if failed else eds)
    return out


def picker(stats: dict | None) -> dict | None:
    """The Endpoint Picker's /stats as the page's panel: each endpoint's load as the picker
    last read it and how often it was picked; the requests it refused, by HTTP status."""
    if not isinstance(stats, dict):
        return None
    endpoints = [{"endpoint": k, "ready": bool(v.get("ready")), "waiting": v.get("waiting"),
                  "running": v.get("running"), "kvCacheUtilization": v.get("kv_utilisation"),
                  "inFlight": v.get("in_flight", 0), "picked": v.get("picked", 0), "ageMs": v.get("age_ms")}
                 for k, v in sorted((stats.get("endpoints") or {}).items())]
    return {"pool": stats.get("pool"), "decisions": stats.get("decisions", 0),
            "refused": dict(sorted((stats.get("refused") or {}).items())),
            "prefixHitRate": stats.get("prefix_hit_rate"), "meanDecisionUs": stats.get("mean_decision_us"),
            "configError": stats.get("config_error"), "endpoints": endpoints}


def _action(a: dict) -> str:
    """One action as `mcpctl scheduler status` prints it."""
    return (f"{a.get('kind')} {a.get('subject')}{' -> ' + str(a['value']) if a.get('value') else ''}"
            f"{' (' + a['reason'] + ')' if a.get('reason') else ''}{' error: ' + a['error'] if a.get('error') else ''}")


def _queue(depth) -> str:
    """A replica's waiting requests by QoS class ({"standard": 2, "batch": 1}) as one cell."""
    if not isinstance(depth, dict):
        return "—" if depth is None else str(depth)
    return ", ".join(f"{k} {v}" for k, v in sorted(depth.items()) if v) or "0"


def decision_loop(status: dict | None, last: int = 8) -> dict | None:
    """The decision loop's /status as the page's panel: its policy and cycle count, the last
    `last` decisions kept (newest first) with what each did, and the inputs of the latest cycle."""
    if not isinstance(status, dict):
        return None
    decisions = [{"cycle": d.get("cycle"), "at": d.get("at"),
                  "did": (f"FAILED {d['failure'].get('reason')}: {d['failure'].get('detail')}" if d.get("failure")
                          else "; ".join(_action(a) for a in d.get("actions", [])) or "no action"),
                  "replicas": len((d.get("inputs") or {}).get("replicas", []))}
                 for d in reversed((status.get("decisions") or [])[-last:])]
    latest = status.get("latest") or {}
    replicas = [{"endpoint": r.get("endpoint"), "kvCacheUtilization": r.get("kv_utilisation"),
                 "queue": _queue(r.get("queue_depth")), "running": r.get("running"),
                 "prefixHitRate": r.get("kv_hit_rate"), "memoryFraction": r.get("memory_fraction"),
                 "memorySource": r.get("memory_source"), "ageMs": r.get("age_ms")}
                for r in (latest.get("inputs") or {}).get("replicas", [])]
    force = status.get("in_force") or {}
    in_force = ([f"class {r.get('from')} -> {r.get('to')} for {r.get('expires_in_s', 0):.1f} s"
                 for r in force.get("class_remaps", [])]
                + [f"flow {f.get('flow')} -> {f.get('class')} for {f.get('expires_in_s', 0):.1f} s"
                   for f in force.get("flows", [])]
                + [f"endpoint {w.get('endpoint')} weight {w.get('weight')} in {w.get('cluster')}"
                   for w in force.get("endpoint_weights", [])])
    return {"policy": status.get("policy"), "cycles": status.get("cycles", 0),
            "failures": status.get("failures") or {}, "latestCycle": latest.get("cycle"),
            "latestAt": latest.get("at"), "inputs": replicas, "inForce": in_force, "decisions": decisions}
