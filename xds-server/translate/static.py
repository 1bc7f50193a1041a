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

from mcp26.xds.model.type_urls import CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET, Snapshot


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


def _ads_secrets(obj) -> set[str]:
    """Names of the secrets `obj` (Envoy JSON) asks for over SDS on the ADS stream."""
    found = set()
    if isinstance(obj, dict):
        if "ads" in (obj.get("sdsConfig") or {}) and obj.get("name"):
            found.add(obj["name"])
        for v in obj.values():
            found |= _ads_secrets(v)
    elif isinstance(obj, list):
        for v in obj:
            found |= _ads_secrets(v)
    return found


def _static_secret_refs(obj) -> None:
    """An SDS reference without sdsConfig names a secret of the bootstrap's static_resources."""
    if isinstance(obj, dict):
        if "ads" in (obj.get("sdsConfig") or {}):
            del obj["sdsConfig"]
        for v in obj.values():
            _static_secret_refs(v)
    elif isinstance(obj, list):
        for v in obj:
            _static_secret_refs(v)


def static_bootstrap(snapshot: Snapshot, node_id: str = "static", cluster: str = "mcp-mesh") -> dict:
    """The snapshot as a bootstrap without ADS. Secrets the snapshot holds
    (type SECRET) become static secrets; a filter chain or cluster that needs a
    secret only the control plane's SDS serves per node (a workload
    certificate, a credentialName not in the snapshot) is left out -- a static
    Envoy cannot fetch it, and Envoy refuses to start with the reference."""
    resources = static_resources(snapshot)
    secrets = {name: _json(msg) for name, msg in snapshot.get(SECRET, {}).items()}
    for lis in resources["listeners"]:
        lis["filterChains"] = [c for c in lis.get("filterChains") or [] if _ads_secrets(c) <= secrets.keys()]
    resources["listeners"] = [lis for lis in resources["listeners"] if lis["filterChains"]]
    resources["clusters"] = [c for c in resources["clusters"] if _ads_secrets(c) <= secrets.keys()]
    _static_secret_refs(resources)
    if secrets:
        resources["secrets"] = list(secrets.values())
    return {"node": {"id": node_id, "cluster": cluster}, "static_resources": resources}
