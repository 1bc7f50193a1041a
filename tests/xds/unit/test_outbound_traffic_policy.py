"""Sidecar outboundTrafficPolicy: REGISTRY_ONLY (block_all -> 502, BlackHoleCluster) vs ALLOW_ANY
(allow_any -> PassthroughCluster), as istiod; no policy: the routes keep their services only."""
from __future__ import annotations

import pytest
from envoy.config.cluster.v3 import cluster_pb2

from mcp26.mesh.change_set import load_texts
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.translate import translate
from mcp26.xds.model.type_urls import CLUSTER, ROUTE

BASE = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: b, namespace: shop}
spec:
  hosts: [b.shop.svc.cluster.local]
  ports: [{number: 9080, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.1, ports: {http: 15081}}]
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: a, namespace: shop}
spec:
  workloadSelector: {labels: {app: a}}
"""
A = ProxyNode(id="sidecar~127.0.0.1~a-1.shop~shop.svc.cluster.local", namespace="shop", kind="sidecar",
              labels={"app": "a"})


def _snap(mode: str | None):
    text = BASE + (f"  outboundTrafficPolicy: {{mode: {mode}}}\n" if mode else "  egress: [{hosts: ['./*']}]\n")
    return translate(load_texts({"m.yaml": text}), A)


def _catch_all(snap):
    rc = next(rc for rc in snap[ROUTE].values()
              if any("b.shop.svc.cluster.local" in d for vh in rc.virtual_hosts for d in vh.domains))
    return [vh for vh in rc.virtual_hosts if "*" in vh.domains]


def test_registry_only_blocks_unknown_hosts_with_502():
    snap = _snap("REGISTRY_ONLY")
    [vh] = _catch_all(snap)
    assert vh.name == "block_all" and vh.routes[0].direct_response.status == 502
    bh = snap[CLUSTER]["BlackHoleCluster"]
    assert bh.type == cluster_pb2.Cluster.STATIC and not bh.load_assignment.endpoints
    assert "PassthroughCluster" not in snap[CLUSTER]


def test_allow_any_passes_unknown_hosts_to_the_original_destination():
    snap = _snap("ALLOW_ANY")
    [vh] = _catch_all(snap)
    assert vh.name == "allow_any" and vh.routes[0].route.cluster == "PassthroughCluster"
    pt = snap[CLUSTER]["PassthroughCluster"]
    assert (pt.type, pt.lb_policy) == (cluster_pb2.Cluster.ORIGINAL_DST, cluster_pb2.Cluster.CLUSTER_PROVIDED)
    assert "BlackHoleCluster" not in snap[CLUSTER]


def test_without_a_policy_nothing_catches_all():
    snap = _snap(None)
    assert _catch_all(snap) == []
    assert not {"BlackHoleCluster", "PassthroughCluster"} & set(snap[CLUSTER])
