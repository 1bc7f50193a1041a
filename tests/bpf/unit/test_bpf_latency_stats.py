"""p50/p99 per service port from latency samples, and their Prometheus export."""
import pytest
from prometheus_client import CollectorRegistry

from mcp26.bpf.latency import METRIC_LATENCY, METRIC_SAMPLES, LatencyCollector, LatencyStats, quantile


def test_nearest_rank_quantiles():
    values = list(range(1, 101))
    assert quantile(values, 0.5) == 50
    assert quantile(values, 0.99) == 99
    assert quantile(values, 1.0) == 100
    assert quantile([7], 0.99) == 7
    with pytest.raises(ValueError):
        quantile([], 0.5)


def test_stats_per_port_and_window():
    s = LatencyStats(window=100)
    for i in range(1, 201):
        s.add(8080, i * 1000)
    s.add(9090, 5)
    assert s.count(8080) == 200                       # all samples counted
    assert s.quantiles_ns(8080) == {0.5: 150_000, 0.99: 199_000}   # over the last 100
    assert s.ports() == [8080, 9090]
    assert s.summary()[9090] == {"samples": 1, "p50_us": 0.005, "p99_us": 0.005}
    assert s.quantiles_ns(1) == {}


def test_prometheus_gauges():
    s = LatencyStats()
    for v in (1_000_000, 2_000_000, 3_000_000):
        s.add(8000, v)
    registry = CollectorRegistry()
    registry.register(LatencyCollector(s))
    assert registry.get_sample_value(METRIC_LATENCY, {"service_port": "8000", "quantile": "0.5"}) == pytest.approx(0.002)
    assert registry.get_sample_value(METRIC_LATENCY, {"service_port": "8000", "quantile": "0.99"}) == pytest.approx(0.003)
    assert registry.get_sample_value(METRIC_SAMPLES, {"service_port": "8000"}) == 3
    s.add(8000, 4_000_000)                      # read at each scrape
    assert registry.get_sample_value(METRIC_SAMPLES, {"service_port": "8000"}) == 4
