"""RDS: VirtualService http routes as Envoy routes, as istiod builds them.

One Envoy route per match condition (Istio ORs matches), in the order the
VirtualService lists them; a route without match is the catch-all prefix "/".
Faults and CORS go in per-route typed_per_filter_config for the
envoy.filters.http.fault / envoy.filters.http.cors filters in the chain.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field

from envoy.config.core.v3 import base_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.extensions.filters.http.cors.v3 import cors_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.extensions.retry.host.previous_hosts.v3 import previous_hosts_pb2
from envoy.type.v3 import percent_pb2
from google.protobuf import any_pb2

from mcp26.mesh.header_contract import ROUTE_METADATA
from mcp26.mesh.resources import Resource
from mcp26.xds.translate import values
from mcp26.xds.translate.clusters import traffic_policy
from mcp26.xds.translate.delegate import http_entries
from mcp26.xds.translate.index import MeshIndex, labels_match
from mcp26.xds.translate.names import cluster_name

FAULT_FILTER = "envoy.filters.http.fault"
CORS_FILTER = "envoy.filters.http.cors"
OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
APPEND = base_pb2.HeaderValueOption.APPEND_IF_EXISTS_OR_ADD

# istiod's retry policy for routes whose VirtualService says nothing.
DEFAULT_RETRY_ON = "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
DEFAULT_RETRIES = 2

_REDIRECT_CODES = {301: rc.RedirectAction.MOVED_PERMANENTLY, 302: rc.RedirectAction.FOUND,
                   303: rc.RedirectAction.SEE_OTHER, 307: rc.RedirectAction.TEMPORARY_REDIRECT,
                   308: rc.RedirectAction.PERMANENT_REDIRECT}
GRPC_STATUS = {name: code for code, name in enumerate((
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
    "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"))}


@dataclass
class RouteContext:
    """Where the routes go: the listener port and who is asking."""
    idx: MeshIndex
    port: int
    gateways: set = field(default_factory=set)   # 'ns/name' refs, or {'mesh'}
    labels: dict = field(default_factory=dict)
    namespace: str = "default"
    grpc: bool = False                           # proxyless gRPC client


def _pack(msg) -> any_pb2.Any:
    out = any_pb2.Any()
    out.Pack(msg)
    return out


def _istio_metadata(vs: Resource):
    # As istiod: lets tooling (and operators) find the VirtualService of a route.
    md = rc.Route().metadata
    md.filter_metadata["istio"].update(
        {"config": f"/apis/networking.istio.io/v1/namespaces/{vs.namespace}/virtual-service/{vs.name}"})
    return md


# route metadata: the rule (and match) a route came from; an L7SchedulingPolicy's route also
# carries its class there, for the header-contract filter (mesh.header_contract.ROUTE_CLASS_PROPERTY)
SOURCE_METADATA = ROUTE_METADATA


def _source_metadata(root: Resource, source: Resource, path: str, matches: list, m: dict | None) -> dict:
    """Where a route came from, for `mcpctl route explain`: the resource, the
    http rule's field path and the match's index (absent: a rule without match)."""
    out = {"resource": source.ref, "rule": path}
    if root is not source:
        out["delegated_from"] = root.ref      # matches are merged with the root's: no one index
    elif m is not None:
        out["match"] = next(i for i, x in enumerate(matches) if x is m)
    return out


def rule_locations(config, rds: dict) -> dict[str, str]:
    """The inverse of _source_metadata for the console: `RESOURCE RULE` -> the rule's file:line,
    for each route of an RDS dump as JSON (the admin's /debug/config_dump)."""
    by_ref = {r.ref: r for r in config}
    out: dict[str, str] = {}
    for entry in rds.values():
        for vh in (entry.get("resource") or {}).get("virtualHosts") or []:
            for route in vh.get("routes") or []:
                meta = ((route.get("metadata") or {}).get("filterMetadata") or {}).get(SOURCE_METADATA) or {}
                key = f"{meta.get('resource')} {meta.get('rule')}"
                res = by_ref.get(str(meta.get("resource")))
                if res is not None and key not in out:
                    out[key] = f"{res.file}:{res.line_of(str(meta.get('rule') or ''))}"
    return out


# -- match ---------------------------------------------------------------
def match_applies(ctx: RouteContext, vs: Resource, m: dict) -> bool:
    if m.get("port") and int(m["port"]) != ctx.port:
        return False
    if m.get("gateways"):
        refs = {ctx.idx.gateway_ref(str(g), vs.namespace) for g in m["gateways"]}
        if not refs & ctx.gateways:
            return False
    if m.get("sourceLabels") and not labels_match(m["sourceLabels"], ctx.labels):
        return False
    if m.get("sourceNamespace") and str(m["sourceNamespace"]) != ctx.namespace:
        return False
    return True


def _header_matcher(name: str, spec: dict | None, invert: bool = False) -> rc.HeaderMatcher:
    hm = rc.HeaderMatcher(name=name, invert_match=invert)
    sm = values.string_match(spec or {})
    if sm is None:
        hm.present_match = True          # `{}`: the header is present (absent, inverted)
    else:
        hm.string_match.CopyFrom(sm)
    return hm


def route_match(m: dict | None) -> rc.RouteMatch:
    out = rc.RouteMatch()
    m = m or {}
    uri = m.get("uri") or {}
    if "exact" in uri:
        out.path = str(uri["exact"])
    elif "prefix" in uri:
        out.prefix = str(uri["prefix"])
    elif "regex" in uri:
        out.safe_regex.CopyFrom(values.regex(uri["regex"]))
    else:
        out.prefix = "/"
    if m.get("ignoreUriCase"):
        out.case_sensitive.value = False
    for pseudo, key in ((":authority", "authority"), (":method", "method"), (":scheme", "scheme")):
        if m.get(key):
            out.headers.append(_header_matcher(pseudo, m[key]))
    for name, spec in sorted((m.get("headers") or {}).items()):
        out.headers.append(_header_matcher(str(name).lower(), spec))
    for name, spec in sorted((m.get("withoutHeaders") or {}).items()):
        out.headers.append(_header_matcher(str(name).lower(), spec, invert=True))
    for name, spec in sorted((m.get("queryParams") or {}).items()):
        qp = out.query_parameters.add(name=str(name))
        sm = values.string_match(spec or {})
        if sm is None:
            qp.present_match = True
        else:
            qp.string_match.CopyFrom(sm)
    return out


# -- headers -------------------------------------------------------------
def _header_ops(spec: dict | None, to_add, to_remove) -> str | None:
    """set/add/remove into Envoy's lists; returns a Host set (a host rewrite)."""
    host = None
    spec = spec or {}
    for verb, action in (("set", OVERWRITE), ("add", APPEND)):
        for name, value in sorted((spec.get(verb) or {}).items()):
            name = str(name).lower()
            if name in ("host", ":authority"):
                host = str(value)           # Envoy will not add these; istiod rewrites the host
                continue
            if name.startswith(":"):
                continue
            hv = to_add.add()
            hv.header.key, hv.header.value = name, str(value)
            hv.append_action = action
    to_remove.extend(str(n).lower() for n in spec.get("remove") or [])
    return host


# -- destinations --------------------------------------------------------
def destination(ctx: RouteContext, vs: Resource, dest: dict) -> tuple[str, str, int]:
    """(cluster name, host, port) of an Istio Destination."""
    idx = ctx.idx
    host = idx.resolve(str(dest.get("host") or ""), vs.namespace)
    number = (dest.get("port") or {}).get("number")
    svc = idx.services.get(host)
    if number:
        port = int(number)
    elif svc and len(svc.ports) == 1:
        port = svc.ports[0].number
    elif svc and svc.port(ctx.port):
        port = ctx.port
    elif svc and svc.ports:
        port = svc.ports[0].number
    else:
        port = ctx.port
    return cluster_name(host, port, str(dest.get("subset") or "")), host, port


def _hash_policy(ctx: RouteContext, host: str, port: int, subset: str) -> tuple | None:
    key = (host, port, subset)
    cache = ctx.idx.memo.setdefault("hash_policy", {})
    if key not in cache:
        cache[key] = _hash_policy_of(ctx, host, port, subset)
    return cache[key]


def _hash_policy_of(ctx: RouteContext, host: str, port: int, subset: str) -> tuple | None:
    dr = ctx.idx.destination_rule(host)
    if dr is None:
        return None
    sub = next((s for s in dr.spec.get("subsets") or [] if s.get("name") == subset), None) if subset else None
    ch = (traffic_policy(dr, sub, port).get("loadBalancer") or {}).get("consistentHash")
    if not ch:
        return None
    if ch.get("httpHeaderName"):
        return ("header", str(ch["httpHeaderName"]))
    if ch.get("httpCookie"):
        c = ch["httpCookie"]
        ttl = values.seconds(dr, "spec.trafficPolicy.loadBalancer.consistentHash.httpCookie.ttl",
                             c["ttl"]) if c.get("ttl") else None
        return ("cookie", str(c.get("name") or ""), str(c.get("path") or ""), ttl)
    if ch.get("useSourceIp"):
        return ("source_ip",)
    if ch.get("httpQueryParameterName"):
        return ("query", str(ch["httpQueryParameterName"]))
    return None


def _apply_hash_policy(action: rc.RouteAction, key: tuple) -> None:
    hp = action.hash_policy.add()
    if key[0] == "header":
        hp.header.header_name = key[1]
    elif key[0] == "cookie":
        hp.cookie.name = key[1]
        if key[2]:
            hp.cookie.path = key[2]
        if key[3] is not None:
            hp.cookie.ttl.FromNanoseconds(int(key[3] * 1e9))
    elif key[0] == "source_ip":
        hp.connection_properties.source_ip = True
    else:
        hp.query_parameter.name = key[1]


def _route_action(ctx: RouteContext, vs: Resource, http: dict, path: str, route: rc.Route) -> None:
    action = route.route
    dests = [d for d in http.get("route") or [] if isinstance(d, dict)]
    weighted = [d for d in dests if len(dests) == 1 or int(d.get("weight") or 0) > 0] or dests[:1]
    hashes = set()
    host_rewrite = None
    if len(weighted) == 1:
        d = weighted[0]
        name, host, port = destination(ctx, vs, d.get("destination") or {})
        action.cluster = name
        hdrs = d.get("headers") or {}
        host_rewrite = _header_ops(hdrs.get("request"), route.request_headers_to_add, route.request_headers_to_remove)
        _header_ops(hdrs.get("response"), route.response_headers_to_add, route.response_headers_to_remove)
        hashes.add(_hash_policy(ctx, host, port, str((d.get("destination") or {}).get("subset") or "")))
    else:
        for d in weighted:
            name, host, port = destination(ctx, vs, d.get("destination") or {})
            cw = action.weighted_clusters.clusters.add(name=name)
            cw.weight.value = int(d.get("weight") or 0)
            hdrs = d.get("headers") or {}
            h = _header_ops(hdrs.get("request"), cw.request_headers_to_add, cw.request_headers_to_remove)
            if h:
                cw.host_rewrite_literal = h
            _header_ops(hdrs.get("response"), cw.response_headers_to_add, cw.response_headers_to_remove)
            hashes.add(_hash_policy(ctx, host, port, str((d.get("destination") or {}).get("subset") or "")))
    # A hash policy only makes sense when every destination hashes the same way.
    if len(hashes) == 1 and None not in hashes:
        _apply_hash_policy(action, hashes.pop())
    rewrite = http.get("rewrite") or {}
    if rewrite.get("authority"):
        host_rewrite = str(rewrite["authority"])
    if host_rewrite:
        action.host_rewrite_literal = host_rewrite
    if rewrite.get("uri") is not None:
        if route.match.HasField("safe_regex"):
            # prefix_rewrite needs a prefix or path match: replace the whole path.
            action.regex_rewrite.pattern.regex = route.match.safe_regex.regex
            action.regex_rewrite.substitution = str(rewrite["uri"])
        else:
            action.prefix_rewrite = str(rewrite["uri"])
    if rewrite.get("uriRegexRewrite"):
        rr = rewrite["uriRegexRewrite"]
        action.regex_rewrite.pattern.regex = str(rr.get("match") or "")
        action.regex_rewrite.substitution = str(rr.get("rewrite") or "")
    # istiod disables Envoy's 15 s default: no timeout unless asked for.
    timeout = values.duration(vs, f"{path}.timeout", http["timeout"]) if http.get("timeout") else None
    if timeout is not None:
        action.timeout.CopyFrom(timeout)
        if ctx.grpc:
            action.max_stream_duration.max_stream_duration.CopyFrom(timeout)  # gRFC A31
    else:
        action.timeout.SetInParent()
    if not ctx.grpc:
        # As istiod: Envoy honours a client's grpc-timeout header, capped by
        # the route timeout (0 = no cap). Like istiod, the deprecated
        # max_grpc_timeout: any max_stream_duration would switch the route to
        # Envoy's "new timeouts", where the route timeout no longer applies.
        if timeout is not None:
            action.max_grpc_timeout.CopyFrom(timeout)
        else:
            action.max_grpc_timeout.SetInParent()
    _retry_policy(vs, http.get("retries"), f"{path}.retries", action)
    mirrors = list(http.get("mirrors") or [])
    if http.get("mirror"):
        mirrors.insert(0, {"destination": http["mirror"], "percentage": http.get("mirrorPercentage"),
                           "_legacy": http.get("mirrorPercent")})
    for m in mirrors:
        name, _, _ = destination(ctx, vs, m.get("destination") or {})
        mp = action.request_mirror_policies.add(cluster=name)
        mp.runtime_fraction.default_value.CopyFrom(values.percentage(m.get("percentage"), m.get("_legacy")))
        mp.trace_sampled.value = False


def _retry_policy(vs: Resource, retries: dict | None, path: str, action: rc.RouteAction) -> None:
    if retries is None:
        action.retry_policy.CopyFrom(_DEFAULT_RETRY)
        return
    if int(retries.get("attempts") or 0) == 0:
        return                                   # attempts: 0 turns retries off
    _fill_retry_policy(vs, retries, path, action.retry_policy)


def _fill_retry_policy(vs: Resource | None, retries: dict | None, path: str, rp: rc.RetryPolicy) -> None:
    retry_on = DEFAULT_RETRY_ON
    rp.num_retries.value = DEFAULT_RETRIES
    if retries:
        rp.num_retries.value = int(retries["attempts"])
        if retries.get("perTryTimeout"):
            rp.per_try_timeout.CopyFrom(values.duration(vs, f"{path}.perTryTimeout", retries["perTryTimeout"]))
        if retries.get("retryOn"):
            words, codes = [], []
            for w in str(retries["retryOn"]).split(","):
                w = w.strip()
                if w.isdigit():
                    codes.append(int(w))
                elif w:
                    words.append(w)
            if codes and "retriable-status-codes" not in words:
                words.append("retriable-status-codes")
            retry_on = ",".join(words)
            rp.retriable_status_codes.extend(codes)
    if not rp.retriable_status_codes and "retriable-status-codes" in retry_on:
        rp.retriable_status_codes.append(503)
    rp.retry_on = retry_on
    pred = rp.retry_host_predicate.add(name="envoy.retry_host_predicates.previous_hosts")
    pred.typed_config.CopyFrom(_pack(previous_hosts_pb2.PreviousHostsPredicate()))
    rp.host_selection_retry_max_attempts = 5


_DEFAULT_RETRY = rc.RetryPolicy()
_fill_retry_policy(None, None, "", _DEFAULT_RETRY)


def _redirect(http: dict, route: rc.Route) -> None:
    spec = http["redirect"]
    r = route.redirect
    if spec.get("uri"):
        r.path_redirect = str(spec["uri"])
    if spec.get("authority"):
        r.host_redirect = str(spec["authority"])
    scheme = str(spec.get("scheme") or "")
    if scheme:
        r.scheme_redirect = scheme
    if spec.get("port"):
        r.port_redirect = int(spec["port"])
    elif str(spec.get("derivePort") or "") == "FROM_PROTOCOL_DEFAULT":
        r.port_redirect = 443 if scheme == "https" else 80
    r.response_code = _REDIRECT_CODES.get(int(spec.get("redirectCode") or 301), rc.RedirectAction.MOVED_PERMANENTLY)


def _direct_response(http: dict, route: rc.Route) -> None:
    spec = http["directResponse"]
    route.direct_response.status = int(spec.get("status") or 200)
    body = spec.get("body") or {}
    if body.get("string") is not None:
        route.direct_response.body.inline_string = str(body["string"])
    elif body.get("bytes") is not None:
        route.direct_response.body.inline_bytes = base64.b64decode(str(body["bytes"]))


def _fault(vs: Resource, spec: dict, path: str) -> fault_pb2.HTTPFault:
    f = fault_pb2.HTTPFault()
    delay = spec.get("delay")
    if delay:
        f.delay.fixed_delay.CopyFrom(values.duration(vs, f"{path}.delay.fixedDelay", delay.get("fixedDelay") or "0s"))
        f.delay.percentage.CopyFrom(values.percentage(delay.get("percentage"), delay.get("percent")))
    abort = spec.get("abort")
    if abort:
        if abort.get("grpcStatus") is not None:
            g = abort["grpcStatus"]
            f.abort.grpc_status = int(g) if str(g).isdigit() else GRPC_STATUS.get(str(g).upper(), 2)
        else:
            f.abort.http_status = int(abort.get("httpStatus") or 500)
        f.abort.percentage.CopyFrom(values.percentage(abort.get("percentage")))
    return f


def _cors(spec: dict, vs: Resource, path: str) -> cors_pb2.CorsPolicy:
    c = cors_pb2.CorsPolicy()
    for o in spec.get("allowOrigins") or []:
        sm = values.string_match(o or {})
        if sm is not None:
            c.allow_origin_string_match.append(sm)
    for o in spec.get("allowOrigin") or []:       # deprecated: exact strings
        c.allow_origin_string_match.add().exact = str(o)
    if spec.get("allowMethods"):
        c.allow_methods = ",".join(str(m) for m in spec["allowMethods"])
    if spec.get("allowHeaders"):
        c.allow_headers = ",".join(str(h) for h in spec["allowHeaders"])
    if spec.get("exposeHeaders"):
        c.expose_headers = ",".join(str(h) for h in spec["exposeHeaders"])
    if spec.get("maxAge"):
        c.max_age = str(int(values.seconds(vs, f"{path}.maxAge", spec["maxAge"])))
    if spec.get("allowCredentials") is not None:
        c.allow_credentials.value = bool(spec["allowCredentials"])
    if spec.get("unmatchedPreflights") == "IGNORE":
        c.forward_not_matching_preflights.value = False
    return c


def http_routes(ctx: RouteContext, vs: Resource) -> list[rc.Route]:
    """The Envoy routes of one VirtualService for this context (port, gateways)."""
    out = []
    metadata = {}
    for source, http, path, matches in http_entries(ctx.idx, vs):
        # `gateways` in a match name the root's gateways; everything else is the source's.
        applicable = [m for m in matches if match_applies(ctx, vs, m)] if matches else [None]
        if not applicable:
            continue
        if source.ref not in metadata:
            metadata[source.ref] = _istio_metadata(source)
        for m in applicable:
            route = rc.Route()
            name = ".".join(str(n) for n in (http.get("name"), (m or {}).get("name")) if n)
            if name:
                route.name = name
            route.match.CopyFrom(route_match(m))
            if http.get("redirect"):
                _redirect(http, route)
            elif http.get("directResponse"):
                _direct_response(http, route)
            elif any(isinstance(d, dict) for d in http.get("route") or []):
                _route_action(ctx, source, http, path, route)
            else:
                continue                       # nothing to do: Envoy needs an action
            host = _header_ops((http.get("headers") or {}).get("request"),
                               route.request_headers_to_add, route.request_headers_to_remove)
            if host and route.HasField("route"):
                route.route.host_rewrite_literal = host
            _header_ops((http.get("headers") or {}).get("response"),
                        route.response_headers_to_add, route.response_headers_to_remove)
            if http.get("fault"):
                route.typed_per_filter_config[FAULT_FILTER].CopyFrom(
                    _pack(_fault(source, http["fault"], f"{path}.fault")))
            if http.get("corsPolicy") and not ctx.grpc:
                route.typed_per_filter_config[CORS_FILTER].CopyFrom(
                    _pack(_cors(http["corsPolicy"], source, f"{path}.corsPolicy")))
            route.metadata.CopyFrom(metadata[source.ref])
            route.metadata.filter_metadata[SOURCE_METADATA].update(_source_metadata(vs, source, path, matches, m))
            out.append(route)
    return out


def default_route(ctx: RouteContext, host: str, port: int) -> rc.Route:
    """The route istiod gives a service no VirtualService routes: all to its
    cluster, hashed as its DestinationRule's consistentHash says."""
    route = rc.Route(name="default")
    route.match.prefix = "/"
    route.route.cluster = cluster_name(host, port)
    key = _hash_policy(ctx, host, port, "")
    if key is not None:
        _apply_hash_policy(route.route, key)
    route.route.timeout.SetInParent()
    _retry_policy(None, None, "", route.route)
    return route
