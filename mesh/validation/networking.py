"""Validators for networking.istio.io kinds, after istio/istio pkg/config/validation.

Messages keep Istio's wording where Istio has one, so a search for the
message finds Istio's documentation and issues. Each kind is checked first
against its CRD schema (unknown fields, types, oneofs), then by Istio's
semantic rules; VirtualService rules live in `virtualservice.py`.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Iterator

from mesh import hosts
from mesh.resources import MeshConfig, Resource
from mesh.diagnostics import Diagnostic
from mesh.validation import validator
from mesh.validation.networking_schema import SPECS
from mesh.validation.schema import SchemaErrors, check, duration_ns

NETWORKING_VERSIONS = ("networking.istio.io/v1", "networking.istio.io/v1beta1", "networking.istio.io/v1alpha3")

# protocol.Parse in Istio (case-insensitive); anything else is Unsupported.
PROTOCOLS = {"http", "https", "http2", "grpc", "grpc-web", "tcp", "tls", "udp", "mongo",
             "redis", "mysql", "http_proxy", "hbone", "triple"}
HTTP_PROTOCOLS = {"http", "http2", "grpc", "grpc-web", "http_proxy"}
TLS_PROTOCOLS = {"https", "tls"}


class Report:
    """Collects one resource's diagnostics with their field paths."""

    def __init__(self, res: Resource):
        self.res = res
        self.out: list[Diagnostic] = []
        self.typed = True

    def error(self, path: str, message: str) -> None:
        self.out.append(self.res.diagnostic(path, message))

    def warn(self, path: str, message: str) -> None:
        self.out.append(self.res.diagnostic(path, message, severity="warning"))

    def duration(self, path: str, value: Any, seconds_only: bool = False) -> None:
        """Istio's ValidateDuration: >= 1ms, millisecond precision."""
        if value is None:
            return
        ns = duration_ns(value)
        if ns is None:
            return  # the schema already said why
        if ns < 1_000_000:
            self.error(path, "duration must be greater than 1ms")
        elif ns % 1_000_000:
            self.error(path, "only durations to ms precision are supported")
        elif seconds_only and ns % 1_000_000_000:
            self.error(path, "max_age duration is accurate only to seconds precision")

    def port(self, path: str, number: Any) -> None:
        if isinstance(number, int) and not 1 <= number <= 65535:
            self.error(path, f"port number {number} must be in the range 1..65535")

    def labels(self, path: str, labels: Any) -> None:
        for k, v in (labels or {}).items():
            err = hosts.label_key_error(str(k)) or hosts.label_value_error(str(v))
            if err:
                self.error(f"{path}.{k}", err)

    def workload_selector(self, path: str, labels: dict | None) -> None:
        if labels is None:
            return
        for k, v in labels.items():
            if k == "":
                self.error(path, f"empty key is not supported in selector: \"{k}={v}\"")
            if "*" in str(k) or "*" in str(v):
                self.error(f"{path}.{k}", f"wildcard is not supported in selector: \"{k}={v}\"")
        if not labels:
            self.warn(path, "workload selector specified without labels")

    def export_to(self, path: str, export_to: list | None, namespace: str, service_entry: bool = False) -> None:
        seen: set[str] = set()
        for i, e in enumerate(export_to or []):
            key = namespace if e == "." else e
            if key in seen:
                self.error(f"{path}[{i}]", f"duplicate entries in exportTo for entry {e}")
            elif e not in ("*", ".") and not (service_entry and e == "~") and not hosts.is_k8s_name_label(e):
                self.error(f"{path}[{i}]", f"only . or * or a valid DNS-1123 label is allowed as exportTo entry, got {e!r}")
            seen.add(key)
        if "*" in seen and len(export_to or []) > 1:
            self.error(path, "cannot have both public (*) and non-public exportTo values for a resource")
        if "~" in seen and len(export_to or []) > 1:
            self.error(path, "cannot export service entry to no one (~) and someone")


TOP_LEVEL_FIELDS = ("apiVersion", "kind", "metadata", "spec", "status")


def _top_level_keys(res: Resource) -> list[str]:
    return [p for p in res.lines if p and "." not in p and "[" not in p]


def check_kind(res: Resource) -> Report:
    """apiVersion and the CRD schema. `rep.typed` is False when a value has the
    wrong type, and then the semantic rules (which trust types) do not run."""
    rep = Report(res)
    if res.api_version not in NETWORKING_VERSIONS:
        rep.error("apiVersion", f"{res.kind} is not served at {res.api_version!r}; "
                                f"expected one of {', '.join(NETWORKING_VERSIONS)}")
    if not hosts.is_k8s_name_label(res.namespace):
        rep.error("metadata.namespace", f"invalid namespace {res.namespace!r}: must be a DNS-1123 label")
    if res.name and not hosts.is_k8s_subdomain(res.name):
        rep.error("metadata.name", f"invalid name {res.name!r}: must be a lower-case DNS-1123 subdomain")
    for key in _top_level_keys(res):
        if key not in TOP_LEVEL_FIELDS:
            rep.error(key, f"unknown field {key!r} at the top level of a {res.kind}"
                           + (" (did you mean 'spec'?)" if key.lower().startswith("spec") else ""))
    if not isinstance(res.spec, dict):
        rep.error("spec", f"spec must be a mapping, got {type(res.spec).__name__}")
        rep.typed = False
        return rep
    errs = SchemaErrors()
    check(res.spec, SPECS[res.kind], "spec", errs)
    for path, message in errs.errors:
        rep.error(path, message)
    rep.typed = not errs.wrong_type
    return rep


def _without_nulls(value: Any) -> Any:
    """An explicit null is the field unset (protobuf JSON), so rules see it absent."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def semantic(rule: Callable[[Report, Resource], None], rep: Report, res: Resource) -> list[Diagnostic]:
    """Run a kind's semantic rules when the schema let the types through.

    A rule that trips over a shape the schema did not foresee must reject
    the resource, never take the control plane down with it.
    """
    if rep.typed:
        try:
            rule(rep, replace(res, spec=_without_nulls(res.spec)))
        except (KeyError, TypeError, AttributeError, ValueError) as e:  # pragma: no cover - a rule bug
            rep.error("spec", f"cannot validate this {res.kind}: {type(e).__name__}: {e}")
    return rep.out


# --- Gateway ---------------------------------------------------------------

@validator("Gateway")
def validate_gateway(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    yield from semantic(_gateway, check_kind(res), res)


def _gateway(rep: Report, res: Resource) -> None:
    if not hosts.is_dns1123_label(res.name):
        rep.error("metadata.name", f"invalid gateway name: {res.name!r}")
    servers = res.spec.get("servers") or []
    if not servers:
        rep.error("spec.servers", "gateway must have at least one server")
    port_names: dict[str, int] = {}
    for i, server in enumerate(servers):
        p = f"spec.servers[{i}]"
        server_hosts = server.get("hosts") or []
        if not server_hosts:
            rep.error(f"{p}.hosts", "server config must contain at least one host")
        for j, h in enumerate(server_hosts):
            err = _gateway_host_error(h)
            if err:
                rep.error(f"{p}.hosts[{j}]", err)
        port = server.get("port")
        proto = None
        if not port:
            rep.error(f"{p}.port", "port is required")
        else:
            proto = str(port.get("protocol") or "").lower()
            if proto not in PROTOCOLS:
                rep.error(f"{p}.port.protocol", f"invalid protocol {port.get('protocol')!r}, supported protocols are "
                                                "HTTP, HTTP2, GRPC, GRPC-WEB, MONGO, REDIS, MYSQL, TCP")
            bind = server.get("bind") or ""
            if port.get("number") or not bind.startswith("unix://"):
                rep.port(f"{p}.port.number", port.get("number") or 0)
            if port.get("targetPort"):
                rep.error(f"{p}.port.targetPort", "targetPort has no impact on Gateways")
            name = port.get("name") or ""
            if not name:
                rep.error(f"{p}.port.name", "port name must be set")
            elif name in port_names:
                rep.error(f"{p}.port.name", f"port names in servers must be unique: duplicate name {name}")
            port_names.setdefault(name, i)
        bind = server.get("bind") or ""
        if bind.startswith("unix://"):
            if port and port.get("number"):
                rep.error(f"{p}.port.number", "port number must be 0 for unix domain socket")
        elif bind and not hosts.is_ip(bind):
            rep.error(f"{p}.bind", f"{bind} is not a valid IP")
        tls = server.get("tls")
        _server_tls(rep, f"{p}.tls", tls)
        if proto in TLS_PROTOCOLS and tls is None:
            rep.error(f"{p}.tls", "server must have TLS settings for HTTPS/TLS protocols")
        elif proto and proto not in TLS_PROTOCOLS and tls is not None and proto in PROTOCOLS:
            if proto in HTTP_PROTOCOLS:
                only_redirect = set(k for k, v in tls.items() if v not in (None, False, "")) <= {"httpsRedirect"}
                if not only_redirect:
                    rep.error(f"{p}.tls", "server cannot have TLS settings for plain text HTTP ports")
            else:
                rep.error(f"{p}.tls", "server cannot have TLS settings for non HTTPS/TLS ports")
        if proto not in HTTP_PROTOCOLS and (tls or {}).get("httpsRedirect"):
            rep.warn(f"{p}.tls.httpsRedirect", "tls.httpsRedirect should only be used with http servers")


def _gateway_host_error(h: str) -> str | None:
    """Istio's ValidateNamespaceSlashWildcardHostname for gateways."""
    ns, sep, dns = h.partition("/")
    if not sep:
        ns, dns = "", h
    else:
        if not ns or not dns:
            return "config namespace and dnsName in host entry cannot be empty"
        if ns not in ("*", ".") and not hosts.is_dns1123_label(ns):
            return f"invalid namespace value {ns!r} in gateway"
    if dns != "*" and "." not in dns:
        return "short names (non FQDN) are not allowed"
    err = hosts.wildcard_domain_error(dns)
    if err and not hosts.is_ip(dns):
        return err
    return hosts.partial_wildcard_error(dns)


def _server_tls(rep: Report, p: str, tls: dict | None) -> None:
    if not tls:
        return
    mode = tls.get("mode") or "PASSTHROUGH"
    if tls.get("minProtocolVersion") in ("TLSV1_0", "TLSV1_1") and not tls.get("cipherSuites"):
        rep.warn(f"{p}.minProtocolVersion", "TLS version below TLSV1_2 require setting compatible ciphers as by "
                                            "default they no longer include compatible ciphers.")
    has = {k for k in ("serverCertificate", "privateKey", "caCertificates", "credentialName", "caCrl") if tls.get(k)}
    if mode == "ISTIO_MUTUAL":
        for k, what in (("serverCertificate", "server certificate"), ("privateKey", "private key"),
                        ("caCertificates", "CA bundle"), ("credentialName", "credentialName")):
            if k in has:
                rep.error(f"{p}.{k}", f"ISTIO_MUTUAL TLS cannot have associated {what}")
        return
    if mode in ("PASSTHROUGH", "AUTO_PASSTHROUGH") and has:
        rep.warn(p, f"{mode} mode does not use certificates, they will be ignored")
    if mode in ("SIMPLE", "MUTUAL", "OPTIONAL_MUTUAL") and (tls.get("credentialName") or tls.get("credentialNames")):
        return
    if mode == "SIMPLE":
        if "serverCertificate" not in has:
            rep.error(f"{p}.serverCertificate", "SIMPLE TLS requires a server certificate")
        if "privateKey" not in has:
            rep.error(f"{p}.privateKey", "SIMPLE TLS requires a private key")
    elif mode in ("MUTUAL", "OPTIONAL_MUTUAL"):
        for k, what in (("serverCertificate", "a server certificate"), ("privateKey", "a private key"),
                        ("caCertificates", "a client CA bundle")):
            if k not in has:
                rep.error(f"{p}.{k}", f"MUTUAL TLS requires {what}")
    if "caCrl" in has and mode == "SIMPLE":
        rep.error(f"{p}.caCrl", "CRL is not supported with SIMPLE TLS")


# --- DestinationRule -------------------------------------------------------

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


def hosts_header_ok(name: str) -> bool:
    """Istio's validHeaderRegex: ^[-_A-Za-z0-9]+$"""
    return bool(name) and all(c.isascii() and (c.isalnum() or c in "-_") for c in name)


# --- ServiceEntry / WorkloadEntry -----------------------------------------

@validator("ServiceEntry")
def validate_service_entry(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    yield from semantic(_service_entry, check_kind(res), res)


def _service_entry(rep: Report, res: Resource) -> None:
    spec = res.spec
    selector = spec.get("workloadSelector")
    endpoints = spec.get("endpoints")
    if selector is not None:
        labels = selector.get("labels") or {}
        for k, v in labels.items():
            if "*" in k or "*" in str(v):
                rep.error(f"spec.workloadSelector.labels.{k}", f"wildcard is not supported in selector: \"{k}={v}\"")
        if not labels:
            rep.warn("spec.workloadSelector", "service entry: workload selector specified without labels, "
                                              "will be applied to all services in namespace")
    if selector is not None and endpoints is not None:
        rep.error("spec.workloadSelector", "only one of WorkloadSelector or Endpoints is allowed in Service Entry")
    se_hosts = spec.get("hosts") or []
    if not se_hosts:
        rep.error("spec.hosts", "service entry must have at least one host")
    for i, h in enumerate(se_hosts):
        if h == "*":
            rep.error(f"spec.hosts[{i}]", f"invalid host {h}")
            continue
        err = hosts.wildcard_domain_error(h)
        if err:
            rep.error(f"spec.hosts[{i}]", err)
        partial = hosts.partial_wildcard_error(h)
        if partial:
            rep.warn(f"spec.hosts[{i}]", partial)
    cidr = False
    for i, a in enumerate(spec.get("addresses") or []):
        cidr = cidr or "/" in a
        err = hosts.ip_subnet_error(a)
        if err:
            rep.error(f"spec.addresses[{i}]", err)
    resolution = spec.get("resolution") or "NONE"
    if cidr and resolution not in ("NONE", "STATIC"):
        rep.error("spec.addresses", "CIDR addresses are allowed only for NONE/STATIC resolution types")

    port_names: set[str] = set()
    port_numbers: set[int] = set()
    for i, port in enumerate(spec.get("ports") or []):
        p = f"spec.ports[{i}]"
        name, number = port.get("name", ""), port.get("number", 0)
        if name in port_names:
            rep.error(f"{p}.name", f"service entry port name {name!r} already defined")
        if number in port_numbers:
            rep.error(f"{p}.number", f"service entry port {number} already defined")
        port_names.add(name)
        port_numbers.add(number)
        if not hosts.is_k8s_name_label(name):
            rep.error(f"{p}.name", f"invalid port name: {name}")
        proto = port.get("protocol")
        if proto and proto.lower() not in PROTOCOLS:
            rep.error(f"{p}.protocol", f"unsupported protocol: {proto}")
        rep.port(f"{p}.number", number)
        if port.get("targetPort"):
            rep.port(f"{p}.targetPort", port["targetPort"])
            if resolution == "NONE":
                rep.warn(f"{p}.targetPort", "targetPort has no effect when resolution mode is NONE")

    if resolution == "NONE":
        if endpoints:
            rep.error("spec.endpoints", "no endpoints should be provided for resolution type none")
        if selector is not None:
            rep.warn("spec.workloadSelector", "workloadSelector should not be set when resolution mode is NONE")
    elif resolution == "STATIC":
        for i, ep in enumerate(endpoints or []):
            workload_entry(rep, f"spec.endpoints[{i}]", ep, port_names, allow_fqdn=False)
    else:  # DNS, DNS_ROUND_ROBIN
        if not endpoints:
            for i, h in enumerate(se_hosts):
                if hosts.fqdn_error(h):
                    rep.error(f"spec.hosts[{i}]", f"hosts must be FQDN if no endpoints are provided for resolution mode {resolution}")
        if resolution == "DNS_ROUND_ROBIN" and len(endpoints or []) > 1:
            rep.error("spec.endpoints", f"there must only be 0 or 1 endpoint for resolution mode {resolution}")
        for i, ep in enumerate(endpoints or []):
            workload_entry(rep, f"spec.endpoints[{i}]", ep, port_names, allow_fqdn=True)
        if selector is not None:
            rep.warn("spec.workloadSelector", f"workloadSelector should not be set when resolution mode is {resolution}")
    if resolution != "NONE" and len(se_hosts) > 1:
        for i, port in enumerate(spec.get("ports") or []):
            proto = str(port.get("protocol") or "").lower()
            if proto not in HTTP_PROTOCOLS and proto not in TLS_PROTOCOLS:
                rep.error(f"spec.ports[{i}].protocol", "multiple hosts provided with non-HTTP, non-TLS ports")
                break
    rep.export_to("spec.exportTo", spec.get("exportTo"), res.namespace, service_entry=True)


def workload_entry(rep: Report, p: str, we: dict, service_ports: set[str] | None, allow_fqdn: bool) -> None:
    addr = we.get("address") or ""
    unix = addr.startswith("unix://")
    if not addr:
        if not we.get("network"):
            rep.error(f"{p}.address", "address is required")
            return
        rep.warn(f"{p}.address", f"address is unset with network {we.get('network')!r}")
    if unix:
        path = addr[len("unix://"):]
        if not path.startswith("@") and (not path.startswith("/") or path.endswith("/")):
            rep.error(f"{p}.address", f"{path} is not an absolute path to a file")
        if we.get("ports"):
            rep.error(f"{p}.ports", f"unix endpoint {addr} must not include ports")
    elif addr and not hosts.is_ip(addr):
        if not allow_fqdn:
            rep.error(f"{p}.address", f"endpoint address {addr!r} is not a valid IP address")
        elif hosts.fqdn_error(addr):
            rep.error(f"{p}.address", f"endpoint address {addr!r} is not a valid FQDN or an IP address")
    for name, port in (we.get("ports") or {}).items():
        if service_ports is not None and name not in service_ports:
            rep.error(f"{p}.ports.{name}", f"endpoint port {port} is not defined by the service entry")
        if not hosts.is_k8s_name_label(name):
            rep.error(f"{p}.ports.{name}", f"invalid port name: {name}")
        rep.port(f"{p}.ports.{name}", port)
    rep.labels(f"{p}.labels", we.get("labels"))
    if unix and service_ports is not None and len(service_ports) != 1:
        rep.error(p, "exactly 1 service port required for unix endpoints")


@validator("WorkloadEntry")
def validate_workload_entry(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    yield from semantic(lambda rep, r: workload_entry(rep, "spec", r.spec, None, allow_fqdn=True), check_kind(res), res)
