"""Gateway (networking.istio.io), after Istio's ValidateGateway."""
from __future__ import annotations

from typing import Iterator

from mcp26.mesh import hosts
from mcp26.mesh.diagnostics import Diagnostic
from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.mesh.validation import validator
from mcp26.mesh.validation.networking import HTTP_PROTOCOLS, PROTOCOLS, TLS_PROTOCOLS, check_kind
from mcp26.mesh.validation.report import Report, semantic


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
