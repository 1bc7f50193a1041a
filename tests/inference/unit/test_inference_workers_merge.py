"""What `mcpctl serve --workers N` sums over its processes: Triton statistics
(statistics.merge_docs) and Prometheus texts (app.merge_prometheus_texts)."""
from __future__ import annotations

import prometheus_client
from prometheus_client.parser import text_string_to_metric_families

from mcp26.inference.server import merge_prometheus_texts
from mcp26.inference.statistics import ModelStatistics, merge_docs


def _stats(requests: list[tuple[int, int]]) -> ModelStatistics:
    """(rows, batch rows) per request, each its own batch."""
    s = ModelStatistics("m")
    s.add_version("1")
    for rows, batch in requests:
        s.on_batch("1", batch, 10, 100)
        s.on_success("1", rows, batch, 1000, 5, 10, 100, 7)
    return s


def test_merge_docs_adds_counts_durations_and_batch_sizes():
    a, b = _stats([(1, 1), (2, 2)]), _stats([(2, 2), (4, 4)])
    b.add_version("2")
    (v1, v2) = merge_docs([a.docs(), b.docs()])
    assert (v1["version"], v2["version"]) == ("1", "2") and v2["inference_count"] == 0
    assert v1["inference_count"] == 9 and v1["execution_count"] == 4
    assert v1["inference_stats"]["success"] == {"count": 4, "ns": 4000}
    assert {d["batch_size"]: d["compute_infer"]["count"] for d in v1["batch_stats"]} == {1: 1, 2: 2, 4: 1}
    assert a.docs()[0]["inference_count"] == 3        # the inputs are not changed
    assert v1["last_inference"] == max(a.docs()[0]["last_inference"], b.docs()[0]["last_inference"])


def _text(value: float) -> bytes:
    reg = prometheus_client.CollectorRegistry()
    c = prometheus_client.Counter("reqs", "requests", ["code"], registry=reg)
    c.labels(code="OK").inc(value)
    h = prometheus_client.Histogram("lat", "latency", registry=reg, buckets=(1,))
    h.observe(value)
    prometheus_client.Gauge("up", "up", registry=reg).set(1)
    return prometheus_client.generate_latest(reg)


def test_merge_prometheus_texts_labels_each_worker_and_keeps_families_whole():
    merged = merge_prometheus_texts([_text(2), _text(3)]).decode()
    fams = {f.name: f for f in text_string_to_metric_families(merged)}   # a family split in two would not parse
    oks = {s.labels["worker"]: s.value for s in fams["reqs"].samples if s.name == "reqs_total"}
    assert oks == {"0": 2.0, "1": 3.0}
    assert {s.labels["worker"] for s in fams["up"].samples} == {"0", "1"}
    assert merged.count("# TYPE lat histogram") == 1
    assert sum(s.value for s in fams["lat"].samples if s.name == "lat_count") == 2
