"""DestinationRule (networking.istio.io), after Istio's ValidateDestinationRule."""
from __future__ import annotations

from typing import Iterator

from mcp26.mesh import hosts
from mcp26.mesh.diagnostics import Diagnostic
from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.mesh.validation import validator
from mcp26.mesh.validation.networking import check_kind, hosts_header_ok
from mcp26.mesh.validation.report import Report, semantic


@validator("DestinationRule")
def validate_destination_rule(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    yield from semantic(_destination_rule, check_kind(res), res)


def _destination_rule(rep: Report, res: Resource) -> None:
    spec = res.spec
    if spec.get("host"):   # a missing host is the schema's "host is required"
        err = hosts.wildcard_domain_error(spec["host"])
        if err:
            rep.error("spec.host", err)
    traffic_policy(rep, "spec.trafficPolicy", spec.get("trafficPolicy"))
    names: set[str] = set()
    for i, subset in enumerate(spec.get("subsets") or []):
        p = f"spec.subsets[{i}]"
        name = subset.get("name", "")
        if name in names:
            rep.error(f"{p}.name", f"duplicate subset names: {name}")
        names.add(name)
        if not hosts.is_dns1123_label(name):
            rep.error(f"{p}.name", f"subset name is invalid: {name}")
        if not subset.get("labels"):
            # Istio allows it; it is almost always a mistake: the subset is the whole service.
            rep.warn(f"{p}.labels", f"subset {name} has no labels: it selects every endpoint of {spec.get('host')}")
        rep.labels(f"{p}.labels", subset.get("labels"))
        traffic_policy(rep, f"{p}.trafficPolicy", subset.get("trafficPolicy"))
    selector = spec.get("workloadSelector")
    rep.export_to("spec.exportTo", spec.get("exportTo"), res.namespace)
    if selector is not None:
        rep.workload_selector("spec.workloadSelector.matchLabels", selector.get("matchLabels") or {})
        if any(e not in (".", res.namespace) for e in spec.get("exportTo") or []):
            rep.error("spec.exportTo", "destination rule with workload selector cannot have exportTo beyond current namespace")


def traffic_policy(rep: Report, p: str, tp: dict | None, port_level: bool = False) -> None:
    if tp is None:
        return
    if not any(tp.get(k) is not None for k in tp):
        rep.error(p, "port traffic policy must have at least one field" if port_level
                  else "traffic policy must have at least one field")
        return
    if tp.get("tunnel") is not None and tp.get("proxyProtocol") is not None:
        rep.error(p, "tunnel and proxyProtocol must not be set together")
    _outlier_detection(rep, f"{p}.outlierDetection", tp.get("outlierDetection"))
    _connection_pool(rep, f"{p}.connectionPool", tp.get("connectionPool"))
    _load_balancer(rep, f"{p}.loadBalancer", tp.get("loadBalancer"), tp.get("outlierDetection"))
    _client_tls(rep, f"{p}.tls", tp.get("tls"))
    for i, pl in enumerate(tp.get("portLevelSettings") or []):
        pp = f"{p}.portLevelSettings[{i}]"
        if not pl.get("port"):
            rep.error(f"{pp}.port", "portTrafficPolicy must have valid port")
        else:
            rep.port(f"{pp}.port.number", pl["port"].get("number", 0))
        traffic_policy(rep, pp, {k: v for k, v in pl.items() if k != "port"}, port_level=True)
    tunnel = tp.get("tunnel")
    if tunnel is not None:
        if tunnel.get("protocol") not in (None, "", "CONNECT", "POST"):
            rep.error(f"{p}.tunnel.protocol", 'tunnel protocol must be "CONNECT" or "POST"')
        target = tunnel.get("targetHost") or ""
        if hosts.fqdn_error(target) and not hosts.is_ip(target):
            rep.error(f"{p}.tunnel.targetHost", f"tunnel target host must be valid FQDN or IP address: {target!r}")
        rep.port(f"{p}.tunnel.targetPort", tunnel.get("targetPort", 0))


def _outlier_detection(rep: Report, p: str, od: dict | None) -> None:
    if od is None:
        return
    rep.duration(f"{p}.baseEjectionTime", od.get("baseEjectionTime"))
    rep.duration(f"{p}.interval", od.get("interval"))
    if od.get("consecutiveErrors"):
        rep.warn(f"{p}.consecutiveErrors", "outlier detection consecutive errors is deprecated, "
                                           "use consecutiveGatewayErrors or consecutive5xxErrors instead")
    if not od.get("splitExternalLocalOriginErrors") and (od.get("consecutiveLocalOriginFailures") or 0) > 0:
        rep.error(f"{p}.consecutiveLocalOriginFailures", "outlier detection consecutive local origin failures is "
                                                         "specified, but split external local origin errors is set to false")
    for k in ("maxEjectionPercent", "minHealthPercent"):
        v = od.get(k)
        if v is not None and not 0 <= v <= 100:
            rep.error(f"{p}.{k}", f"percentage {v} is not in range 0..100")


def _connection_pool(rep: Report, p: str, cp: dict | None) -> None:
    if cp is None:
        return
    if cp.get("http") is None and cp.get("tcp") is None:
        rep.error(p, "connection pool must have at least one field")
        return
    http = cp.get("http") or {}
    for k, what in (("http1MaxPendingRequests", "http1 max pending requests"), ("http2MaxRequests", "http2 max requests"),
                    ("maxRequestsPerConnection", "max requests per connection"), ("maxRetries", "max retries"),
                    ("maxConcurrentStreams", "max concurrent streams")):
        if (http.get(k) or 0) < 0:
            rep.error(f"{p}.http.{k}", f"{what} must be non-negative")
    rep.duration(f"{p}.http.idleTimeout", http.get("idleTimeout"))
    if http.get("h2UpgradePolicy") == "UPGRADE" and http.get("useClientProtocol"):
        rep.error(f"{p}.http.useClientProtocol", "use client protocol must not be true when H2UpgradePolicy is UPGRADE")
    tcp = cp.get("tcp") or {}
    if (tcp.get("maxConnections") or 0) < 0:
        rep.error(f"{p}.tcp.maxConnections", "max connections must be non-negative")
    for k in ("connectTimeout", "maxConnectionDuration", "idleTimeout"):
        rep.duration(f"{p}.tcp.{k}", tcp.get(k))
    ka = tcp.get("tcpKeepalive") or {}
    rep.duration(f"{p}.tcp.tcpKeepalive.time", ka.get("time"))
    rep.duration(f"{p}.tcp.tcpKeepalive.interval", ka.get("interval"))
    h2ka = http.get("http2KeepAlive")
    if h2ka is not None:
        # Istio's validateConnectionPool: both durations are required.
        for k in ("interval", "timeout"):
            if h2ka.get(k) is None:
                rep.error(f"{p}.http.http2KeepAlive.{k}", f"http2 keepalive {k} is required")
            else:
                rep.duration(f"{p}.http.http2KeepAlive.{k}", h2ka[k])
        rep.warn(f"{p}.http.http2KeepAlive", "http2KeepAlive is not translated by this control plane: "
                                             "Envoy sends no HTTP/2 PING frames to this destination")


def _is_prime(x: int) -> bool:
    if 0 < x < 4:
        return True
    if x % 2 == 0:
        return False
    f = 3
    while f * f <= x:
        if x % f == 0:
            return False
        f += 2
    return True


def _load_balancer(rep: Report, p: str, lb: dict | None, outlier: dict | None) -> None:
    if lb is None:
        return
    ch = lb.get("consistentHash")
    if ch is not None:
        cookie = ch.get("httpCookie")
        if cookie is not None and not cookie.get("name"):
            rep.error(f"{p}.consistentHash.httpCookie.name", "name required for HttpCookie")
        if ch.get("httpHeaderName") is not None and not hosts_header_ok(ch["httpHeaderName"]):
            rep.error(f"{p}.consistentHash.httpHeaderName", f"header name {ch['httpHeaderName']} is not a valid header name")
        if ch.get("minimumRingSize"):
            rep.warn(f"{p}.consistentHash.minimumRingSize", "consistent hash MinimumRingSize is deprecated, "
                                                            "use ConsistentHashLB's RingHash configuration instead")
            if ch.get("ringHash") is not None or ch.get("maglev") is not None:
                rep.error(f"{p}.consistentHash", "only one of MinimumRingSize or Maglev/Ringhash can be specified")
        ml = ch.get("maglev")
        if ml is not None:
            size = int(ml.get("tableSize") or 0)
            if size == 0:
                rep.error(f"{p}.consistentHash.maglev.tableSize", "tableSize must be set for maglev")
            elif size >= 5000011:
                rep.error(f"{p}.consistentHash.maglev.tableSize", "tableSize must be less than 5000011 for maglev")
            elif not _is_prime(size):
                rep.error(f"{p}.consistentHash.maglev.tableSize", "tableSize must be a prime number for maglev")
        if not any(ch.get(k) is not None for k in ("httpHeaderName", "httpCookie", "useSourceIp", "httpQueryParameterName")):
            # Istio accepts it; Envoy then has a hash ring and nothing to hash, which balances at random.
            rep.warn(f"{p}.consistentHash", "consistentHash names no hash key (httpHeaderName, httpCookie, useSourceIp, "
                                            "httpQueryParameterName): requests are spread at random")
    _locality_lb(rep, f"{p}.localityLbSetting", lb.get("localityLbSetting"), outlier)
    rep.duration(f"{p}.warmupDurationSecs", lb.get("warmupDurationSecs"))
    warm = lb.get("warmup")
    if warm is not None:
        # Istio's validateLoadBalancer (the CRD says the same: duration required,
        # minimumPercent 0..100, aggression > 0).
        if warm.get("duration") is None:
            rep.error(f"{p}.warmup.duration", "duration is required")
        else:
            rep.duration(f"{p}.warmup.duration", warm["duration"])
        if (warm.get("minimumPercent") or 0) > 100:
            rep.error(f"{p}.warmup.minimumPercent", "minimumPercent value should be less than or equal to 100")
        if warm.get("aggression") is not None and warm["aggression"] <= 0:
            rep.error(f"{p}.warmup.aggression", "aggression should be greater than 0")


def _locality_lb(rep: Report, p: str, loc: dict | None, outlier: dict | None) -> None:
    if loc is None:
        return
    if loc.get("distribute") and loc.get("failover"):
        rep.error(p, "can not simultaneously specify 'distribute' and 'failover'")
        return
    for i, d in enumerate(loc.get("distribute") or []):
        to = d.get("to") or {}
        if any(not 1 <= w <= 100 for w in to.values()):
            rep.error(f"{p}.distribute[{i}].to", "locality weight must be in range [1, 100]")
        elif sum(to.values()) != 100:
            rep.error(f"{p}.distribute[{i}].to", f"total locality weight {sum(to.values())} != 100")
    if (loc.get("failover") or loc.get("failoverPriority")) and outlier is None:
        rep.warn(p, "outlier detection policy must be provided for failover")
    for i, f in enumerate(loc.get("failover") or []):
        frm, to = f.get("from", ""), f.get("to", "")
        if frm == to:
            rep.error(f"{p}.failover[{i}]", "locality lb failover settings must specify different regions")
        if "/" in frm or "/" in to:
            rep.error(f"{p}.failover[{i}]", "locality lb failover only specify region")
        if "*" in frm or "*" in to:
            rep.error(f"{p}.failover[{i}]", "locality lb failover region should not contain '*' wildcard")


def _client_tls(rep: Report, p: str, tls: dict | None) -> None:
    if tls is None:
        return
    mode = tls.get("mode") or "DISABLE"
    if tls.get("insecureSkipVerify"):
        if mode == "SIMPLE" and (tls.get("caCertificates") or tls.get("credentialName") or tls.get("subjectAltNames")):
            rep.error(p, "cannot specify CaCertificates or CredentialName or SubjectAltNames when InsecureSkipVerify is set true")
        if mode == "MUTUAL" and (tls.get("caCertificates") or tls.get("subjectAltNames")):
            rep.error(p, "cannot specify CaCertificates or SubjectAltNames when InsecureSkipVerify is set true")
    if mode in ("SIMPLE", "MUTUAL") and tls.get("credentialName"):
        if any(tls.get(k) for k in ("clientCertificate", "caCertificates", "privateKey", "caCrl")):
            rep.error(p, "cannot specify client certificates or CA certificate or CA CRL If credentialName is set")
        return
    if mode == "MUTUAL":
        if not tls.get("clientCertificate"):
            rep.error(f"{p}.clientCertificate", "client certificate required for mutual tls")
        if not tls.get("privateKey"):
            rep.error(f"{p}.privateKey", "private key required for mutual tls")
