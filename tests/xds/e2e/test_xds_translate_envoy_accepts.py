"""Real Envoy accepts everything translate() emits, for every proxy kind.

The config in tests/data/xds_translate_all_features.yaml exercises every
translated feature; its snapshot is booted as a static bootstrap (routes
inlined, EDS clusters made STATIC with their assignments), so a field Envoy
rejects stops it from starting, and /config_dump must show every resource.
"""
import os
import string

import pytest

from mcp26.mesh.resources import MeshConfig
from mcp26.mesh.change_set import load_texts
from mcp26.demo.stack.envoy import Envoy
from mcp26.demo.stack.ports import free_port
from mcp26.xds.translate import translate
from mcp26.xds.translate.static import static_bootstrap
from mcp26.xds.model.type_urls import CLUSTER, LISTENER, ROUTE
from mcp26.xds.model.node import ProxyNode
from harness.paths import TEST_DATA

pytestmark = pytest.mark.e2e
DATA = os.path.join(TEST_DATA, "xds_translate_all_features.yaml")
PORTS = ["GW_PORT", "GW_PORT2", "GW_TCP", "GW_TLS", "DB_PORT", "SVC_PORT", "SVC_PORT_GRPC", "UP1", "UP2", "UP3"]


def all_features() -> MeshConfig:
    with open(DATA) as f:
        # A direct response over Envoy's default 4 KiB body limit.
        text = string.Template(f.read()).substitute({**{k: free_port() for k in PORTS}, "BIG_BODY": "x" * 6000})
    return load_texts({DATA: text})       # parsed, validated and analysed as the control plane does


def dumped(envoy: Envoy) -> tuple[set, dict, set]:
    dump = envoy.config_dump()["configs"]
    by_type = {c["@type"].rsplit(".", 1)[-1]: c for c in dump}
    listeners = {s["listener"]["name"]: s["listener"] for s in by_type["ListenersConfigDump"].get("static_listeners", [])}
    routes = {}
    for lis in listeners.values():
        for chain in lis["filter_chains"]:
            typed = chain["filters"][0]["typed_config"]
            if "route_config" in typed:           # HTTP (tcp_proxy chains have none)
                routes[typed["route_config"]["name"]] = typed["route_config"]
    clusters = {c["cluster"]["name"] for c in by_type["ClustersConfigDump"].get("static_clusters", [])}
    return set(listeners), routes, clusters


@pytest.mark.parametrize("kind", ["router", "sidecar"])
def test_envoy_boots_every_translated_feature(kind):
    snap = translate(all_features(), ProxyNode(f"{kind}~127.0.0.1~p.default~default.svc.cluster.local",
                                               kind=kind, labels={"istio": "ingressgateway"}))
    assert snap[LISTENER] and snap[ROUTE] and snap[CLUSTER]
    with Envoy(static_bootstrap(snap)) as envoy:       # start() waits for /ready == LIVE
        listeners, routes, clusters = dumped(envoy)
        assert listeners == set(snap[LISTENER])
        assert set(routes) == set(snap[ROUTE])
        for name, rc in snap[ROUTE].items():
            assert sum(len(vh.routes) for vh in rc.virtual_hosts) == \
                sum(len(vh.get("routes", [])) for vh in routes[name].get("virtual_hosts", []))
        assert clusters == set(snap[CLUSTER])
        # L4 too: the gateway's TCP and TLS-passthrough servers, the sidecar's TCP port.
        assert '"envoy.filters.network.tcp_proxy"' in envoy.admin("/config_dump?resource=static_listeners")[1]
        assert envoy.proc.poll() is None
