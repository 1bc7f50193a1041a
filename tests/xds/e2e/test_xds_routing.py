"""Istio routing through a real Envoy fed over ADS, each change taken from the watched directory.

One control plane, one gateway Envoy and three echo upstreams per protocol
(SotW and Delta); the tests run in order on that mesh without restarting
Envoy, and each asserts on which upstream answered.
"""
import json
import re
import time

import pytest

from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.control_plane import ControlPlane, mesh_envoy, write_config
from mcp26.demo.stack.xds_scenario import GATEWAY_LABELS, Client, base_config, virtual_service

pytestmark = pytest.mark.e2e

NODE = "router~127.0.0.1~gw-1.default~default.svc.cluster.local"
JASON = {"end-user": "jason"}


@pytest.fixture(scope="module", params=["sotw", "delta"])
def mesh(request, tmp_path_factory):
    delta = request.param == "delta"
    config_dir = str(tmp_path_factory.mktemp(f"config-{request.param}"))
    ups = {v: EchoUpstream(v).start() for v in ("v1", "v2", "v3")}
    gateway_port = free_port()
    for name, text in base_config(gateway_port, {v: u.port for v, u in ups.items()}).items():
        write_config(config_dir, name, text)
    cp = ControlPlane(config_dir)
    envoy = mesh_envoy(cp, node_id=NODE, delta=delta, labels=GATEWAY_LABELS)
    client = Client(gateway_port)
    try:
        cp.start()
        envoy.start()
        cp.wait_synced(NODE, types=("CDS", "EDS", "LDS", "RDS"))
        yield {"cp": cp, "envoy": envoy, "client": client, "dir": config_dir, "delta": delta,
               "pid": envoy.proc.pid}
    finally:
        client.close()
        envoy.stop()
        cp.close()
        for u in ups.values():
            u.stop()


def apply(mesh, name, text):
    """Write one file into the watched dir and wait until the node ACKed the new generation."""
    mesh["cp"].apply(name, text, node_id=NODE)


def test_header_routes_jason_to_v2_everyone_else_to_v1(mesh):
    c = mesh["client"]
    assert c.count(20, JASON) == {"v2": 20}
    assert c.count(20) == {"v1": 20}
    status, _, seen = c.get(headers=JASON)
    assert seen["headers"]["end-user"] == "jason"      # forwarded as sent
    assert "x-request-id" in seen["headers"]           # Envoy was in the path


def test_spans_and_metrics_of_translate_and_push(mesh):
    cp = mesh["cp"]
    pushes = json.loads(cp.get("/debug/tracez?name=xds.push")[1])
    assert any(s["attributes"].get("xds.node") == NODE and s["attributes"]["xds.responses"] >= 1 for s in pushes)
    translates = json.loads(cp.get("/debug/tracez?name=xds.translate")[1])
    assert translates and translates[0]["attributes"]["xds.generation"] == "g1"     # each change set
    shapes = json.loads(cp.get("/debug/tracez?name=xds.translate.shape")[1])     # each node shape
    assert any(s["attributes"]["xds.node"] == NODE and s["attributes"]["xds.resources"] >= 4 for s in shapes)
    metrics = cp.get("/metrics")[1]
    protocol = "delta" if mesh["delta"] else "sotw"
    assert re.search(rf'xds_pushes_total{{[^}}]*protocol="{protocol}"[^}}]*type="RDS"[^}}]*}} [1-9]', metrics)
    assert re.search(r'xds_connected_proxies{[^}]*} 1', metrics)
    # the applied config frozen out of the cyclic GC (server.py), and the process's GC pauses
    frozen = re.search(r'^mcp_python_gc_frozen_objects ([0-9.e+]+)$', metrics, re.M)
    assert frozen and float(frozen[1]) > 10_000, metrics[-2000:]
    young = re.search(r'^mcp_python_gc_pause_seconds_count{generation="0"} ([0-9.e+]+)$', metrics, re.M)
    assert young and float(young[1]) > 0
    dump = cp.config_dump(NODE)
    assert "outbound|80|v2|reviews.mesh.local" in dump["resources"]["CDS"]


def test_weighted_80_20_v1_v3_over_1000_requests(mesh):
    apply(mesh, "virtualservice.yaml", virtual_service(default=[("v1", 80), ("v3", 20)]))
    c = mesh["client"]
    counts = c.count(1000)
    assert set(counts) == {"v1", "v3"}, counts
    # Binomial(1000, 0.8): sd 12.6; 740..860 is beyond 4.7 sd either way.
    assert 740 <= counts["v1"] <= 860, counts
    assert c.count(20, JASON) == {"v2": 20}             # the header rule still wins


def test_fault_delay_applies_to_jason_only(mesh):
    envoy = mesh["envoy"]
    delayed_before = sum(v for k, v in envoy.stats("fault").items() if k.endswith("fault.delays_injected"))
    apply(mesh, "virtualservice.yaml",
          virtual_service(default=[("v1", 80), ("v3", 20)], jason_delay="0.4s"))
    c = mesh["client"]
    started = time.monotonic()
    status, upstream, _ = c.get(headers=JASON)
    elapsed = time.monotonic() - started
    assert (status, upstream) == (200, "v2")
    assert elapsed >= 0.38                              # the configured 0.4 s (timer granularity aside)
    delayed = sum(v for k, v in envoy.stats("fault").items() if k.endswith("fault.delays_injected"))
    assert delayed == delayed_before + 1
    c.count(5)                                          # others are not delayed
    assert sum(v for k, v in envoy.stats("fault").items() if k.endswith("fault.delays_injected")) == delayed


def test_every_change_was_taken_without_restarting_envoy(mesh):
    envoy = mesh["envoy"]
    assert envoy.proc.pid == mesh["pid"] and envoy.proc.poll() is None
    rds = envoy.stats("rds")
    updates = sum(v for k, v in rds.items() if k.endswith(".update_success"))
    assert updates >= 3                                 # initial + the two changes above


def test_removed_source_removes_routes(mesh):
    c = mesh["client"]
    cp = mesh["cp"]
    import os
    before = cp.configz()["generation"]
    os.remove(os.path.join(mesh["dir"], "virtualservice.yaml"))
    generation = cp.wait_generation_change(before)["generation"]
    cp.wait_synced(NODE, types=("RDS",), generation=generation)
    status, upstream, _ = c.get()
    assert status == 404 and upstream == ""            # no VirtualService: no route
    apply(mesh, "virtualservice.yaml", virtual_service(default=[("v1", None)]))
    assert c.who() == "v1"
