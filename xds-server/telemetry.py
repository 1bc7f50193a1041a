"""The control plane's telemetry: prometheus_client metrics for /metrics, OpenTelemetry spans.

Each Telemetry is the server's own (a private registry, its own tracer provider),
so a test process that also hosts other parts' telemetry does not mix them.
Metrics are prometheus_client's only (Metrics below says why); finished spans go
to a bounded in-memory ring that /debug/tracez shows (there is no collector to
export to on 127.0.0.1).
"""
from __future__ import annotations

import collections
import threading
import time

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from mcp26.serving import gc_pauses
from mcp26.serving.prometheus_names import exact_counter
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


# xds_translate_duration_seconds: a change set takes milliseconds (10 services) to seconds
# (1,000 services x 10 routes: 0.35 s CPU a shape, README "Scale"). OpenTelemetry's default
# buckets (0, 5, 10, 25, ... 10000) are meant for milliseconds: every sample in seconds fell
# into the first one.
TRANSLATE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# istiod's pilot_proxy_convergence_time buckets (pilot/pkg/xds/monitoring.go).
CONVERGENCE_BUCKETS_S = (0.1, 0.5, 1, 3, 5, 10, 20, 30)
PILOT_TYPES = {"CDS": "cds", "EDS": "eds", "LDS": "lds", "RDS": "rds", "ECDS": "ecds", "SDS": "sds"}


class Metrics:
    """The control plane's /metrics, all prometheus_client (one metrics library; OpenTelemetry
    stays for spans only, which /debug/tracez shows). OpenTelemetry's Prometheus reader put
    otel_scope_* labels on these series and its Counter.add cost ~25 us; the series keep
    their names and labels.

    Beside mesh's own `xds_*` series, istiod's names, so that an Istio control-plane dashboard
    reads this one (istio/istio pilot/pkg/xds/monitoring.go, pkg/xds/monitoring.go):
    pilot_xds{version}  gauge   connected proxies by their Envoy version
    pilot_xds_pushes{type}  counter  responses sent by type (cds, eds, lds, rds, ecds, sds)
    pilot_total_xds_rejects{type}  counter  responses proxies NACKed
    pilot_proxy_convergence_time  histogram  config change -> a proxy sent all it needs
    istiod exports its counters without the `_total` suffix (OpenTelemetry's
    WithoutCounterSuffixes), and a dashboard's query names them so: serving.prometheus_names.
    """

    def __init__(self, registry: CollectorRegistry):
        # Pushes are counted in plain tallies and read when /metrics is scraped: one
        # dict update a response while 1,000 proxies take a change (README "Scale").
        self._pushes: dict[tuple[str, str], list[int]] = {}   # (type, protocol) -> [responses, resources, bytes]
        self._nacks: dict[tuple[str, str, str], int] = {}     # (type, protocol, node) -> NACKs
        self._connected: dict[str, int] = {}                  # protocol -> open ADS streams
        self._versions: dict[str, int] = {}                   # proxy (Envoy) version -> open streams
        self.changed_at = 0.0                                 # when the config being pushed was applied
        self.config_applied = Counter("xds_config_applied", "change sets applied", registry=registry)
        self.config_rejected = Counter("xds_config_rejected", "change sets rejected whole", registry=registry)
        self.last_rejected = Gauge("xds_config_last_rejected_timestamp_seconds",
                                   "when the last change set was rejected whole (Unix seconds; 0: never)",
                                   registry=registry)
        self.last_applied = Gauge("xds_config_last_applied_timestamp_seconds",
                                  "when the config being served was applied (Unix seconds; 0: none yet)",
                                  registry=registry)
        self.rejected_errors = Gauge("xds_config_rejected_errors",
                                     "errors of the last rejected change set while it is the latest word on "
                                     "the directory (0 once a change set is applied)", registry=registry)
        self.translate_seconds = Histogram("xds_translate_duration_seconds",
                                           "translating one change set for all node shapes",
                                           buckets=TRANSLATE_BUCKETS_S, registry=registry)
        self.convergence = Histogram("pilot_proxy_convergence_time",
                                     "Delay in seconds between config change and a proxy receiving all "
                                     "required configuration.", buckets=CONVERGENCE_BUCKETS_S, registry=registry)
        registry.register(_Tallies(self))

    # -- what the server and the ADS streams call --------------------------------
    def count_push(self, type_name: str, protocol: str, resources: int, size: int) -> None:
        """One response sent (the ADS loop's thread only)."""
        tally = self._pushes.get((type_name, protocol))
        if tally is None:
            tally = self._pushes[(type_name, protocol)] = [0, 0, 0]
        tally[0] += 1
        tally[1] += resources
        tally[2] += size

    def nacked(self, type_name: str, protocol: str, node: str) -> None:
        key = (type_name, protocol, node)
        self._nacks[key] = self._nacks.get(key, 0) + 1

    def connected(self, protocol: str, version: str, delta: int) -> None:
        self._connected[protocol] = self._connected.get(protocol, 0) + delta
        self._versions[version] = self._versions.get(version, 0) + delta
        if not self._versions[version]:
            del self._versions[version]

    def pushed_change(self) -> None:
        """A proxy was sent what a config change gave it: istiod's convergence time."""
        if self.changed_at:
            self.convergence.observe(max(0.0, time.time() - self.changed_at))

    def applied(self, seconds: float) -> None:
        self.translate_seconds.observe(seconds)
        self.config_applied.inc()
        self.changed_at = time.time()
        self.last_applied.set(self.changed_at)
        self.rejected_errors.set(0)

    def rejected(self, errors: int) -> None:
        self.config_rejected.inc()
        self.last_rejected.set(time.time())
        self.rejected_errors.set(errors)

    def proxy_versions(self) -> dict[str, int]:
        return dict(self._versions)


class _Tallies:
    """The tallies above as Prometheus families, built when /metrics is read."""

    def __init__(self, m: Metrics):
        self.m = m

    def describe(self):
        return []

    def collect(self):
        m = self.m
        pushes = list(m._pushes.items())
        for i, (name, doc) in enumerate((("xds_pushes", "xDS responses sent"),
                                         ("xds_pushed_resources", "resources in xDS responses"),
                                         ("xds_push_bytes", "bytes of xDS responses"))):
            fam = CounterMetricFamily(name, doc, labels=["type", "protocol"])
            for (t, p), tally in pushes:
                fam.add_metric([t, p], tally[i])
            yield fam
        nacks = CounterMetricFamily("xds_nacks", "responses a proxy rejected (NACK), by type and node",
                                    labels=["type", "protocol", "node"])
        for (t, p, n), count in list(m._nacks.items()):
            nacks.add_metric([t, p, n], count)
        yield nacks
        connected = GaugeMetricFamily("xds_connected_proxies", "open ADS streams", labels=["protocol"])
        for p, n in list(m._connected.items()):
            connected.add_metric([p], n)
        yield connected
        # istiod's names (see Metrics); counters as istiod writes them, without `_total`.
        xds = GaugeMetricFamily("pilot_xds", "Number of endpoints connected to this pilot using XDS.",
                                labels=["version"])
        for v, n in list(m._versions.items()):
            xds.add_metric([v], n)
        yield xds
        by_type: dict[str, int] = {}
        for (t, _p), tally in pushes:
            by_type[t] = by_type.get(t, 0) + tally[0]
        yield _istio_counter("pilot_xds_pushes", "Pilot build and send errors for lds, rds, cds and eds.", by_type)
        rejects: dict[str, int] = {}
        for (t, _p, _n), count in list(m._nacks.items()):
            rejects[t] = rejects.get(t, 0) + count
        yield _istio_counter("pilot_total_xds_rejects", "Total number of XDS responses from pilot rejected by proxy.",
                             rejects)


def _istio_counter(name: str, doc: str, by_type: dict[str, int]):
    return exact_counter(name, doc, [({"type": PILOT_TYPES.get(t, t.lower())}, n) for t, n in sorted(by_type.items())])


class Telemetry:
    """Metrics into a private registry, spans into a ring.

    The server takes one (and hands it to the ADS hub and the admin app);
    `default()` is the process's, which the snapshot cache still reaches through
    `metrics()` / `tracer()`, and which the server uses unless given another;
    the server hands its tracer to its Translator, so that /debug/tracez shows
    translate and push spans side by side.
    """

    def __init__(self):
        prometheus_client.disable_created_metrics()     # no *_created series beside each counter
        self.registry = CollectorRegistry()
        self.metrics = Metrics(self.registry)
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
