"""TLS transport sockets whose certificates come over SDS, as istiod builds them.

ISTIO_MUTUAL (pilot/pkg/networking/core/cluster_tls.go, apigen of the inbound
chain): the workload certificate is the SDS secret `default`, the trust
bundle `ROOTCA`, both over the ADS stream (xds.sds serves them per
node). Upstream: SNI `outbound_.PORT_.SUBSET_.HOST`, ALPN
`istio-peer-exchange, istio` (h2 ports add `h2`), the server's URI SAN
checked against the destination's SPIFFE identities. Downstream: a client
certificate is required and checked against ROOTCA.

Gateway `credentialName: NAME`: `kubernetes://NAME` (tls.crt + tls.key) and,
for MUTUAL, `kubernetes://NAME-cacert` (ca.crt), as istiod names them.
"""
from __future__ import annotations

from envoy.config.core.v3 import base_pb2, config_source_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2

TLS_SOCKET = "envoy.transport_sockets.tls"
WORKLOAD_SECRET = "default"        # xds.sds names these; the proxy asks for them by name
ROOT_SECRET = "ROOTCA"
CREDENTIAL_PREFIX = "kubernetes://"
# What istiod offers in-mesh (util.ALPNInMeshWithMxc / ALPNInMeshH2WithMxc).
ALPN_IN_MESH = ("istio-peer-exchange", "istio")
# What an inbound mTLS chain offers (util.ALPNDownstreamWithMxc without the mxc prefix).
ALPN_DOWNSTREAM = ("h2", "http/1.1")


def sni(host: str, port: int, subset: str = "") -> str:
    """outbound_.PORT_.SUBSET_.HOST (model.BuildDNSSrvSubsetKey), e.g. outbound_.9080_.v1_.reviews.ns.svc.cluster.local."""
    return f"outbound_.{port}_.{subset}_.{host}"


def ads_sds_config() -> config_source_pb2.ConfigSource:
    src = config_source_pb2.ConfigSource()
    src.ads.SetInParent()
    src.resource_api_version = config_source_pb2.V3
    return src


def _sds_cert(common: tls_pb2.CommonTlsContext, name: str) -> None:
    common.tls_certificate_sds_secret_configs.add(name=name).sds_config.CopyFrom(ads_sds_config())


def _sds_validation(common: tls_pb2.CommonTlsContext, name: str, sans: list[str] = ()) -> None:
    combined = common.combined_validation_context
    combined.default_validation_context.SetInParent()     # required, even with no SAN to match
    combined.validation_context_sds_secret_config.name = name
    combined.validation_context_sds_secret_config.sds_config.CopyFrom(ads_sds_config())
    for san in sans:
        m = combined.default_validation_context.match_typed_subject_alt_names.add()
        m.san_type = (common_pb2.SubjectAltNameMatcher.URI if "://" in san
                      else common_pb2.SubjectAltNameMatcher.DNS)
        m.matcher.exact = san


def _min_tls12(common: tls_pb2.CommonTlsContext) -> None:
    common.tls_params.tls_minimum_protocol_version = common_pb2.TlsParameters.TLSv1_2


def transport_socket(ctx) -> base_pb2.TransportSocket:
    ts = base_pb2.TransportSocket(name=TLS_SOCKET)
    ts.typed_config.Pack(ctx)
    return ts


def istio_mutual_upstream(server_name: str, sans: list[str], h2: bool) -> tls_pb2.UpstreamTlsContext:
    """A client sidecar's context towards another sidecar."""
    ctx = tls_pb2.UpstreamTlsContext(sni=server_name)
    common = ctx.common_tls_context
    _min_tls12(common)
    _sds_cert(common, WORKLOAD_SECRET)
    _sds_validation(common, ROOT_SECRET, sans)
    common.alpn_protocols.extend(ALPN_IN_MESH + (("h2",) if h2 else ()))
    return ctx


def istio_mutual_downstream(http: bool) -> tls_pb2.DownstreamTlsContext:
    """A server sidecar's inbound context: the client's certificate is required and must chain to ROOTCA."""
    ctx = tls_pb2.DownstreamTlsContext()
    ctx.require_client_certificate.value = True
    common = ctx.common_tls_context
    _min_tls12(common)
    _sds_cert(common, WORKLOAD_SECRET)
    _sds_validation(common, ROOT_SECRET)
    if http:
        common.alpn_protocols.extend(ALPN_DOWNSTREAM)
    return ctx


def credential_downstream(credential: str, mutual: bool) -> tls_pb2.DownstreamTlsContext:
    """A Gateway server's `tls.credentialName` (SIMPLE or MUTUAL), served over SDS."""
    ctx = tls_pb2.DownstreamTlsContext()
    common = ctx.common_tls_context
    _sds_cert(common, CREDENTIAL_PREFIX + credential)
    if mutual:
        ctx.require_client_certificate.value = True
        _sds_validation(common, CREDENTIAL_PREFIX + credential + "-cacert")
    return ctx
