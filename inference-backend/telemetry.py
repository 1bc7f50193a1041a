"""OpenTelemetry metrics (exported as Prometheus text at /metrics) and spans.

Metrics: request latency and queue wait histograms per model and priority
level, batch size histogram, queue depth per level, requests by status,
rejections by reason, tokens/s and KV-cache hit rate of decoder models,
each cyclic-GC pause by generation and the objects frozen at start.
Next to them, the GIE model-server protocol's metrics under vLLM's names
(GieCollector below; the values come from load_state.snapshot).
Spans (when `--trace-file` is given): one `infer` span per request with
`queue_wait`, `batch_assembly` and `compute` children, their times taken
from the batcher's own clock.
"""
from __future__ import annotations

import bisect
import json
import threading
import time
from typing import Callable

from opentelemetry import metrics, trace
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
import prometheus_client
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from mcp26.serving import gc_pauses
from mcp26.inference.profiler import IDLE, METRICS, derive
from mcp26.serving.h2 import limits as h2_limits

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.03, 0.05,
                     0.075, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 128, 256)

# Monotonic (the batcher's clock) -> epoch nanoseconds (OpenTelemetry's).
_EPOCH_OFFSET_NS = time.time_ns() - time.monotonic_ns()


def epoch_ns(monotonic_ns: int) -> int:
    return monotonic_ns + _EPOCH_OFFSET_NS


class JsonLinesSpanExporter(SpanExporter):
    """One JSON object per finished span; enough to check a trace without a collector."""

    def __init__(self, path: str):
        self._fh = open(path, "a", buffering=1)
        self._lock = threading.Lock()

    def export(self, spans) -> SpanExportResult:
        with self._lock:
            for s in spans:
                self._fh.write(json.dumps({
                    "name": s.name, "trace_id": f"{s.context.trace_id:032x}", "span_id": f"{s.context.span_id:016x}",
                    "parent_id": f"{s.parent.span_id:016x}" if s.parent else None,
                    "start_ns": s.start_time, "end_ns": s.end_time, "attributes": dict(s.attributes or {}),
                }) + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._fh.close()


class GieCollector:
    """The Gateway API Inference Extension's model-server metrics, named as vLLM names
    them (the reference Endpoint Picker scrapes these), labelled `model_name`:

    vllm:num_requests_waiting      gauge  TotalQueuedRequests
    vllm:num_requests_running      gauge  TotalRunningRequests
    vllm:kv_cache_usage_perc       gauge  KVCacheUtilization, 0-1 (vLLM V1's name)
    vllm:gpu_cache_usage_perc      gauge  the same value under vLLM V0's name (older pickers)
    vllm:cache_config_info         gauge  1, labels block_size and num_gpu_blocks (budget / block bytes)
    vllm:prefix_cache_queries_total counter prompt tokens looked up in the prefix cache
    vllm:prefix_cache_hits_total   counter of those, tokens found cached
    vllm:gpu_prefix_cache_hit_rate gauge  hits / queries so far (vLLM V0)
    vllm:avg_generation_throughput_toks_per_s gauge  tokens generated per second (10 s window)
    vllm:prompt_tokens_total, vllm:generation_tokens_total  counters (OpenAI API generations)

    and the same gauges under this project's names: mcp_inference_waiting_requests,
    mcp_inference_running_requests, mcp_inference_kv_cache_utilization,
    mcp_inference_prefix_cache_hit_rate.
    """

    def __init__(self):
        self.sources: list[Callable[[], list[tuple[dict, object]]]] = []

    def describe(self):
        return []       # collected only on scrape: nothing to check at registration

    def collect(self):
        fams = {n: GaugeMetricFamily(n, d, labels=["model_name"]) for n, d in (
            ("vllm:num_requests_waiting", "Requests waiting for their first run"),
            ("vllm:num_requests_running", "Requests running (generations being decoded, batch in compute)"),
            ("vllm:kv_cache_usage_perc", "KV-cache utilisation: share of the budget live sequences hold (0-1)"),
            ("vllm:gpu_cache_usage_perc", "KV-cache utilisation (vLLM V0 name of vllm:kv_cache_usage_perc)"),
            ("vllm:gpu_prefix_cache_hit_rate", "Prompt tokens found in the prefix cache / looked up"),
            ("vllm:avg_generation_throughput_toks_per_s", "Generated tokens per second (10 s window)"),
            ("mcp_inference_waiting_requests", "Requests waiting for their first run"),
            ("mcp_inference_running_requests", "Requests running"),
            ("mcp_inference_kv_cache_utilization", "Share of the KV-cache budget live sequences hold (0-1)"),
            ("mcp_inference_prefix_cache_hit_rate", "Prompt tokens found in the prefix cache / looked up"))}
        counters = {n: CounterMetricFamily(n, d, labels=["model_name"]) for n, d in (
            ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache"),
            ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache"),
            ("vllm:prompt_tokens", "Prompt tokens of OpenAI API generations"),
            ("vllm:generation_tokens", "Tokens generated by OpenAI API generations"))}
        info = GaugeMetricFamily("vllm:cache_config_info", "KV-cache configuration",
                                 labels=["model_name", "block_size", "num_gpu_blocks"])
        for source in self.sources:
            for snap, served in source():
                name = [snap["model"]]
                fams["vllm:num_requests_waiting"].add_metric(name, snap["waiting"])
                fams["vllm:num_requests_running"].add_metric(name, snap["running"])
                fams["vllm:kv_cache_usage_perc"].add_metric(name, snap["kv_cache_utilization"])
                fams["vllm:gpu_cache_usage_perc"].add_metric(name, snap["kv_cache_utilization"])
                fams["vllm:gpu_prefix_cache_hit_rate"].add_metric(name, snap["prefix_cache_hit_rate"])
                fams["vllm:avg_generation_throughput_toks_per_s"].add_metric(name, snap["tokens_per_second"])
                fams["mcp_inference_waiting_requests"].add_metric(name, snap["waiting"])
                fams["mcp_inference_running_requests"].add_metric(name, snap["running"])
                fams["mcp_inference_kv_cache_utilization"].add_metric(name, snap["kv_cache_utilization"])
                fams["mcp_inference_prefix_cache_hit_rate"].add_metric(name, snap["prefix_cache_hit_rate"])
                if "kv_block_tokens" in snap:
                    counters["vllm:prefix_cache_queries"].add_metric(name, snap["prefix_cache_queries"])
                    counters["vllm:prefix_cache_hits"].add_metric(name, snap["prefix_cache_hits"])
                    block_bytes = served.kv_cache_block_bytes()
                    info.add_metric(name + [str(snap["kv_block_tokens"]),
                                            str(snap["kv_cache_capacity_bytes"] // block_bytes if block_bytes else 0)], 1)
                gen = getattr(served, "generation_load", None)
                if gen is not None:
                    counters["vllm:prompt_tokens"].add_metric(name, gen.prompt_tokens)
                    counters["vllm:generation_tokens"].add_metric(name, gen.generation_tokens)
        yield from fams.values()
        yield from counters.values()
        yield info


_GIE = GieCollector()
REGISTRY.register(_GIE)


class ProfilerCollector:
    """`--enable-profiler`'s 17 metrics (profiler.METRICS) as gauges `mcp_profiler_<key>{model_name}`,
    each over the window since the previous scrape; a metric the machine cannot give is left out
    of its gauge and listed in `mcp_profiler_unavailable{model_name,metric,reason}` instead of 0."""

    def __init__(self):
        self.sources: list[tuple[str, object]] = []      # (model name, profiler.Profiler)
        self._last: dict[int, dict] = {}

    def describe(self):
        return []

    def collect(self):
        gauges = {k: GaugeMetricFamily(f"mcp_profiler_{k}", f"{meaning} ({unit}; {src})", labels=["model_name"])
                  for k, unit, src, meaning in METRICS if k != "kernel_ms_by_op_type"}
        by_op = GaugeMetricFamily("mcp_profiler_kernel_ms_by_op_type", "kernel time per batch by operator type "
                                  "(ms; ONNX Runtime profile, twin)", labels=["model_name", "op_type"])
        fusion = GaugeMetricFamily("mcp_profiler_fused_nodes_by_type", "fused nodes ONNX Runtime runs, by type; "
                                   "in_effect: on this session's provider", labels=["model_name", "op_type", "in_effect"])
        missing = GaugeMetricFamily("mcp_profiler_unavailable", "a profiler metric this machine does not give, "
                                    "and why (1)", labels=["model_name", "metric", "reason"])
        for name, prof in self.sources:
            doc = prof.doc()
            values = derive(self._last.get(id(prof)), doc)
            self._last[id(prof)] = doc
            for key, gauge in gauges.items():
                if values.get(key) is not None:
                    gauge.add_metric([name], float(values[key]))
            for op, ms in values.get("kernel_by_op", {}).items():
                by_op.add_metric([name, op], ms)
            for op, f in values.get("fusion", {}).get("fused", {}).items():
                fusion.add_metric([name, op, str(f["in_effect"]).lower()], f["count"])
            for key, reason in values["reasons"].items():
                if reason != IDLE:          # idle since the last scrape: nothing to say, not unavailable
                    missing.add_metric([name, key, reason], 1)
        yield from gauges.values()
        yield by_op
        yield fusion
        yield missing


_PROFILERS = ProfilerCollector()
REGISTRY.register(_PROFILERS)


class _Instrument:
    """A prometheus_client metric behind OpenTelemetry's `record` / `add` calls.

    The per-request instruments (request and queue duration, compute time,
    batch size, requests by code) were OpenTelemetry's: 25-30 us a call on
    this machine, five calls a request. prometheus_client's `observe` is
    ~1 us (the histograms: _Histogram, less); the exported series keep their
    names, labels and buckets (without OpenTelemetry's otel_scope_* labels)."""

    def __init__(self, metric, label_names: tuple[str, ...]):
        self._metric = metric
        self._names = label_names
        self._series: dict[tuple[str, ...], object] = {}

    def _child(self, attrs: dict):
        return self.series(*[str(attrs.get(n, "")) for n in self._names])

    def series(self, *values: str):
        """The child for these label values, in label order (`observe` / `inc` it): what a
        per-request caller uses, with no attributes dict to build and flatten each time."""
        child = self._series.get(values)
        if child is None:
            child = self._series[values] = self._metric.labels(**dict(zip(self._names, values)))
        return child

    def record(self, value: float, attrs: dict) -> None:
        self._child(attrs).observe(value)

    def add(self, amount: float, attrs: dict) -> None:
        self._child(attrs).inc(amount)


class _Series:
    """One label set of a _Histogram: a count per bucket (the last +Inf) and the sum."""

    __slots__ = ("bounds", "counts", "sum", "lock")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.lock = threading.Lock()

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)      # the first bound >= value (le is inclusive)
        with self.lock:             # the loop and the compute threads record
            self.counts[i] += 1
            self.sum += value


class _Histogram:
    """A labelled histogram exported as prometheus_client's Histogram is (same names, labels,
    buckets, _bucket/_count/_sum series), at a third of its cost a request: one bisect and one
    lock where prometheus_client's observe walks the buckets in Python under two locks (four
    observations a request)."""

    def __init__(self, name: str, documentation: str, label_names: tuple[str, ...], buckets):
        self.name, self.documentation, self.label_names = name, documentation, tuple(label_names)
        self.bounds = tuple(float(b) for b in buckets)
        self._series: dict[tuple[str, ...], _Series] = {}
        self._lock = threading.Lock()
        REGISTRY.register(self)

    def labels(self, **labels: str) -> _Series:
        key = tuple(str(labels[n]) for n in self.label_names)
        with self._lock:
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = _Series(self.bounds)
        return series

    def describe(self):
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.label_names)]

    def collect(self):
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.label_names)
        with self._lock:
            series = list(self._series.items())
        les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        for key, s in series:
            with s.lock:
                counts, total = list(s.counts), s.sum
            running, buckets = 0, []
            for le, n in zip(les, counts):
                running += n
                buckets.append((le, float(running)))
            family.add_metric(list(key), buckets, total)
        yield family


def _histogram(name: str, description: str, labels: tuple[str, ...], buckets) -> _Instrument:
    return _Instrument(_Histogram(name, description, labels, buckets), labels)


class Telemetry:
    _instance: "Telemetry | None" = None

    @classmethod
    def get(cls, trace_file: str | None = None) -> "Telemetry":
        # One per process: the Prometheus registry and OTel providers are global.
        if cls._instance is None:
            cls._instance = cls(trace_file)
        return cls._instance

    def __init__(self, trace_file: str | None = None):
        resource = Resource.create({"service.name": "mcp-inference-backend"})
        self._reader = PrometheusMetricReader()
        views = [
            View(instrument_name="mcp_inference_request_duration_seconds",
                 aggregation=ExplicitBucketHistogramAggregation(LATENCY_BUCKETS_S)),
            View(instrument_name="mcp_inference_queue_duration_seconds",
                 aggregation=ExplicitBucketHistogramAggregation(LATENCY_BUCKETS_S)),
            View(instrument_name="mcp_inference_compute_duration_seconds",
                 aggregation=ExplicitBucketHistogramAggregation(LATENCY_BUCKETS_S)),
            View(instrument_name="mcp_inference_batch_size",
                 aggregation=ExplicitBucketHistogramAggregation(BATCH_BUCKETS)),
        ]
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[self._reader], views=views)
        meter = self.meter_provider.get_meter("mcp26.inference")
        # The per-request ones: prometheus_client (see _Instrument); the rest stay OpenTelemetry's.
        prometheus_client.disable_created_metrics()     # no *_created series beside each counter
        self.request_duration = _histogram(
            "mcp_inference_request_duration_seconds",
            "Server-side latency of an inference request (queue + compute), by priority level",
            ("model", "priority_level"), LATENCY_BUCKETS_S)
        self.queue_duration = _histogram(
            "mcp_inference_queue_duration_seconds", "Time a request waited in its priority queue",
            ("model", "priority_level"), LATENCY_BUCKETS_S)
        self.compute_duration = _histogram(
            "mcp_inference_compute_duration_seconds", "Model run time of a batch", ("model",), LATENCY_BUCKETS_S)
        self.batch_size = _histogram(
            "mcp_inference_batch_size", "Rows per model run formed by the dynamic batcher", ("model",),
            BATCH_BUCKETS)
        # Each cyclic-GC pause, by generation: a full collection stops the loop (serving/gc_pauses.py).
        # What HTTP/2 clients of the gRPC port were refused or closed for (serving/h2/limits.py).
        h2_limits.export_metrics(REGISTRY)
        self.gc_pauses = gc_pauses.export_metrics(REGISTRY, "Objects moved out of the cyclic collector's sight "
                                                  "once the server was ready (gc.freeze)")
        self.requests = _Instrument(prometheus_client.Counter(
            "mcp_inference_requests", "Inference requests by model, protocol and status code",
            ("model", "protocol", "code")), ("model", "protocol", "code"))
        self.rejections = meter.create_counter(
            "mcp_inference_rejections", description="Requests refused by a queue policy, by level and reason")
        self.qos_ignored = meter.create_counter(
            "mcp_inference_qos_ignored", description="Requests whose QoS class header or priority parameter was "
            "not honoured (session key set, not signed), by model and reason")
        self.reloads = meter.create_counter(
            "mcp_inference_reloads", description="Hot reconfigurations applied (model version or QoS policy)")
        meter.create_observable_gauge("mcp_inference_queue_depth", callbacks=[self._observe("queue_depth")],
                                      description="Requests waiting, by model and priority level")
        meter.create_observable_gauge("mcp_inference_tokens_per_second", callbacks=[self._observe("tokens_per_second")],
                                      description="Decoder tokens generated per second (10 s window)")
        meter.create_observable_gauge("mcp_inference_kv_cache_hit_rate", callbacks=[self._observe("kv_cache_hit_rate")],
                                      description="Continuing sequences whose KV cache was still held")
        meter.create_observable_gauge("mcp_inference_kv_cache_bytes", callbacks=[self._observe("kv_cache_bytes")],
                                      description="Bytes of KV cache held")
        meter.create_observable_gauge("mcp_inference_tokens", callbacks=[self._observe("tokens")],
                                      description="Decoder tokens so far, by kind (generated, processed, recomputed)")
        self._sources: dict[str, list[Callable[[], list[tuple[float, dict]]]]] = {}
        self.tracing = bool(trace_file)
        if trace_file:
            provider = TracerProvider(resource=resource)
            provider.add_span_processor(BatchSpanProcessor(JsonLinesSpanExporter(trace_file),
                                                           schedule_delay_millis=200))
            self.tracer_provider = provider
            self.tracer = provider.get_tracer("mcp26.inference")
        else:
            self.tracer_provider = None
            self.tracer = trace.NoOpTracer()

    def _observe(self, name: str):
        def callback(_options):
            out = []
            for source in self._sources.get(name, []):
                for value, attrs in source():
                    out.append(metrics.Observation(value, attrs))
            return out
        return callback

    def add_load_source(self, source: Callable[[], list[tuple[dict, object]]]) -> None:
        """(load_state.snapshot(served), served) pairs for the GIE metrics, read on each scrape."""
        _GIE.sources.append(source)

    def add_profiler(self, model: str, profiler) -> None:
        _PROFILERS.sources.append((model, profiler))

    def add_gauge_source(self, name: str, source: Callable[[], list[tuple[float, dict]]]) -> None:
        self._sources.setdefault(name, []).append(source)

    def prometheus_text(self) -> bytes:
        return generate_latest(REGISTRY)

    def record_spans(self, model: str, level: int, arrival_ns: int, result, request_id: str, protocol: str) -> None:
        """The request's spans, from the batcher's timestamps (monotonic -> epoch)."""
        if not self.tracing:
            return
        start = epoch_ns(arrival_ns)
        queued_end = start + result.queue_us * 1000
        assembled_end = queued_end + result.assemble_us * 1000
        end = assembled_end + result.compute_us * 1000
        attrs = {"model": model, "priority_level": level, "batch_size": result.batch_size,
                 "batch_requests": result.batch_requests, "protocol": protocol, "request_id": request_id}
        root = self.tracer.start_span("infer", start_time=start, attributes=attrs)
        ctx = trace.set_span_in_context(root)
        for name, a, b in (("queue_wait", start, queued_end), ("batch_assembly", queued_end, assembled_end),
                           ("compute", assembled_end, end)):
            self.tracer.start_span(name, context=ctx, start_time=a).end(end_time=b)
        root.end(end_time=max(end, time.time_ns()))

    def shutdown(self) -> None:
        if self.tracer_provider:
            self.tracer_provider.shutdown()
