"""LDS: listeners with an HTTP connection manager reading routes over RDS.

Gateways and sidecars get bound listeners (ADDRESS_PORT), HTTPS gateway
servers a TLS filter chain each (matched by SNI) plus one per ALPN of
mesh.qos.ALPN_CLASSES (matched by SNI and application_protocols): Envoy gives
Wasm no downstream-ALPN attribute, so that chain's HCM sets the
x-mcp-downstream-alpn header (mesh.headers.DOWNSTREAM_ALPN) before any filter
runs, after removing a client's copy; every other HCM only removes it. Envoy
matches application_protocols against the ALPN list the client offered, in the
client's order (the first offered protocol with a chain wins). Proxyless gRPC
clients get API listeners named HOST:PORT (gRFC A27), no socket at all.
The HTTP filter chain (cors, the filter modules by phase, fault, router) is
described in http_filters.py; this module gives its fixed head and tail.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from envoy.config.core.v3 import base_pb2, protocol_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.http.cors.v3 import cors_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.listener.tls_inspector.v3 import tls_inspector_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.http.early_header_mutation.header_mutation.v3 import header_mutation_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2
from google.protobuf import any_pb2

from mcp26.mesh import headers as H
from mcp26.mesh.header_contract import JWT_AUTHN_FILTER
from mcp26.mesh.qos import ALPN_CLASSES
from mcp26.xds.translate import authn, transport_sockets
from mcp26.xds.translate.clusters import ads_config_source
from mcp26.xds.translate.names import grpc_listener_name, listener_name
from mcp26.xds.translate.routes import CORS_FILTER, FAULT_FILTER
from mcp26.xds.translate.tcp import TCP_PROXY_FILTER

Listener = listener_pb2.Listener
HCM = hcm_pb2.HttpConnectionManager
HttpFilter = hcm_pb2.HttpFilter
HCM_FILTER = "envoy.filters.network.http_connection_manager"
ROUTER_FILTER = "envoy.filters.http.router"
EARLY_HEADER_MUTATION = "envoy.http.early_header_mutation.header_mutation"


def _pack(msg) -> any_pb2.Any:
    out = any_pb2.Any()
    out.Pack(msg)
    return out


def http_filter(name: str, config) -> HttpFilter:
    return HttpFilter(name=name, typed_config=_pack(config))


def filter_chain_head(grpc: bool) -> list[HttpFilter]:
    """cors (not in gRPC's filter set)."""
    return [] if grpc else [http_filter(CORS_FILTER, cors_pb2.Cors())]


def filter_chain_tail() -> list[HttpFilter]:
    """fault, router."""
    return [http_filter(FAULT_FILTER, fault_pb2.HTTPFault()), http_filter(ROUTER_FILTER, router_pb2.Router())]


def downstream_alpn_mutation(alpn: str = ""):
    """The HCM early header mutation: remove any client-sent DOWNSTREAM_ALPN,
    then (a chain matched on `alpn`) set it to that ALPN."""
    m = header_mutation_pb2.HeaderMutation()
    m.mutations.add(remove=H.DOWNSTREAM_ALPN)
    if alpn:
        opt = m.mutations.add().append
        opt.header.key = H.DOWNSTREAM_ALPN
        opt.header.value = alpn
        opt.append_action = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
    ext = hcm_pb2.HttpConnectionManager().early_header_mutation_extensions.add(name=EARLY_HEADER_MUTATION)
    ext.typed_config.Pack(m)
    return ext


def http_connection_manager(stat_prefix: str, route_name: str, filters: list[HttpFilter],
                            gateway: bool, alpn: str = "", *, stream_idle_timeout_s: float) -> HCM:
    hcm = HCM(stat_prefix=stat_prefix, codec_type=HCM.AUTO)
    # Before any filter, even route selection: the header is Envoy's alone.
    hcm.early_header_mutation_extensions.add().CopyFrom(downstream_alpn_mutation(alpn))
    hcm.rds.route_config_name = route_name
    hcm.rds.config_source.CopyFrom(ads_config_source())
    hcm.http_filters.extend(filters)
    # As istiod: gateways are the edge (they set X-Forwarded-For), paths are
    # normalised before matching.
    hcm.use_remote_address.value = gateway
    hcm.normalize_path.value = True
    hcm.path_with_escaped_slashes_action = HCM.KEEP_UNCHANGED
    # Not as istiod (which turns it off, 0s): a stream with no byte either way for
    # this long is answered 408 / grpc-status 2 "stream timeout" and released, so a
    # client that stops mid-body (a truncated gRPC-Web frame, chunked or h2c) or an
    # upstream that waits forever on one cannot hold streams for ever.
    # (TranslateOptions.stream_idle_timeout_s; 0 turns it off.)
    hcm.stream_idle_timeout.FromMilliseconds(int(stream_idle_timeout_s * 1000))
    # `end_user` is not `end-user` to Envoy or the Wasm filter, but CGI/WSGI-style
    # upstreams read both as END_USER: drop every header with an underscore (and count
    # it in http.PREFIX.dropped_headers_with_underscores) so no twin of a
    # protected header gets through. Istio's EDGE profile rejects the request
    # (REJECT_REQUEST); dropping keeps harmless requests working, as nginx does.
    hcm.common_http_protocol_options.headers_with_underscores_action = protocol_pb2.HttpProtocolOptions.DROP_HEADER
    hcm.upgrade_configs.add(upgrade_type="websocket")
    if any(f.name == JWT_AUTHN_FILTER for f in filters):
        hcm.local_reply_config.CopyFrom(authn.bad_token_reply())
    return hcm


@dataclass(frozen=True)
class Chain:
    """One filter chain: an HCM on a route configuration (HTTPS: TLS from
    files), or a tcp_proxy (TCP, TLS passthrough)."""
    route_name: str = ""
    tls: tuple = ()                 # sorted (key, value) items of the server's `tls`
    server_names: tuple = ()        # SNI to match (none: any)
    tcp_proxy: object = field(default=None, compare=False)


_TLS_VERSIONS = {"TLS_AUTO": common_pb2.TlsParameters.TLS_AUTO, "TLSV1_0": common_pb2.TlsParameters.TLSv1_0,
                 "TLSV1_1": common_pb2.TlsParameters.TLSv1_1, "TLSV1_2": common_pb2.TlsParameters.TLSv1_2,
                 "TLSV1_3": common_pb2.TlsParameters.TLSv1_3}


def downstream_tls(tls: dict) -> tls_pb2.DownstreamTlsContext:
    """A Gateway server's `tls` (SIMPLE or MUTUAL, certificates as files or, by
    credentialName, over SDS: transport_sockets.credential_downstream)."""
    mutual = str(tls.get("mode") or "SIMPLE").upper() == "MUTUAL"
    if tls.get("credentialName"):
        ctx = transport_sockets.credential_downstream(str(tls["credentialName"]), mutual)
    else:
        ctx = tls_pb2.DownstreamTlsContext()
        cert = ctx.common_tls_context.tls_certificates.add()
        cert.certificate_chain.filename = str(tls["serverCertificate"])
        cert.private_key.filename = str(tls["privateKey"])
    common = ctx.common_tls_context
    common.alpn_protocols.extend(["h2", "http/1.1"])
    params = common.tls_params
    params.tls_minimum_protocol_version = _TLS_VERSIONS.get(str(tls.get("minProtocolVersion") or "TLSV1_2").upper(),
                                                            common_pb2.TlsParameters.TLSv1_2)
    if tls.get("maxProtocolVersion"):
        params.tls_maximum_protocol_version = _TLS_VERSIONS.get(str(tls["maxProtocolVersion"]).upper(),
                                                                common_pb2.TlsParameters.TLS_AUTO)
    params.cipher_suites.extend(str(c) for c in tls.get("cipherSuites") or [])
    if mutual and not tls.get("credentialName"):
        ctx.require_client_certificate.value = True
        if tls.get("caCertificates"):
            common.validation_context.trusted_ca.filename = str(tls["caCertificates"])
    return ctx


def bound_listener(bind: str, port: int, chains: list[Chain], filters: list[HttpFilter],
                   gateway: bool, stream_idle_timeout_s: float) -> Listener:
    name = listener_name(bind, port)
    lis = Listener(name=name)
    lis.address.socket_address.address = bind
    lis.address.socket_address.port_value = port
    lis.traffic_direction = base_pb2.OUTBOUND
    seen = set()
    alpn_chains = False
    for spec in chains:
        if spec.server_names in seen:
            continue                 # Envoy refuses two chains with one match; the first wins
        seen.add(spec.server_names)
        if spec.tcp_proxy is not None:
            chain = lis.filter_chains.add()
            chain.filter_chain_match.server_names.extend(spec.server_names)
            chain.filters.add(name=TCP_PROXY_FILTER, typed_config=_pack(spec.tcp_proxy))
            continue
        # TLS terminated here: one chain per ALPN the QoS classes know (the
        # same routes, filters and certificate), then the default one.
        for alpn in (list(ALPN_CLASSES) if spec.tls else []) + [""]:
            chain = lis.filter_chains.add()
            chain.filter_chain_match.server_names.extend(spec.server_names)
            if alpn:
                chain.filter_chain_match.application_protocols.append(alpn)
                alpn_chains = True
            hcm = http_connection_manager(f"outbound_{name}", spec.route_name, filters, gateway, alpn,
                                          stream_idle_timeout_s=stream_idle_timeout_s)
            chain.filters.add(name=HCM_FILTER, typed_config=_pack(hcm))
            if spec.tls:
                chain.transport_socket.name = "envoy.transport_sockets.tls"
                chain.transport_socket.typed_config.CopyFrom(_pack(downstream_tls(dict(spec.tls))))
    if alpn_chains or any(c.server_names for c in chains):
        # SNI and ALPN are read by the TLS inspector before a filter chain is chosen.
        lis.listener_filters.add(name="envoy.filters.listener.tls_inspector",
                                 typed_config=_pack(tls_inspector_pb2.TlsInspector()))
    return lis


def api_listener(host: str, port: int, filters: list[HttpFilter]) -> Listener:
    name = grpc_listener_name(host, port)
    lis = Listener(name=name)
    hcm = HCM(stat_prefix=name)
    hcm.rds.route_config_name = name
    hcm.rds.config_source.CopyFrom(ads_config_source())
    hcm.http_filters.extend(filters)
    lis.api_listener.api_listener.CopyFrom(_pack(hcm))
    return lis
