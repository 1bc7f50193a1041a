"""The console's logic: histogram quantiles over a window, and the mesh view from control-plane JSON."""
import asyncio
import json
import math
import os

import aiohttp
from aiohttp import web
import pytest
from google.protobuf import json_format
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from mcp26.mesh.change_set import load_config
from mcp26.mesh.qos import QosClass
from mcp26.demo.stack.ports import free_port
from mcp26.xds.console import mesh_state
from mcp26.xds.console.latency import LatencyWindow, delta, histograms_by_class, quantile, unit_to_ms
from mcp26.xds.console.server import Console, ConsoleOptions
from mcp26.xds.translate import translate
from mcp26.xds.model.type_urls import CLUSTER, ENDPOINT, LISTENER, ROUTE
from mcp26.xds.model.node import ProxyNode
from harness.paths import CONSOLE

BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)


def test_quantile_interpolates_within_the_bucket_as_prometheus_does():
    b = {0.1: 5.0, 0.2: 10.0, math.inf: 10.0}
    assert quantile(0.5, b) == pytest.approx(0.1)
    assert quantile(0.75, b) == pytest.approx(0.15)
    assert quantile(0.99, {0.1: 0.0, 0.2: 0.0, math.inf: 4.0}) == 0.2   # only +Inf: the highest finite bound
    assert quantile(0.5, {0.1: 0.0, math.inf: 0.0}) is None            # nothing observed


def test_delta_is_the_window_and_a_counter_reset_starts_over():
    before, now = {0.1: 3.0, math.inf: 4.0}, {0.1: 5.0, math.inf: 9.0}
    assert delta(now, before) == {0.1: 2.0, math.inf: 5.0}
    assert delta({0.1: 1.0, math.inf: 1.0}, now) == {0.1: 1.0, math.inf: 1.0}


def test_unit_comes_from_the_metric_name():
    assert unit_to_ms("x_request_duration_seconds") == 1000
    assert unit_to_ms("x_latency_ms") == 1
    assert unit_to_ms("x_latency_us") == 0.001


def _scrape(observations: dict[str, list[float]], registry=None, hist=None):
    registry = registry or CollectorRegistry()
    hist = hist or Histogram("mcp_inference_request_duration_seconds", "t", ["model", "priority_level"],
                             registry=registry, buckets=BUCKETS)
    for level, values in observations.items():
        for v in values:
            hist.labels("mlp", level).observe(v)
    return registry, hist, generate_latest(registry).decode()


def test_backend_priority_levels_become_qos_classes():
    _, _, text = _scrape({"1": [0.0015], "3": [0.004, 0.004]})
    name, classes = histograms_by_class(text)
    assert name == "mcp_inference_request_duration_seconds"
    assert set(classes) == {QosClass.LATENCY_CRITICAL.header_value, QosClass.STANDARD.header_value}
    assert classes["standard"][math.inf] == 2


def test_window_reports_only_the_requests_since_the_previous_scrape():
    w = LatencyWindow(window_s=1.0)
    reg, hist, text = _scrape({"3": [0.09] * 50})            # slow requests, long ago
    w.add(text, t=100.0)
    _, _, text = _scrape({"3": [0.0015] * 50}, reg, hist)    # then fast ones
    w.add(text, t=101.0)
    (point,) = w.series()["standard"]
    assert point["n"] == 50 and point["t"] == 0.0
    assert 1.0 < point["p50"] <= 2.0 and point["p99"] <= 2.0   # ms: the slow ones are outside the window


def _config_dump(config_dir: str, node: ProxyNode) -> dict:
    snap = translate(load_config(config_dir), node)
    short = {LISTENER: "LDS", ROUTE: "RDS", CLUSTER: "CDS", ENDPOINT: "EDS"}
    return {short[t]: {n: {"version": "v", "resource": json_format.MessageToDict(m)} for n, m in by.items()}
            for t, by in snap.items() if t in short}


def test_mesh_view_from_a_translated_snapshot():
    example = str(CONSOLE / "examples")
    res = _config_dump(example, ProxyNode("router~1~gw.default~x", labels={"istio": "ingressgateway"}))
    (route,) = mesh_state.routes(res, node="gw")
    assert route["match"] == "prefix /inference.GRPCInferenceService/"
    assert route["clusters"] == ["outbound|8001||inference.mesh.local"]
    assert route["listener"] == "127.0.0.1_8080" and route["routeConfig"] == "http.8080"
    (cluster,) = mesh_state.clusters(res)
    assert cluster["http2"] is True
    assert cluster["endpoints"] == [{"address": "127.0.0.1:8001", "health": "UNKNOWN", "weight": 1}]
    observed = mesh_state.observed_health({"cluster_statuses": [{"name": cluster["name"], "host_statuses": [{
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 8001}},
        "health_status": {"failed_active_health_check": True, "eds_health_status": "HEALTHY"}}]}]})
    (cluster,) = mesh_state.clusters(res, observed)
    assert cluster["endpoints"][0]["health"] == "UNHEALTHY (failed_active_health_check)"


def test_syncz_nack_carries_envoys_error():
    syncz = [{"node": "gw", "cluster": "c", "protocol": "sotw", "types": {
        "CDS": {"status": "NACKED", "sent_version": "2", "acked_version": "1", "resources": 3, "error": "bad ip"},
        "LDS": {"status": "SYNCED", "sent_version": "1", "acked_version": "1", "resources": 1, "error": ""}}}]
    (p,) = mesh_state.proxies(syncz)
    assert [(t["type"], t["status"], t["error"]) for t in p["types"]] == [
        ("LDS", "SYNCED", ""), ("CDS", "NACKED", "bad ip")]


def test_console_reports_an_unreachable_control_plane_instead_of_hanging():
    dead = free_port()   # nothing listens there

    async def run():
        console = Console(ConsoleOptions(xds_admin=f"http://127.0.0.1:{dead}", backend="", timeout_s=1.0))
        runner = web.AppRunner(console.app())
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
                async with s.get(f"http://127.0.0.1:{port}/api/mesh") as r:
                    return r.status, json.loads(await r.text())
        finally:
            await runner.cleanup()

    status, body = asyncio.run(run())
    assert status == 200 and body["proxies"] == []
    assert f"127.0.0.1:{dead}/debug/syncz" in body["sources"]["control plane"]["error"]
