"""The Endpoint Picker (`mcpctl epp serve`) as a real process: the Gateway API
Inference Extension protocol rule by rule over a raw ext_proc stream, then
through a real Envoy whose override_host cluster routes to whatever it picked.

Model servers are echo upstreams on their own loopback addresses (127.0.0.2,
127.0.0.3: one address per replica, the same port, as Pods have) reporting
load on /metrics in the GIE model-server protocol's names; the test sets that
load and observes where requests go."""
import json
import os
import tempfile
import urllib.request

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mcp26.demo.stack.envoy import Envoy
from harness.inference_gateway import gateway_bootstrap
from harness.endpoint_picker import PickerProcess, headers_request, pool_yaml
from mcp26.demo.stack.ports import free_port, port_free_on_all
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.mesh import endpoint_picker as epp

pytestmark = pytest.mark.e2e

HOSTS = ("127.0.0.2", "127.0.0.3")
IDLE = {"vllm:num_requests_waiting": 0, "vllm:num_requests_running": 0, "vllm:kv_cache_usage_perc": 0.1}


def _config(directory: str, port: int, picker_port: int) -> None:
    objective = """apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: batch-jobs, namespace: inference}
spec: {priority: -1, poolRef: {name: decoders}}
"""
    with open(os.path.join(directory, "pool.yaml"), "w") as f:
        f.write(pool_yaml(port, HOSTS, picker_port) + "---\n" + objective)


class Picker(PickerProcess):
    """The picker, and a raw ext_proc stub to talk the protocol to it."""

    def __init__(self, directory: str):
        super().__init__(directory, "--metrics-interval-ms", "20")
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = pb_grpc.ExternalProcessorStub(self.channel)

    def wait_loads(self, predicate, timeout=5.0) -> dict:
        return self.wait(lambda s: predicate(s["endpoints"]), timeout)

    def stop(self):
        self.channel.close()
        super().stop()


@pytest.fixture(scope="module")
def pool():
    port = port_free_on_all(HOSTS)
    ups = {h: EchoUpstream(f"replica-{h}", port=port, host=h) for h in HOSTS}
    for u in ups.values():
        u.metrics = dict(IDLE)
        u.start()
    directory = tempfile.mkdtemp(prefix="epp-")
    _config(directory, port, 9002)
    picker = Picker(directory)
    try:
        picker.wait_loads(lambda eps: len(eps) == 2 and all(e["ready"] for e in eps.values()))
        yield picker, ups, port
    finally:
        picker.stop()
        for u in ups.values():
            u.stop()


def _idle(ups):
    for u in ups.values():
        u.metrics = dict(IDLE)


def _converse(picker, headers: dict, body: bytes | None = None, subset=None) -> list[pb.ProcessingResponse]:
    msgs = [headers_request({":method": "POST" if body else "GET", ":path": "/v1/completions", **headers},
                             body is None, subset)]
    if body is not None:
        msgs.append(pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)))
    return list(picker.stub.Process(iter(msgs), timeout=5))


def _picked(response: pb.ProcessingResponse) -> tuple[str, str]:
    """(header value, metadata value) of a pick."""
    common = getattr(response, response.WhichOneof("response")).response
    header = {o.header.key: o.header.raw_value.decode() for o in common.header_mutation.set_headers}
    meta = response.dynamic_metadata.fields[epp.DESTINATION_NAMESPACE].struct_value.fields
    return header[epp.DESTINATION_ENDPOINT], meta[epp.DESTINATION_ENDPOINT].string_value


def test_health_services_of_the_protocol_are_serving(pool):
    picker, _, _ = pool
    stub = health_pb2_grpc.HealthStub(picker.channel)
    for name in epp.HEALTH_SERVICES:
        assert stub.Check(health_pb2.HealthCheckRequest(service=name)).status == health_pb2.HealthCheckResponse.SERVING


def test_the_startup_heap_is_frozen_and_gc_pauses_are_reported(pool):
    """Out of the cyclic collector's sight once serving (serving/gc_pauses.py): /stats reads the
    frozen count and the pauses since, by generation, as the process measured them."""
    picker, _, _ = pool
    # Traffic until a young collection of its own: one starts when tracked allocations outrun
    # frees by 700, and a request's objects are mostly freed by reference counting, so how
    # many requests that takes varies (200 were enough in one run, not in another).
    for n in range(1, 41):
        for _ in range(100):
            _converse(picker, {})
        gc = picker.stats()["gc"]
        if gc["pauses"]["0"]["count"]:
            break
    assert gc["frozen_objects"] > 20_000, gc     # the imports alone are ~45,000 objects
    assert gc["pauses"]["0"]["count"] > 0 and gc["pauses"]["0"]["seconds"] > 0, (n * 100, gc)


def test_a_pick_is_the_same_in_the_header_and_in_envoy_lb_metadata_with_fallbacks(pool):
    picker, _, port = pool
    (resp,) = _converse(picker, {})
    header, meta = _picked(resp)
    assert header == meta
    endpoints = epp.parse_endpoints(header)
    assert sorted(endpoints) == sorted(f"{h}:{port}" for h in HOSTS)     # the pick, then the fallback


def test_with_a_body_the_pick_answers_the_body_and_names_the_model(pool):
    picker, _, _ = pool
    body = json.dumps({"model": "tiny", "prompt": "hello"}).encode()
    first, second = _converse(picker, {}, body)
    assert first.WhichOneof("response") == "request_headers"            # headers: go on, send the body
    assert not first.request_headers.response.header_mutation.set_headers
    assert second.WhichOneof("response") == "request_body"
    header, meta = _picked(second)
    sets = {o.header.key: o.header.raw_value.decode() for o in second.request_body.response.header_mutation.set_headers}
    assert header == meta and sets["x-gateway-model-name"] == "tiny"


def test_the_subset_hint_is_honoured_and_an_empty_or_unknown_subset_is_503(pool):
    picker, _, port = pool
    only = f"{HOSTS[1]}:{port}"
    for _ in range(4):
        (resp,) = _converse(picker, {}, subset=[only])
        assert epp.parse_endpoints(_picked(resp)[0]) == [only]
    for subset in ([], ["10.1.2.3:80"]):
        (resp,) = _converse(picker, {}, subset=subset)
        assert resp.WhichOneof("response") == "immediate_response"
        assert resp.immediate_response.status.code == 503


def test_a_saturated_pool_sheds_the_sheddable_objective_with_429_and_serves_the_rest(pool):
    picker, ups, _ = pool
    try:
        for u in ups.values():
            u.metrics = {**IDLE, "vllm:num_requests_waiting": 9}
        picker.wait_loads(lambda eps: all(e["waiting"] == 9 for e in eps.values()))
        (shed,) = _converse(picker, {epp.OBJECTIVE_HEADER: "batch-jobs"})
        assert shed.immediate_response.status.code == 429
        _, resp = _converse(picker, {}, json.dumps({"model": "batch-jobs", "prompt": "x"}).encode())
        assert resp.immediate_response.status.code == 429                   # the body's model names the objective
        (served,) = _converse(picker, {})
        assert _picked(served)[0]
    finally:
        _idle(ups)
        picker.wait_loads(lambda eps: all(e["waiting"] == 0 for e in eps.values()))


def _scrape(picker) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{picker.admin}/metrics", timeout=5) as r:
        return r.read().decode()


def _sample(text: str, line_start: str) -> float | None:
    found = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start)]
    return found[0] if found else None


def test_metrics_in_the_upstream_pickers_names(pool):
    """/metrics as kubernetes-sigs/gateway-api-inference-extension pkg/epp/metrics names it."""
    picker, ups, port = pool
    before = _scrape(picker)
    picked0 = _sample(before, 'inference_objective_request_total{model_name="tiny",target_model_name="tiny"}') or 0
    _converse(picker, {}, json.dumps({"model": "tiny", "prompt": "hello"}).encode())
    try:
        for u in ups.values():
            u.metrics = {**IDLE, "vllm:num_requests_waiting": 9, "vllm:kv_cache_usage_perc": 0.5}
        picker.wait_loads(lambda eps: all(e["waiting"] == 9 for e in eps.values()))
        _, shed = _converse(picker, {}, json.dumps({"model": "batch-jobs", "prompt": "x"}).encode())
        assert shed.immediate_response.status.code == 429
        text = _scrape(picker)
    finally:
        _idle(ups)
        picker.wait_loads(lambda eps: all(e["waiting"] == 0 for e in eps.values()))
    assert _sample(text, 'inference_pool_ready_pods{name="decoders"}') == 2
    assert _sample(text, 'inference_pool_average_kv_cache_utilization{name="decoders"}') == 0.5
    assert _sample(text, 'inference_pool_average_queue_size{name="decoders"}') == 9
    assert _sample(text, f'inference_pool_per_pod_queue_size{{model_server_pod="{HOSTS[0]}:{port}",name="decoders"}}') == 9
    assert _sample(text, 'inference_objective_request_total{model_name="tiny",target_model_name="tiny"}') == picked0 + 1
    assert _sample(text, 'inference_objective_request_error_total{error_code="InferencePoolResourceExhausted",'
                         'model_name="batch-jobs",target_model_name="batch-jobs"}') >= 1
    assert _sample(text, "inference_extension_scheduler_e2e_duration_seconds_count") >= 2


def test_the_least_loaded_replica_gets_the_request(pool):
    picker, ups, port = pool
    try:
        ups[HOSTS[0]].metrics = {**IDLE, "vllm:num_requests_waiting": 4}
        picker.wait_loads(lambda eps: eps[f"{HOSTS[0]}:{port}"]["waiting"] == 4)
        for _ in range(3):
            (resp,) = _converse(picker, {})
            assert epp.parse_endpoints(_picked(resp)[0])[0] == f"{HOSTS[1]}:{port}"
    finally:
        _idle(ups)
        picker.wait_loads(lambda eps: all(e["waiting"] == 0 for e in eps.values()))


def test_through_envoy_the_replica_that_answers_is_the_one_picked_and_prefixes_stick(pool):
    picker, ups, port = pool
    gw = free_port()
    envoy = Envoy(gateway_bootstrap({gw: False}, [(h, port) for h in HOSTS], picker.port)).start()
    try:
        system = "You are the support assistant of an online shop. Answer briefly and politely. " * 4
        answered = []
        for i in range(8):
            body = json.dumps({"model": "tiny", "prompt": system + f"Question {i}: where is my order?"}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{gw}/v1/completions", data=body, method="POST",
                                         headers={"content-type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as r:
                seen = json.load(r)
            picked = epp.parse_endpoints(seen["headers"][epp.DESTINATION_ENDPOINT])[0]
            assert seen["upstream"] == f"replica-{picked.split(':')[0]}"     # Envoy went where the picker said
            assert seen["headers"]["x-gateway-model-name"] == "tiny"
            answered.append(seen["upstream"])
        assert len(set(answered)) == 1, answered                            # one shared prefix, one replica
        assert picker.stats()["prefix_hit_rate"] > 0.5
    finally:
        envoy.stop()


def test_picker_down_fail_open_routes_anyway_and_fail_close_refuses():
    port = port_free_on_all(HOSTS)
    ups = [EchoUpstream(f"replica-{h}", port=port, host=h).start() for h in HOSTS]
    open_port, close_port, dead = free_port(), free_port(), free_port()
    envoy = Envoy(gateway_bootstrap({open_port: True, close_port: False}, [(h, port) for h in HOSTS], dead)).start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{open_port}/v1/models", timeout=10) as r:
            assert r.status == 200 and json.load(r)["upstream"].startswith("replica-")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{close_port}/v1/models", timeout=10)
        assert e.value.code >= 500
        assert sum(len(u.requests) for u in ups) == 1             # only the fail-open request reached a replica
    finally:
        envoy.stop()
        for u in ups:
            u.stop()
