"""A sidecar's inbound listeners: one explicit listener per `Sidecar.ingress` port.

Istio captures inbound traffic with iptables into one `virtualInbound`
listener (15006) and picks a filter chain by original destination port. No
iptables redirection runs here (every process shares 127.0.0.1), so a peer
must connect to the sidecar itself: each ingress port is a listener of its
own, `BIND_PORT` (the Sidecar's `bind`, else the translator's bind address),
traffic_direction INBOUND, that terminates (m)TLS and forwards to the app at
`defaultEndpoint` through the cluster `inbound|PORT||` (istiod's name) --
what Istio itself builds for a Sidecar ingress listener with captureMode NONE.

The filter chains follow the port's PeerAuthentication mode (sidecar_scope.py):
STRICT one chain matched on transport protocol `tls` (a plaintext connection
matches nothing and is closed), PERMISSIVE that chain plus one on
`raw_buffer`, DISABLE plaintext only. The mTLS chain requires a client
certificate chaining to ROOTCA (SDS).

Identity to the app: the HCM sanitizes and sets x-forwarded-client-cert from
the verified peer certificate only (SANITIZE_SET: a client's own header is
dropped; the current peer's URI SAN, subject and DNS SANs are written), and
x-envoy-downstream-service-cluster is removed and then set to the peer's
verified URI SAN (%DOWNSTREAM_PEER_URI_SAN%), so over plaintext it is absent.
"""
from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.listener.tls_inspector.v3 import tls_inspector_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2

from mcp26.mesh import headers as H
from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.translate import http_filters
from mcp26.xds.translate.clusters import HTTP_PROTOCOL_OPTIONS
from mcp26.xds.translate.index import H2_PROTOCOLS, TCP_PROTOCOLS
from mcp26.xds.translate.listeners import (HCM_FILTER, filter_chain_head, filter_chain_tail,
                                            http_connection_manager)
from mcp26.xds.translate.names import cluster_name, listener_name
from mcp26.xds.translate.options import TranslateOptions
from mcp26.xds.translate.sidecar_scope import mtls_mode
from mcp26.xds.translate.tcp import TCP_PROXY_FILTER
from mcp26.xds.translate.transport_sockets import istio_mutual_downstream, transport_socket

TLS_INSPECTOR = "envoy.filters.listener.tls_inspector"
XFCC = "x-forwarded-client-cert"


def inbound_cluster_name(port: int) -> str:
    """inbound|PORT|| (istiod: inbound|PORT||, the service host left empty for Sidecar ingress)."""
    return cluster_name("", port, direction="inbound")


def _endpoint(text: str) -> tuple[str, int | None]:
    """defaultEndpoint -> (address, port); 0.0.0.0 or an empty host forward to loopback."""
    if text.startswith("unix://"):
        return text, None
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return host, int(port)


def inbound_cluster(port: int, endpoint: str, protocol: str) -> cluster_pb2.Cluster:
    name = inbound_cluster_name(port)
    c = cluster_pb2.Cluster(name=name, type=cluster_pb2.Cluster.STATIC)
    c.connect_timeout.FromSeconds(10)
    host, ep_port = _endpoint(endpoint)
    addr = c.load_assignment.endpoints.add().lb_endpoints.add().endpoint.address
    c.load_assignment.cluster_name = name
    if ep_port is None:
        addr.pipe.path = host[len("unix://"):]
    else:
        addr.socket_address.address, addr.socket_address.port_value = host, ep_port
    if protocol not in TCP_PROTOCOLS:
        opts = http_protocol_options_pb2.HttpProtocolOptions()
        if protocol in H2_PROTOCOLS:
            opts.explicit_http_config.http2_protocol_options.SetInParent()
        elif protocol:
            opts.explicit_http_config.http_protocol_options.SetInParent()
        else:
            opts.use_downstream_protocol_config.http_protocol_options.SetInParent()
            opts.use_downstream_protocol_config.http2_protocol_options.SetInParent()
        c.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS].Pack(opts)
    return c


def _route_config(port: int) -> route_pb2.RouteConfiguration:
    name = inbound_cluster_name(port)
    rc = route_pb2.RouteConfiguration(name=name, validate_clusters={"value": False})
    vh = rc.virtual_hosts.add(name=f"inbound|http|{port}", domains=["*"])
    route = vh.routes.add(name="default")
    route.match.prefix = "/"
    route.route.cluster = name
    route.route.timeout.FromSeconds(0)
    # Only the verified peer identity: remove (always runs first), then set from the
    # peer certificate; an empty value (no client certificate) is not added.
    rc.request_headers_to_remove.append(H.DOWNSTREAM_SERVICE_CLUSTER)
    add = rc.request_headers_to_add.add()
    add.header.key = H.DOWNSTREAM_SERVICE_CLUSTER
    add.header.value = "%DOWNSTREAM_PEER_URI_SAN%"
    add.append_action = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
    return rc


def _hcm(config: MeshConfig, node: ProxyNode, bind: str, port: int,
         options: TranslateOptions) -> hcm_pb2.HttpConnectionManager:
    filters = filter_chain_head(grpc=False) + http_filters.phase_filters(config, node, port) + filter_chain_tail()
    hcm = http_connection_manager(f"inbound_{bind}_{port}", "", filters, gateway=False,
                                  stream_idle_timeout_s=options.stream_idle_timeout_s)
    hcm.route_config.CopyFrom(_route_config(port))       # inline, as istiod's inbound chains
    hcm.forward_client_cert_details = hcm_pb2.HttpConnectionManager.SANITIZE_SET
    details = hcm.set_current_client_cert_details
    details.subject.value = True
    details.uri = True
    details.dns = True
    return hcm


def _chain(lis: listener_pb2.Listener, network_filter: tuple, tls: bool | None, http: bool) -> None:
    chain = lis.filter_chains.add()
    if tls is not None:
        chain.filter_chain_match.transport_protocol = "tls" if tls else "raw_buffer"
    chain.name = "mtls" if tls else "plaintext"
    chain.filters.add(name=network_filter[0]).typed_config.Pack(network_filter[1])
    if tls:
        chain.transport_socket.CopyFrom(transport_socket(istio_mutual_downstream(http)))


def inbound_listener(config: MeshConfig, node: ProxyNode, ingress: dict, options: TranslateOptions) -> tuple:
    """(Listener, inbound Cluster) for one Sidecar ingress entry."""
    port = int(ingress["port"]["number"])
    protocol = str(ingress["port"].get("protocol") or "").upper()
    bind = str(ingress.get("bind") or options.bind_address)
    name = listener_name(bind, port)
    lis = listener_pb2.Listener(name=name, traffic_direction=base_pb2.INBOUND)
    lis.address.socket_address.address = bind
    lis.address.socket_address.port_value = port
    http = protocol not in TCP_PROTOCOLS
    if http:
        network = (HCM_FILTER, _hcm(config, node, bind, port, options))
    else:
        network = (TCP_PROXY_FILTER, tcp_proxy_pb2.TcpProxy(stat_prefix=inbound_cluster_name(port),
                                                            cluster=inbound_cluster_name(port)))
    mode = mtls_mode(config, node, port)
    if mode != "DISABLE":
        lis.listener_filters.add(name=TLS_INSPECTOR).typed_config.Pack(tls_inspector_pb2.TlsInspector())
        _chain(lis, network, True, http)
    if mode == "PERMISSIVE":
        _chain(lis, network, False, http)
    elif mode == "DISABLE":
        _chain(lis, network, None, http)
    return lis, inbound_cluster(port, str(ingress["defaultEndpoint"]), protocol)


def inbound(config: MeshConfig, node: ProxyNode, sidecar: Resource | None,
            options: TranslateOptions) -> tuple[dict, dict]:
    """The node's inbound listeners and clusters by name (none without a Sidecar ingress)."""
    listeners, clusters = {}, {}
    for ingress in (sidecar.spec.get("ingress") or []) if sidecar is not None else []:
        if not ingress.get("defaultEndpoint"):
            continue          # validation refuses it; captured traffic needs iptables
        lis, cluster = inbound_listener(config, node, ingress, options)
        listeners[lis.name], clusters[cluster.name] = lis, cluster
    return listeners, clusters
