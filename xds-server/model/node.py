"""The proxy (node) model the translator works for, read from an xDS request's Node."""
from __future__ import annotations

from dataclasses import dataclass, field

from google.protobuf import json_format


@dataclass(frozen=True)
class ProxyNode:
    """What the translator needs to know about one connected proxy.

    kind is "router" (a gateway Envoy), "sidecar", or "grpc" (proxyless gRPC).
    labels come from node.metadata.LABELS, as istio-agent sets them;
    service_account from SERVICE_ACCOUNT (Kubernetes' default: "default"), and
    identity_token from IDENTITY_TOKEN, the node-bootstrap token that proves the
    node may hold that identity (xds.sds).
    """
    id: str
    cluster: str = ""
    namespace: str = "default"
    kind: str = "router"
    labels: dict = field(default_factory=dict, hash=False, compare=False)
    service_account: str = field(default="default", compare=False)
    identity_token: str = field(default="", repr=False, compare=False)

    @classmethod
    def from_proto(cls, node) -> "ProxyNode":
        meta = json_format.MessageToDict(node.metadata) if node.HasField("metadata") else {}
        parts = node.id.split("~")
        kind = parts[0] if len(parts) == 4 and parts[0] in ("router", "sidecar") else "router"
        namespace = meta.get("NAMESPACE") or (parts[2].split(".")[-1] if len(parts) == 4 and "." in parts[2] else "default")
        if meta.get("GENERATOR") == "grpc" or node.user_agent_name.startswith("gRPC"):
            kind = "grpc"
        return cls(id=node.id, cluster=node.cluster, namespace=namespace, kind=kind,
                   labels=dict(meta.get("LABELS") or {}),
                   service_account=str(meta.get("SERVICE_ACCOUNT") or "default"),
                   identity_token=str(meta.get("IDENTITY_TOKEN") or ""))
