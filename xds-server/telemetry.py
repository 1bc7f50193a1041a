"""OpenTelemetry for the control plane: spans for translate and push, metrics for /metrics.

The providers are the server's own (not the process-global ones), so a test
process that also hosts other parts' telemetry does not mix them. Metrics are
read by the OpenTelemetry Prometheus reader into a private registry that
/metrics renders; finished spans go to a bounded in-memory ring that
/debug/tracez shows (there is no collector to export to on 127.0.0.1).
"""
from __future__ import annotations

import collections
import threading

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from prometheus_client import CollectorRegistry, generate_latest

from mcp26.serving import gc_pauses
from mcp26.serving.h2 import limits as h2_limits

SERVICE = Resource.create({"service.name": "mcp-mesh-xds"})


class RingSpanExporter(SpanExporter):
    """Keeps the last `size` finished spans."""

    def __init__(self, size: int = 500):
        self.spans: collections.deque[ReadableSpan] = collections.deque(maxlen=size)

    def export(self, spans) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def recent(self, name: str | None = None) -> list[dict]:
        return [{"name": s.name, "start_ns": s.start_time, "duration_ms": (s.end_time - s.start_time) / 1e6,
                 "attributes": dict(s.attributes or {})}
                for s in list(self.spans) if name is None or s.name == name]


class Metrics:
    def __init__(self, provider: MeterProvider):
        m = provider.get_meter("mcp26.xds")
        # Pushes are counted in plain tallies and observed when /metrics is read: a
        # Counter.add is ~25 us of SDK work, and three a response were 11 % of the loop
        # while 1,000 proxies took a change (xds-server/README.md "Scale").
        self._pushes: dict[tuple[str, str], list[int]] = {}   # (type, protocol) -> [responses, resources, bytes]
        for i, (name, unit, description) in enumerate((
                ("xds_pushes", "", "xDS responses sent"),
                ("xds_pushed_resources", "", "resources in xDS responses"),
                ("xds_push_bytes", "By", "bytes of xDS responses"))):
            m.create_observable_counter(name, callbacks=[self._observe(i)], unit=unit, description=description)
        self.nacks = m.create_counter("xds_nacks", description="responses a proxy rejected")
        self.connected = m.create_up_down_counter("xds_connected_proxies", description="open ADS streams")
        self.config_applied = m.create_counter("xds_config_applied", description="change sets applied")
        self.config_rejected = m.create_counter("xds_config_rejected", description="change sets rejected whole")
        self.translate_seconds = m.create_histogram("xds_translate_duration", unit="s",
                                                    description="translating one change set for all node shapes")

    def count_push(self, type_name: str, protocol: str, resources: int, size: int) -> None:
        """One response sent (the ADS loop's thread only)."""
        tally = self._pushes.get((type_name, protocol))
        if tally is None:
            tally = self._pushes[(type_name, protocol)] = [0, 0, 0]
        tally[0] += 1
        tally[1] += resources
        tally[2] += size

    def _observe(self, i: int):
        def observe(_options):
            return [Observation(tally[i], {"type": t, "protocol": p})
                    for (t, p), tally in list(self._pushes.items())]
        return observe


class Telemetry:
    """One set of providers: metrics into a private registry, spans into a ring.

    The server takes one (and hands it to the ADS hub and the admin app);
    `default()` is the process's, which the snapshot cache still reaches through
    `metrics()` / `tracer()`, and which the server uses unless given another;
    the server hands its tracer to its Translator, so that /debug/tracez shows
    translate and push spans side by side.
    """

    def __init__(self):
        self.registry = CollectorRegistry()
        self.meter_provider = MeterProvider(resource=SERVICE,
                                            metric_readers=[PrometheusMetricReader(registry=self.registry)])
        self.metrics = Metrics(self.meter_provider)
        self.spans = RingSpanExporter()
        self.tracer_provider = TracerProvider(resource=SERVICE)
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.tracer = self.tracer_provider.get_tracer("mcp26.xds")

    def watch_gc(self) -> None:
        """The process's cyclic-GC pauses by generation and the objects frozen after each apply
        (server.py), as the model server exports them (serving/gc_pauses.py). Process-wide, so only
        the default telemetry watches."""
        h2_limits.export_metrics(self.registry)    # HTTP/2 clients of ADS refused or closed (serving/h2/limits.py)
        self.gc_pauses = gc_pauses.export_metrics(self.registry, "Objects moved out of the cyclic collector's "
                                                  "sight (gc.freeze after each applied config)")

    def recent_spans(self, name: str | None = None) -> list[dict]:
        return self.spans.recent(name)

    def prometheus_text(self) -> bytes:
        return generate_latest(self.registry)


_lock = threading.Lock()
_default: Telemetry | None = None


def default() -> Telemetry:
    global _default
    if _default is None:
        with _lock:
            if _default is None:
                _default = Telemetry()
                _default.watch_gc()
    return _default


def metrics() -> Metrics:
    return default().metrics


def tracer():
    return default().tracer


def recent_spans(name: str | None = None) -> list[dict]:
    return default().recent_spans(name)
