"""VirtualService validation, after Istio's ValidateVirtualService and validateHTTPRoute.

Plus one mesh rule: L7 routing may match on the session and QoS headers
(mesh.headers.L7_READ_ONLY_HEADERS) but never set, add or remove them.
"""
from __future__ import annotations

import json
from typing import Iterator

from mcp26.mesh import hosts
from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.mesh.diagnostics import Diagnostic
from mcp26.mesh.headers import L7_READ_ONLY_HEADERS
from mcp26.mesh.validation import validator
from mcp26.mesh.validation.networking import check_kind, hosts_header_ok
from mcp26.mesh.validation.report import Report, semantic
from mcp26.mesh.validation.envoy_format import header_value_error
from mcp26.mesh.validation.regex import regex_error

# Envoy's x-envoy-retry-on and x-envoy-retry-grpc-on policies (Istio's list).
RETRY_ON = {
    "5xx", "gateway-error", "reset", "reset-before-request", "connect-failure", "retriable-4xx",
    "refused-stream", "retriable-status-codes", "retriable-headers", "envoy-ratelimited",
    "http3-post-connect-failure", "cancelled", "deadline-exceeded", "internal",
    "resource-exhausted", "unavailable",
}
HTTP_METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "OPTIONS", "TRACE"}
GRPC_STATUS = {
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
    "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
}
_READ_ONLY = {h.lower() for h in L7_READ_ONLY_HEADERS}
_JWT_CLAIM = "@request.auth.claims."
_KB, _MB = 1024, 1024 * 1024


@validator("VirtualService")
def validate_virtual_service(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    yield from semantic(_virtual_service, check_kind(res), res)


def _virtual_service(rep: Report, res: Resource) -> None:
    spec = res.spec
    vs_hosts = spec.get("hosts") or []
    gateways = spec.get("gateways") or []
    if not vs_hosts:  # a delegate VirtualService
        if gateways:
            rep.error("spec.gateways", "delegate virtual service must have no gateways specified")
        if spec.get("tls"):
            rep.error("spec.tls", "delegate virtual service must have no tls route specified")
        if spec.get("tcp"):
            rep.error("spec.tcp", "delegate virtual service must have no tcp route specified")
    for i, g in enumerate(gateways):
        _gateway_name(rep, f"spec.gateways[{i}]", g)
    applies_to_gateway = bool(gateways) and hosts.MESH_GATEWAY not in gateways
    applies_to_mesh = not applies_to_gateway

    all_valid = True
    for i, h in enumerate(vs_hosts):
        err = hosts.wildcard_domain_error(h)
        if err and not hosts.is_ip(h):
            rep.error(f"spec.hosts[{i}]", err)
            all_valid = False
        elif applies_to_mesh and h == "*":
            rep.error(f"spec.hosts[{i}]", "wildcard host * is not allowed for virtual services bound to the mesh gateway")
            all_valid = False
    if all_valid:
        # Istio compares every pair; without a wildcard two hosts overlap only when equal, so a
        # set finds those, and only wildcards are compared pairwise (10,000 plain hosts: ~10 ms,
        # not the minutes that 50 million pairs and their diagnostics took). One error per host,
        # naming the first one it repeats.
        first: dict[str, int] = {}
        wild: list[tuple[int, str]] = []
        for j, h in enumerate(vs_hosts):
            hl = h.lower()
            if "*" in hl:
                i = next((k for k in range(j) if hosts.hosts_overlap(vs_hosts[k].lower(), hl)), None)
            else:
                found = ([first[hl]] if hl in first else []) + [k for k, w in wild if hosts.hosts_overlap(w, hl)][:1]
                i = min(found) if found else None
            if i is not None:
                rep.error(f"spec.hosts[{j}]", f"duplicate hosts in virtual service: {vs_hosts[i]} & {h}")
            first.setdefault(hl, j)
            if "*" in hl:
                wild.append((j, hl))

    if not (spec.get("http") or spec.get("tcp") or spec.get("tls")):
        rep.error("spec", "http, tcp or tls must be provided in virtual service")
    for i, route in enumerate(spec.get("http") or []):
        _http_route(rep, f"spec.http[{i}]", route, delegate=not vs_hosts, gateway=applies_to_gateway)
    for i, route in enumerate(spec.get("tls") or []):
        _tls_route(rep, f"spec.tls[{i}]", route, vs_hosts, applies_to_gateway)
    for i, route in enumerate(spec.get("tcp") or []):
        _tcp_route(rep, f"spec.tcp[{i}]", route)
    rep.export_to("spec.exportTo", spec.get("exportTo"), res.namespace)
    for proto in ("http", "tcp", "tls"):
        _unreachable_rules(rep, proto, spec.get(proto) or [])


def _gateway_name(rep: Report, p: str, name: str) -> None:
    ns, sep, gw = name.partition("/")
    if not sep:
        if "." in name:
            parts = name.split(".")
            rep.warn(p, f"using legacy gatewayName format {name!r}; prefer the <namespace>/<name> format: "
                        f"\"{parts[1]}/{parts[0]}\"")
        err = hosts.fqdn_error(name)
        if err:
            rep.error(p, err)
        return
    if not ns or not gw:
        rep.error(p, "config namespace and gateway name cannot be empty")
        return
    if not hosts.is_dns1123_label(ns):
        rep.error(p, f"invalid value for namespace: {ns!r}")
    if not hosts.is_dns1123_label(gw):
        rep.error(p, f"invalid value for gateway name: {gw!r}")


def _http_route(rep: Report, p: str, r: dict, delegate: bool, gateway: bool) -> None:
    route, redirect, direct = r.get("route") or [], r.get("redirect"), r.get("directResponse")
    if r.get("delegate") is not None:
        if delegate:
            rep.error(f"{p}.delegate", "delegate HTTP route cannot contain delegate")
        else:  # a root route: delegate only
            if redirect is not None:
                rep.error(f"{p}.redirect", f"root HTTP route {r.get('name', '')} must not specify redirect")
            if route:
                rep.error(f"{p}.route", f"root HTTP route {r.get('name', '')} must not specify route")
    elif redirect is not None:
        if route:
            rep.error(f"{p}.route", "HTTP route cannot contain both route and redirect")
        if r.get("fault") is not None:
            rep.error(f"{p}.fault", "HTTP route cannot contain both fault and redirect")
        if r.get("rewrite") is not None:
            rep.error(f"{p}.rewrite", "HTTP route rule cannot contain both rewrite and redirect")
        if direct is not None:
            rep.error(f"{p}.directResponse", "HTTP route rule cannot contain both direct_response and redirect")
    elif direct is not None:
        if route:
            rep.error(f"{p}.route", "HTTP route cannot contain both route and direct_response")
        if r.get("fault") is not None:
            rep.error(f"{p}.fault", "HTTP route cannot contain both fault and direct_response")
        if r.get("rewrite") is not None:
            rep.error(f"{p}.rewrite", "HTTP route rule cannot contain both rewrite and direct_response")
    elif not route:
        rep.error(f"{p}.route", "HTTP route, redirect or direct_response is required")
    if r.get("mirror") is not None and r.get("mirrors"):
        rep.error(f"{p}.mirrors", "HTTP route cannot contain both mirror and mirrors")

    for i, m in enumerate(r.get("match") or []):
        _http_match(rep, f"{p}.match[{i}]", m, delegate, gateway)
    _header_operations(rep, f"{p}.headers", r.get("headers"))
    _cors(rep, f"{p}.corsPolicy", r.get("corsPolicy"))
    _fault(rep, f"{p}.fault", r.get("fault"))
    if r.get("mirrorPercent") is not None:
        if r["mirrorPercent"] > 100:
            rep.error(f"{p}.mirrorPercent", f"mirror_percent must have a max value of 100 (it has {r['mirrorPercent']})")
        rep.warn(f"{p}.mirrorPercent", 'using deprecated setting "mirrorPercent", use "mirrorPercentage" instead')
    _mirror_percentage(rep, f"{p}.mirrorPercentage", r.get("mirrorPercentage"), "mirror_percentage")
    _destination(rep, f"{p}.mirror", r.get("mirror"))
    for i, m in enumerate(r.get("mirrors") or []):
        _destination(rep, f"{p}.mirrors[{i}].destination", m.get("destination"))
        _mirror_percentage(rep, f"{p}.mirrors[{i}].percentage", m.get("percentage"), "mirror percentage")
    _redirect(rep, f"{p}.redirect", redirect)
    _direct_response(rep, f"{p}.directResponse", direct)
    _retries(rep, f"{p}.retries", r.get("retries"))
    _rewrite(rep, f"{p}.rewrite", r.get("rewrite"))
    _authority_rewrite(rep, p, r.get("rewrite"), r.get("headers"))
    _route_destinations(rep, f"{p}.route", route, http=True)
    rep.duration(f"{p}.timeout", r.get("timeout"))


def _http_match(rep: Report, p: str, m: dict, delegate: bool, gateway: bool) -> None:
    for field in ("uri", "scheme", "method", "authority"):
        sm = m.get(field)
        if delegate and sm and sm.get("regex") is not None:
            rep.error(f"{p}.{field}", f"{'url' if field == 'uri' else field} match does not support regex match for delegating")
        else:
            _string_match(rep, f"{p}.{field}", sm, field)
    for kind in ("headers", "withoutHeaders"):
        for name, sm in (m.get(kind) or {}).items():
            hp = f"{p}.{kind}.{name}"
            if sm is None:
                rep.error(hp, f"{'header' if kind == 'headers' else 'withoutHeaders'} match {name} cannot be null")
                continue
            if name.startswith(_JWT_CLAIM):
                if not gateway:
                    rep.error(hp, f"JWT claim based routing (key: {name}) is only supported for gateway, found no gateways")
            elif not hosts_header_ok(name):
                rep.error(hp, f"header name {name} is not a valid header name")
            if delegate and sm.get("regex") is not None:
                rep.error(hp, f"header match {name} does not support regex match for delegating")
            else:
                _string_match(rep, hp, sm, kind)
    for name, sm in (m.get("queryParams") or {}).items():
        qp = f"{p}.queryParams.{name}"
        if sm is None:
            rep.error(qp, f"query param match {name} cannot be null")
        else:
            _string_match(rep, qp, sm, "queryParams")
    if m.get("port"):
        rep.port(f"{p}.port", m["port"])
    rep.labels(f"{p}.sourceLabels", m.get("sourceLabels"))
    for i, g in enumerate(m.get("gateways") or []):
        _gateway_name(rep, f"{p}.gateways[{i}]", g)
    ns = m.get("sourceNamespace")
    if ns and not hosts.is_dns1123_label(ns):
        rep.error(f"{p}.sourceNamespace", f"sourceNamespace match {ns} is invalid")


def _string_match(rep: Report, p: str, sm: dict | None, where: str) -> None:
    if not sm:
        return
    if "regex" in sm:
        regex = sm["regex"]
        if regex == "":
            rep.error(f"{p}.regex", f"\"{where}\": regex string match should not be empty")
        else:
            err = regex_error(regex)
            if err:
                rep.error(f"{p}.regex", f"\"{where}\": {err}")


def _header_operations(rep: Report, p: str, headers: dict | None) -> None:
    if not headers:
        return
    for side in ("request", "response"):
        ops = headers.get(side) or {}
        for op in ("set", "add"):
            for name, value in (ops.get(op) or {}).items():
                hp = f"{p}.{side}.{op}.{name}"
                err = _op_name_error(name, side == "request")
                if err:
                    rep.error(hp, err)
                err = header_value_error(str(value))
                if err:
                    rep.error(hp, err)
                _read_only(rep, hp, name, side, op)
        for i, name in enumerate(ops.get("remove") or []):
            hp = f"{p}.{side}.remove[{i}]"
            err = _op_name_error(name, allow_authority=False)
            if err:
                rep.error(hp, err)
            _read_only(rep, hp, name, side, "remove")


def _read_only(rep: Report, p: str, name: str, side: str, op: str) -> None:
    if side == "request" and name.lower() in _READ_ONLY:
        rep.error(p, f"header {name!r} is a mesh session/QoS header: L7 routing may match on it but "
                     f"may not {op} it (it is set from verified identity and covered by x-mcp-session-sig)")


def _op_name_error(name: str, allow_authority: bool) -> str | None:
    """Istio's ValidateHTTPHeader(WithAuthority)OperationName."""
    if not name:
        return "header name cannot be empty"
    lower = name.lower()
    is_authority = lower in (":authority", "host")
    if allow_authority and is_authority:
        return None
    if lower == "host":
        return f'invalid header "{name}": cannot set Host header'
    if name.startswith(":"):
        return f'invalid header "{name}": header cannot have ":" prefix'
    return None


def _authority_rewrite(rep: Report, p: str, rewrite: dict | None, headers: dict | None) -> None:
    current = (rewrite or {}).get("authority") or ""
    request = (headers or {}).get("request") or {}
    for op in ("set", "add"):
        for k, v in (request.get(op) or {}).items():
            if k.lower() not in (":authority", "host"):
                continue
            if current:
                rep.error(f"{p}.headers.request.{op}.{k}",
                          f"authority header cannot be set multiple times: have {current!r}, attempting to set {v!r}")
            current = v


def _cors(rep: Report, p: str, cors: dict | None) -> None:
    if cors is None:
        return
    for i, origin in enumerate(cors.get("allowOrigins") or []):
        value = next((origin.get(k) for k in ("exact", "prefix", "regex") if origin.get(k)), "")
        if not value:
            rep.error(f"{p}.allowOrigins[{i}]", "'' is not a valid match type for CORS allow origins")
        else:
            _string_match(rep, f"{p}.allowOrigins[{i}]", origin, "corsPolicy.allowOrigins")
    for i, method in enumerate(cors.get("allowMethods") or []):
        if method not in HTTP_METHODS:
            rep.error(f"{p}.allowMethods[{i}]", f"{method!r} is not a supported HTTP method")
    for field in ("allowHeaders", "exposeHeaders"):
        for i, name in enumerate(cors.get(field) or []):
            if not name:
                rep.error(f"{p}.{field}[{i}]", "header name cannot be empty")
            elif name != "*" and not hosts_header_ok(name):
                rep.error(f"{p}.{field}[{i}]", f"header name {name} is not a valid header name")
    rep.duration(f"{p}.maxAge", cors.get("maxAge"), seconds_only=True)


def _percentage(rep: Report, p: str, pct: dict | None) -> None:
    if pct is None:
        return
    v = pct.get("value", 0.0) or 0.0
    if v < 0.0 or v > 100.0 or 0.0 < v < 0.0001:
        rep.error(f"{p}.value", f"percentage {v} is neither 0.0, nor in range [0.0001, 100.0]")


def _mirror_percentage(rep: Report, p: str, pct: dict | None, what: str) -> None:
    if pct is None:
        return
    v = pct.get("value", 0.0) or 0.0
    if v > 100:
        rep.error(f"{p}.value", f"{what} must have a max value of 100 (it has {v:f})")
    if v < 0:
        rep.error(f"{p}.value", f"{what} must have a min value of 0 (it has {v:f})")


def _fault(rep: Report, p: str, fault: dict | None) -> None:
    if fault is None:
        return
    abort, delay = fault.get("abort"), fault.get("delay")
    if abort is None and delay is None:
        rep.error(p, "HTTP fault injection must have an abort and/or a delay")
    if abort is not None:
        _percentage(rep, f"{p}.abort.percentage", abort.get("percentage"))
        if abort.get("grpcStatus") is not None:
            if abort["grpcStatus"] not in GRPC_STATUS:
                rep.error(f"{p}.abort.grpcStatus", f"gRPC status {abort['grpcStatus']!r} is not supported. See "
                          "https://github.com/grpc/grpc/blob/master/doc/statuscodes.md for a list of supported "
                          "codes, for example 'NOT_FOUND'")
        elif abort.get("http2Error") is not None:
            rep.error(f"{p}.abort.http2Error", "HTTP/2 abort fault injection not supported yet")
        elif abort.get("httpStatus") is not None:
            _http_status(rep, f"{p}.abort.httpStatus", abort["httpStatus"])
        else:
            rep.warn(f"{p}.abort", "abort configured, but error type not set")
    if delay is not None:
        _percentage(rep, f"{p}.delay.percentage", delay.get("percentage"))
        if delay.get("percent") is not None and not 0 <= delay["percent"] <= 100:
            rep.error(f"{p}.delay.percent", f"percentage {delay['percent']} is not in range 0..100")
        if delay.get("exponentialDelay") is not None:
            rep.duration(f"{p}.delay.exponentialDelay", delay["exponentialDelay"])
            rep.error(f"{p}.delay.exponentialDelay", "exponentialDelay not supported yet")
        elif delay.get("fixedDelay") is not None:
            rep.duration(f"{p}.delay.fixedDelay", delay["fixedDelay"])
        else:
            rep.error(f"{p}.delay", "delay must set fixedDelay")


def _http_status(rep: Report, p: str, status: int) -> None:
    if status < 200 or status > 599:
        rep.error(p, f"HTTP status {status} is not in range 200-599")


def _redirect(rep: Report, p: str, redirect: dict | None) -> None:
    if redirect is None:
        return
    if not (redirect.get("uri") or redirect.get("authority") or redirect.get("port") or redirect.get("derivePort")
            or redirect.get("scheme")):
        rep.error(p, "redirect must specify URI, authority, scheme, or port")
    code = redirect.get("redirectCode")
    if code and not 300 <= code <= 399:
        rep.error(f"{p}.redirectCode", f"{code} is not a valid redirect code, must be 3xx")
    scheme = redirect.get("scheme")
    if scheme and scheme not in ("http", "https"):
        rep.error(f"{p}.scheme", 'invalid redirect scheme, must be "http" or "https"')
    if redirect.get("port"):
        rep.port(f"{p}.port", redirect["port"])


def _direct_response(rep: Report, p: str, direct: dict | None) -> None:
    if direct is None:
        return
    body = direct.get("body") or {}
    size = len(body.get("string") or body.get("bytes") or "")
    if size > _MB:
        rep.error(f"{p}.body", "large direct_responses may impact control plane performance, must be less than 1MB")
    elif size > 100 * _KB:
        rep.warn(f"{p}.body", "large direct_responses may impact control plane performance")
    _http_status(rep, f"{p}.status", direct.get("status", 0))


def _retries(rep: Report, p: str, retries: dict | None) -> None:
    if retries is None:
        return
    attempts = retries.get("attempts") or 0
    if attempts < 0:
        rep.error(f"{p}.attempts", "attempts cannot be negative")
    if attempts == 0 and any(retries.get(k) is not None for k in ("perTryTimeout", "retryOn", "retryRemoteLocalities")):
        rep.error(f"{p}.attempts", "http retry policy configured when attempts are set to 0 (disabled)")
    rep.duration(f"{p}.perTryTimeout", retries.get("perTryTimeout"))
    rep.duration(f"{p}.backoff", retries.get("backoff"))
    if retries.get("retryOn"):
        for policy in retries["retryOn"].split(","):
            if policy in RETRY_ON or (policy.isdigit() and 100 <= int(policy) <= 599):
                continue
            rep.error(f"{p}.retryOn", f"{policy!r} is not a valid retryOn policy")


def _rewrite(rep: Report, p: str, rewrite: dict | None) -> None:
    if rewrite is None:
        return
    regex_rewrite = rewrite.get("uriRegexRewrite")
    if rewrite.get("uri") and regex_rewrite is not None:
        rep.error(p, "rewrite may only contain one of URI or UriRegexRewrite")
    if not rewrite.get("uri") and regex_rewrite is None and not rewrite.get("authority"):
        rep.error(p, "rewrite must specify at least one of URI, UriRegexRewrite, or authority. "
                     "Only one of URI or UriRegexRewrite may be specified")
    if regex_rewrite is not None:
        if not regex_rewrite.get("match") or not regex_rewrite.get("rewrite"):
            rep.error(f"{p}.uriRegexRewrite", "UriRegexRewrite requires both Rewrite and Match fields to be specified")
        else:
            err = regex_error(regex_rewrite["match"])
            if err:
                rep.error(f"{p}.uriRegexRewrite.match", f"UriRegexRewrite has errors: \"HTTPRewrite.UriRegexRewrite.Match\": {err}")


def _destination(rep: Report, p: str, d: dict | None) -> None:
    if d is None:
        return
    host = d.get("host", "")
    if host == "*":
        rep.error(f"{p}.host", f"invalid destination host {host}")
    else:
        err = hosts.wildcard_domain_error(host)
        if err:
            rep.error(f"{p}.host", err)
    subset = d.get("subset")
    if subset is not None:
        if not subset:
            rep.error(f"{p}.subset", "subset name cannot be empty")
        elif not hosts.is_dns1123_label(subset):
            rep.error(f"{p}.subset", f"subset name is invalid: {subset}")
    if d.get("port") is not None:
        rep.port(f"{p}.port.number", d["port"].get("number", 0))


def _route_destinations(rep: Report, p: str, dests: list, http: bool) -> None:
    total = 0
    for i, rd in enumerate(dests):
        dp = f"{p}[{i}]"
        if http:
            _header_operations(rep, f"{dp}.headers", rd.get("headers"))
        _destination(rep, f"{dp}.destination", rd.get("destination"))
        weight = rd.get("weight") or 0
        if weight < 0:
            rep.error(f"{dp}.weight", f"weight {weight} < 0")
        total += max(weight, 0)
    if len(dests) > 1 and total == 0:
        rep.error(p, "total destination weight = 0")


def _tls_route(rep: Report, p: str, r: dict, vs_hosts: list, gateway: bool) -> None:
    matches = r.get("match") or []
    if not matches:
        rep.error(f"{p}.match", "TLS route must have at least one match condition")
    for i, m in enumerate(matches):
        mp = f"{p}.match[{i}]"
        sni = m.get("sniHosts") or []
        if not sni:
            rep.error(f"{mp}.sniHosts", "TLS match must have at least one SNI host")
        for j, h in enumerate(sni):
            err = hosts.wildcard_domain_error(h)
            if err:
                if hosts.is_ip(h):
                    rep.warn(f"{mp}.sniHosts[{j}]", f"using an IP address ({h!r}) goes against SNI spec and most clients do not support this")
                else:
                    rep.error(f"{mp}.sniHosts[{j}]", err)
                continue
            if not any(hosts.host_matches(v.lower(), h.lower()) for v in vs_hosts):
                rep.error(f"{mp}.sniHosts[{j}]", f"SNI host {h!r} is not a compatible subset of any of the virtual "
                                                 f"service hosts: [{', '.join(vs_hosts)}]")
        _l4_match(rep, mp, m)
    if not r.get("route"):
        rep.error(f"{p}.route", "TLS route is required")
    _route_destinations(rep, f"{p}.route", r.get("route") or [], http=False)


def _tcp_route(rep: Report, p: str, r: dict) -> None:
    for i, m in enumerate(r.get("match") or []):
        _l4_match(rep, f"{p}.match[{i}]", m)
        if m.get("sourceSubnet"):
            err = hosts.ip_subnet_error(m["sourceSubnet"])
            if err:
                rep.error(f"{p}.match[{i}].sourceSubnet", err)
    if not r.get("route"):
        rep.error(f"{p}.route", "TCP route is required")
    _route_destinations(rep, f"{p}.route", r.get("route") or [], http=False)


def _l4_match(rep: Report, p: str, m: dict) -> None:
    for i, subnet in enumerate(m.get("destinationSubnets") or []):
        err = hosts.ip_subnet_error(subnet)
        if err:
            rep.error(f"{p}.destinationSubnets[{i}]", err)
    if m.get("port"):
        rep.port(f"{p}.port", m["port"])
    rep.labels(f"{p}.sourceLabels", m.get("sourceLabels"))
    for i, g in enumerate(m.get("gateways") or []):
        _gateway_name(rep, f"{p}.gateways[{i}]", g)


def _unreachable_rules(rep: Report, proto: str, routes: list) -> None:
    """Istio's analyzeUnreachable*Rules, reported as istioctl's IST0130/IST0131."""
    def unused(n: int, name: str, reason: str) -> None:
        rep.out.append(rep.res.diagnostic(f"spec.{proto}[{n}]", f"VirtualService rule {name} not used ({reason})",
                                          code="IST0130", severity="warning"))

    def ineffective(path: str, name: str, match: str, prior: str) -> None:
        rep.out.append(rep.res.diagnostic(path, f"VirtualService rule {name} match {match} is not used "
                                          f"(duplicate/overlapping match in rule {prior})", code="IST0131", severity="info"))

    def route_name(n: int) -> str:
        return f'"{routes[n]["name"]}"' if proto == "http" and routes[n].get("name") else f"#{n}"

    seen: dict[str, int] = {}
    prefixes: list[tuple[int, int, dict]] = []   # (rule, match, match) of prefix URI matches, in order
    empty_at = -1
    for n, route in enumerate(routes):
        name = route_name(n)
        matches = route.get("match") or []
        if not matches:
            if empty_at >= 0:
                unused(n, name, "only the last rule can have no matches")
            empty_at = n
            continue
        dupes = 0
        for k, m in enumerate(matches):
            if empty_at >= 0:
                unused(n, name, "route without matches defined before")
                continue
            key = json.dumps({f: v for f, v in m.items() if f != "name"}, sort_keys=True)
            if key in seen:
                dupes += 1
                ineffective(f"spec.{proto}[{n}].match[{k}]", name, f'"{m["name"]}"' if m.get("name") else f"#{k}",
                            route_name(seen[key]))
                continue
            seen[key] = n
            if proto == "http" and (m.get("uri") or {}).get("prefix"):
                prefixes.append((n, k, m))
        if dupes == len(matches):
            unused(n, name, "all matches used by prior rules")
    # Istio's genMatchHTTPRoutes/coveredValidation: a later prefix match that an
    # earlier, shorter prefix (with the same other conditions) already takes.
    for a, (na, ka, ma) in enumerate(prefixes):
        for nb, kb, mb in prefixes[a + 1:]:
            pa, pb = ma["uri"]["prefix"], mb["uri"]["prefix"]
            if pa != pb and _prefix_covered(ma, mb):
                mname_a = f'"{ma["name"]}"' if ma.get("name") else f"#{ka}"
                mname_b = f'"{mb["name"]}"' if mb.get("name") else f"#{kb}"
                ineffective(f"spec.http[{nb}].match[{kb}].uri.prefix", route_name(nb), f"{mname_b} of prefix {pb}",
                            f"{mname_a} of prefix {pa} on {route_name(na)}")


def _exact_or_prefix(sm: dict | None) -> str:
    """Istio's assignExactOrPrefix."""
    sm = sm or {}
    if sm.get("exact"):
        return "exact:" + sm["exact"]
    if sm.get("prefix"):
        return "prefix:" + sm["prefix"]
    return ""


def _prefix_covered(a: dict, b: dict) -> bool:
    """Istio's coveredValidation(vA, vB): does earlier match `a` take every
    request later match `b` would? Istio's rule, quirks kept: a method left
    unset counts as exact GET, and a differing value is covered when a's value
    starts with b's."""
    if not b["uri"]["prefix"].startswith(a["uri"]["prefix"]) or (a.get("port") or 0) != (b.get("port") or 0):
        return False
    method_a, method_b = (_exact_or_prefix(m.get("method")) or "exact:GET" for m in (a, b))
    if method_a != method_b and not method_a.startswith(method_b):
        return False
    auth_a, auth_b = _exact_or_prefix(a.get("authority")), _exact_or_prefix(b.get("authority"))
    if auth_a != auth_b and not auth_a.startswith(auth_b):
        return False
    for kind in ("headers", "queryParams", "withoutHeaders"):
        ma = {k: _exact_or_prefix(v) for k, v in (a.get(kind) or {}).items()}
        mb = {k: _exact_or_prefix(v) for k, v in (b.get(kind) or {}).items()}
        if len(ma) != len(mb) or any(k not in mb or (v != mb[k] and not v.startswith(mb[k])) for k, v in ma.items()):
            return False
    return True
