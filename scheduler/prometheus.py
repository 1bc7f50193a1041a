"""The Endpoint Picker's /metrics under the upstream picker's names, so that the Gateway
API Inference Extension's dashboards read this picker (kubernetes-sigs/
gateway-api-inference-extension pkg/epp/metrics/metrics.go; each label as there):

inference_pool_ready_pods{name}                      endpoints whose load is fresh
inference_pool_average_kv_cache_utilization{name}    mean KV-cache utilisation of those (0-1)
inference_pool_average_queue_size{name}              mean waiting requests
inference_pool_average_running_requests{name}        mean running requests
inference_pool_per_pod_queue_size{name,model_server_pod}  each endpoint's waiting requests
inference_objective_request_total{model_name,target_model_name}  requests picked for
inference_objective_request_error_total{model_name,target_model_name,error_code}  refused
inference_extension_scheduler_e2e_duration_seconds   one decision (upstream's buckets)

`model_name` is the body's `model`, which a client chooses: past MAX_MODEL_SERIES distinct
names, further ones are counted as "_other", so no client can grow the scrape without bound.
The values are read from the PickerState when /metrics is scraped; the decisions'
histogram is observed as they happen (one observe, ~1 us, against ~60 us a decision).
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

MAX_MODEL_SERIES = 64
OTHER_MODEL = "_other"
# upstream's error codes (pkg/epp/util/error) for the picker's two refusals
ERROR_CODES = {429: "InferencePoolResourceExhausted", 503: "ServiceUnavailable"}
SCHEDULER_BUCKETS_S = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)


class PickerMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests: dict[str, int] = {}                 # model -> picked
        self.errors: dict[tuple[str, str], int] = {}       # (model, error code) -> refused
        self.decision = Histogram("inference_extension_scheduler_e2e_duration_seconds",
                                  "End-to-end scheduling latency distribution in seconds.",
                                  buckets=SCHEDULER_BUCKETS_S, registry=self.registry)
        self.state = None
        self.registry.register(_PoolCollector(self))

    def model_label(self, model: str | None) -> str:
        name = model or ""
        if name in self.requests or any(name == m for m, _ in self.errors):
            return name
        seen = {*self.requests, *(m for m, _ in self.errors)}
        return name if len(seen) < MAX_MODEL_SERIES else OTHER_MODEL

    def decided(self, model: str | None, refused_status: int | None, seconds: float) -> None:
        self.decision.observe(seconds)
        name = self.model_label(model)
        if refused_status is None:
            self.requests[name] = self.requests.get(name, 0) + 1
        else:
            key = (name, ERROR_CODES.get(refused_status, str(refused_status)))
            self.errors[key] = self.errors.get(key, 0) + 1

    def attach(self, state) -> "PickerMetrics":
        """Read the pool and its loads from `state` (server.PickerState) on each scrape."""
        self.state = state
        return self

    def text(self) -> bytes:
        return generate_latest(self.registry)


class _PoolCollector:
    def __init__(self, metrics: PickerMetrics):
        self.metrics = metrics

    def describe(self):
        return []

    def collect(self):
        m = self.metrics
        view = m.state.view() if m.state is not None else None
        pool = view.pool.name if view is not None else ""
        loads = {k: l for k, l in (m.state.loads().items() if m.state is not None else ()) if l.ready}
        n = len(loads)
        gauges = [("inference_pool_ready_pods", "The number of ready pods in the inference server pool.", n),
                  ("inference_pool_average_kv_cache_utilization", "The average kv cache utilization for an "
                   "inference server pool.", sum(l.kv_utilisation for l in loads.values()) / n if n else 0.0),
                  ("inference_pool_average_queue_size", "The average number of requests pending in the model "
                   "server queue.", sum(l.waiting for l in loads.values()) / n if n else 0.0),
                  ("inference_pool_average_running_requests", "The average number of running requests across "
                   "model servers in the pool.", sum(l.running for l in loads.values()) / n if n else 0.0)]
        for name, doc, value in gauges:
            g = GaugeMetricFamily(name, doc, labels=["name"])
            if view is not None:
                g.add_metric([pool], value)
            yield g
        per_pod = GaugeMetricFamily("inference_pool_per_pod_queue_size", "The total number of requests pending "
                                    "in the model server queue for each underlying pod.",
                                    labels=["name", "model_server_pod"])
        for endpoint, load in sorted(loads.items()):
            per_pod.add_metric([pool, endpoint], load.waiting)
        yield per_pod
        requests = CounterMetricFamily("inference_objective_request", "Counter of inference objective requests "
                                       "broken out for each model and target model.",
                                       labels=["model_name", "target_model_name"])
        for model, count in sorted(m.requests.items()):
            requests.add_metric([model, model], count)       # no model rewrite here: target = requested
        yield requests
        errors = CounterMetricFamily("inference_objective_request_error", "Counter of inference objective "
                                     "requests errors broken out for each model and target model.",
                                     labels=["model_name", "target_model_name", "error_code"])
        for (model, code), count in sorted(m.errors.items()):
            errors.add_metric([model, model, code], count)
        yield errors
