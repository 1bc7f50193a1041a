"""The latency sampler on a real interface: tc ingress + egress on the
server's veth end, request/response turns from the client namespace, samples
read from the pinned ring buffer and exported through OpenTelemetry.
"""
from __future__ import annotations

import socket
import time
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from mcp26.bpf import attach
from mcp26.bpf.latency import METRIC_LATENCY, METRIC_SAMPLES, LatencyCollector, LatencyStats, open_pinned
from mcp26.bpf.policy import build_policy
from harness.bpf_env import TcpServer, VethPair, in_netns, netns_socket, remove_stale_namespaces, require_bpf

pytestmark = pytest.mark.e2e

SLOW_PORT, FAST_PORT, UNSAMPLED_PORT = 8080, 8081, 8082
DELAY_S = {SLOW_PORT: 0.03, FAST_PORT: 0.0, UNSAMPLED_PORT: 0.0}
REQUESTS = 15


def answer_after(delay: float):
    """A handler answering each request after `delay`: a server whose time is known."""
    def handle(c: socket.socket) -> None:
        while c.recv(4096):
            time.sleep(delay)
            c.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
    return handle


@pytest.fixture(scope="module")
def sampled():
    require_bpf()
    remove_stale_namespaces()
    pair = VethPair().create()
    servers = []
    try:
        for port, delay in DELAY_S.items():
            s = netns_socket(pair.server_ns)
            s.bind((pair.V4[1], port))
            s.listen(8)
            servers.append(TcpServer(s, answer_after(delay)))
        with in_netns(pair.server_ns):
            attach.attach(pair.server_if, build_policy(sample_ports=[SLOW_PORT, FAST_PORT]))
        stats = LatencyStats()
        with in_netns(pair.server_ns):
            reader = open_pinned(pair.server_if, stats)
        try:
            for port in DELAY_S:
                c = netns_socket(pair.client_ns)
                c.settimeout(5)
                c.connect((pair.V4[1], port))
                with c:
                    for _ in range(REQUESTS):
                        c.sendall(b"GET / HTTP/1.1\r\nhost: backend\r\n\r\n")
                        assert c.recv(4096).endswith(b"ok")
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and any(stats.count(p) < REQUESTS for p in (SLOW_PORT, FAST_PORT)):
                reader.poll(100)
            reader.drain()
        finally:
            reader.close()
        yield SimpleNamespace(stats=stats, pair=pair)
    finally:
        with in_netns(pair.server_ns):
            attach.detach(pair.server_if)
        for srv in servers:
            srv.close()
        pair.remove()


def test_one_sample_per_request_on_sampled_ports_only(sampled):
    assert sampled.stats.count(SLOW_PORT) == REQUESTS
    assert sampled.stats.count(FAST_PORT) == REQUESTS
    assert sampled.stats.count(UNSAMPLED_PORT) == 0
    assert set(sampled.stats.ports()) == {SLOW_PORT, FAST_PORT}


def test_samples_cover_the_servers_own_time(sampled):
    slow, fast = sampled.stats.quantiles_ns(SLOW_PORT), sampled.stats.quantiles_ns(FAST_PORT)
    # The slow server sleeps before answering: no sample can be shorter.
    assert min(slow.values()) >= DELAY_S[SLOW_PORT] * 1e9
    assert fast[0.5] < slow[0.5]
    assert slow[0.5] <= slow[0.99] and fast[0.5] <= fast[0.99]


def test_quantiles_are_exported_as_prometheus_gauges(sampled):
    registry = CollectorRegistry()
    registry.register(LatencyCollector(sampled.stats))
    for port in (SLOW_PORT, FAST_PORT):
        qs = sampled.stats.quantiles_ns(port)
        for q in (0.5, 0.99):
            value = registry.get_sample_value(METRIC_LATENCY, {"service_port": str(port), "quantile": str(q)})
            assert value == pytest.approx(qs[q] / 1e9)
        assert registry.get_sample_value(METRIC_SAMPLES, {"service_port": str(port)}) == REQUESTS
    assert f'{METRIC_LATENCY}{{quantile="0.5",service_port="{FAST_PORT}"}}' in generate_latest(registry).decode()


def test_exported_next_to_the_backends_own_metrics(sampled):
    from mcp26.bpf.latency import LatencyExporter
    from mcp26.inference.telemetry import Telemetry

    telemetry = Telemetry.get()
    pair = sampled.pair
    with in_netns(pair.server_ns):
        exporter = LatencyExporter(pair.server_if)       # the default registry: the backend's /metrics
    try:
        c = netns_socket(pair.client_ns)
        c.settimeout(5)
        c.connect((pair.V4[1], FAST_PORT))
        with c:
            for _ in range(5):
                c.sendall(b"GET / HTTP/1.1\r\nhost: backend\r\n\r\n")
                assert c.recv(4096).endswith(b"ok")
        deadline = time.monotonic() + 5
        while exporter.stats.count(FAST_PORT) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert exporter.stats.count(FAST_PORT) == 5
        text = telemetry.prometheus_text().decode()     # what the backend's /metrics serves
    finally:
        exporter.stop()
    lines = [ln for ln in text.splitlines() if ln.startswith("mcp_bpf_first_byte_latency_seconds{")]
    assert any(f'service_port="{FAST_PORT}"' in ln and 'quantile="0.99"' in ln for ln in lines), lines
