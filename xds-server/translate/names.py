"""Resource names, as istiod spells them (Envoy stats and tooling key on these)."""
from __future__ import annotations


def cluster_name(host: str, port: int, subset: str = "", direction: str = "outbound") -> str:
    """outbound|PORT|SUBSET|HOST, e.g. outbound|9080|v2|reviews.default.svc.cluster.local."""
    return f"{direction}|{port}|{subset}|{host}"


def gateway_route_name(port: int) -> str:
    """A gateway's plain-HTTP route configuration for one port: http.8080."""
    return f"http.{port}"


def gateway_https_route_name(port: int, port_name: str, gateway: str, namespace: str) -> str:
    """A gateway HTTPS server's own route configuration: https.443.https.gw.ns."""
    return f"https.{port}.{port_name}.{gateway}.{namespace}"


def sidecar_route_name(port: int) -> str:
    """A sidecar's outbound route configuration for one port: 8080."""
    return str(port)


def listener_name(bind: str, port: int) -> str:
    """A bound listener: ADDRESS_PORT (istiod: 0.0.0.0_8080; here 127.0.0.1_8080)."""
    return f"{bind}_{port}"


def virtual_host_name(host: str, port: int) -> str:
    return f"{host}:{port}"


def grpc_listener_name(host: str, port: int) -> str:
    """Proxyless gRPC: the target xds:///HOST:PORT asks LDS for HOST:PORT."""
    return f"{host}:{port}"
