"""Envoy bootstrap for ADS: the node, one static cluster for the control plane, LDS/CDS over ADS."""
from __future__ import annotations

import yaml

XDS_CLUSTER = "xds-grpc"   # as istio-agent names it


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--xds-address must be HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port)


def node_namespace(node_id: str, namespace: str = "") -> str:
    """The namespace the control plane reads for a node (node.ProxyNode.from_proto's rule)."""
    # Imported here: the Envoy protos cost ~0.3 s, and only `--ca-dir` (a node token) asks this.
    from mcp26.xds.model.node import ProxyNode
    from envoy.config.core.v3 import base_pb2
    node = base_pb2.Node(id=node_id)
    if namespace:
        node.metadata.update({"NAMESPACE": namespace})
    return ProxyNode.from_proto(node).namespace


def envoy_bootstrap(node_id: str, xds_address: str, cluster: str = "", admin_port: int = 15000,
                    delta: bool = False, labels: dict | None = None, namespace: str = "",
                    admin_address: str = "127.0.0.1", service_account: str = "",
                    identity_token: str = "", ca_file: str = "", server_name: str = "",
                    token: str = "") -> dict:
    """identity_token: the node-bootstrap token (ca.node_token) that lets the control plane
    issue this node the SVID of its namespace and service_account (sds.py).
    xds_address may list replicas, `HOST:PORT,HOST:PORT`: one cluster, Envoy moves to another
    endpoint when its stream's goes. ca_file: reach ADS over TLS, the server checked against
    that root (the mesh CA's) and `server_name`; token: a ServiceAccount token sent as
    `authorization: Bearer` on the stream (kube_auth.py; a projected token expires, so a
    bootstrap that carries one is rewritten before then, as istio-agent does)."""
    addresses = [split_address(a.strip()) for a in xds_address.split(",") if a.strip()]
    host, port = addresses[0]
    metadata: dict = {}
    if labels:
        metadata["LABELS"] = {str(k): str(v) for k, v in labels.items()}
    if namespace:
        metadata["NAMESPACE"] = namespace
    if service_account:
        metadata["SERVICE_ACCOUNT"] = service_account
    if identity_token:
        metadata["IDENTITY_TOKEN"] = identity_token
    return {
        "node": {"id": node_id, "cluster": cluster or node_id, **({"metadata": metadata} if metadata else {})},
        "admin": {"address": {"socket_address": {"address": admin_address, "port_value": admin_port}}},
        "dynamic_resources": {
            "ads_config": {
                "api_type": "DELTA_GRPC" if delta else "GRPC",
                "transport_api_version": "V3",
                "set_node_on_first_message_only": True,
                "grpc_services": [{
                    "envoy_grpc": {"cluster_name": XDS_CLUSTER},
                    **({"initial_metadata": [{"key": "authorization", "value": f"Bearer {token}"}]} if token else {}),
                    # Reconnect fast when the control plane comes back (default backoff reaches 30 s).
                    "retry_policy": {"retry_back_off": {"base_interval": "0.1s", "max_interval": "1s"}},
                }],
            },
            "lds_config": {"ads": {}, "resource_api_version": "V3"},
            "cds_config": {"ads": {}, "resource_api_version": "V3"},
        },
        "static_resources": {"clusters": [{
            "name": XDS_CLUSTER,
            "type": "STATIC" if _is_ip(host) else "STRICT_DNS",
            "connect_timeout": "1s",
            "typed_extension_protocol_options": {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {
                        "connection_keepalive": {"interval": "10s", "timeout": "5s"}}},
                }},
            "load_assignment": {"cluster_name": XDS_CLUSTER, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": h, "port_value": p}}}}
                for h, p in addresses]}]},
            **({"transport_socket": _tls(ca_file, server_name)} if ca_file else {}),
        }]},
    }


def _tls(ca_file: str, server_name: str) -> dict:
    ctx: dict = {"alpn_protocols": ["h2"], "validation_context": {"trusted_ca": {"filename": ca_file}}}
    if server_name:
        ctx["validation_context"]["match_typed_subject_alt_names"] = [
            {"san_type": "DNS", "matcher": {"exact": server_name}}]
    return {"name": "envoy.transport_sockets.tls", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        **({"sni": server_name} if server_name else {}), "common_tls_context": ctx}}


def _is_ip(host: str) -> bool:
    import ipaddress
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def bootstrap_yaml(**kwargs) -> str:
    return yaml.safe_dump(envoy_bootstrap(**kwargs), sort_keys=False)


def grpc_bootstrap(node_id: str, xds_address: str, cluster: str = "", labels: dict | None = None,
                   namespace: str = "") -> dict:
    """A GRPC_XDS_BOOTSTRAP for proxyless gRPC clients (SotW over ADS, insecure on 127.0.0.1)."""
    metadata: dict = {"GENERATOR": "grpc"}
    if labels:
        metadata["LABELS"] = {str(k): str(v) for k, v in labels.items()}
    if namespace:
        metadata["NAMESPACE"] = namespace
    return {
        "xds_servers": [{"server_uri": xds_address, "channel_creds": [{"type": "insecure"}],
                         "server_features": ["xds_v3"]}],
        "node": {"id": node_id, "cluster": cluster or node_id, "metadata": metadata,
                 "locality": {}},
    }
