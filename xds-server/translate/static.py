"""A translated snapshot as a static Envoy bootstrap (no control plane).

Route configurations are inlined into their HTTP connection managers and EDS
clusters get their ClusterLoadAssignment inline as STATIC clusters, so the
exact resources served over ADS can be booted, inspected or diffed offline.
"""
from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
import json

from google.protobuf import json_format

from xds_server.type_urls import CLUSTER, ENDPOINT, LISTENER, ROUTE, Snapshot


def _json(msg) -> dict:
    # Plain dicts (MessageToDict leaves OrderedDicts in maps, which YAML dumpers refuse).
    return json.loads(json_format.MessageToJson(msg))


def static_resources(snapshot: Snapshot) -> dict:
    """{"listeners": [...], "clusters": [...]} as Envoy's bootstrap JSON."""
    routes = snapshot.get(ROUTE, {})
    assignments = snapshot.get(ENDPOINT, {})
    listeners = []
    for lis in snapshot.get(LISTENER, {}).values():
        if lis.HasField("api_listener"):
            continue                         # proxyless gRPC only
        lis = type(lis).FromString(lis.SerializeToString())
        for chain in lis.filter_chains:
            for f in chain.filters:
                hcm = hcm_pb2.HttpConnectionManager()
                if not f.typed_config.Unpack(hcm) or not hcm.HasField("rds"):
                    continue
                rc = routes.get(hcm.rds.route_config_name)
                hcm.ClearField("rds")
                hcm.route_config.CopyFrom(rc) if rc is not None else hcm.route_config.SetInParent()
                f.typed_config.Pack(hcm)
        listeners.append(_json(lis))
    clusters = []
    for c in snapshot.get(CLUSTER, {}).values():
        c = type(c).FromString(c.SerializeToString())
        if c.type == cluster_pb2.Cluster.EDS:
            cla = assignments.get(c.eds_cluster_config.service_name or c.name)
            c.ClearField("eds_cluster_config")
            c.type = cluster_pb2.Cluster.STATIC
            if cla is not None:
                c.load_assignment.CopyFrom(cla)
            else:
                c.load_assignment.cluster_name = c.name
        clusters.append(_json(c))
    return {"listeners": listeners, "clusters": clusters}


def static_bootstrap(snapshot: Snapshot, node_id: str = "static", cluster: str = "mcp-mesh") -> dict:
    return {"node": {"id": node_id, "cluster": cluster}, "static_resources": static_resources(snapshot)}
