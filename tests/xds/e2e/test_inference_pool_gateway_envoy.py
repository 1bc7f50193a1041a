"""InferencePool through the control plane: a Gateway API Gateway and HTTPRoute
send to InferencePools; `mcpctl xds serve` translates them as istiod does (the
pool's shadow cluster with the override_host policy, ext_proc to the pool's
endpoint picker enabled on those routes only) and a real Envoy, fed over ADS,
asks a real `mcpctl epp serve` and goes where it picked.

The model servers are echo upstreams on their own loopback addresses
(127.0.0.2-4, one port, as Pods), reporting load on /metrics in the
GIE model-server names, declared as a Deployment whose replicas get those
addresses (mcp-mesh.io/addresses); the picker is a Service with Endpoints.
Three pools select them: `decoders` (the live picker), `decoders-open` and
`decoders-closed` (a picker Service whose endpoint nothing listens on,
FailOpen and FailClose)."""
import json
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from concurrent import futures

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import json_format

from harness.endpoint_picker import PickerProcess
from mcp26.demo.stack.ports import free_port, port_free_on_all
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.demo.stack.control_plane import ControlPlane, mesh_envoy
from mcp26.mesh import endpoint_picker as epp

pytestmark = pytest.mark.e2e

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
NODE = "router~127.0.0.1~inference-gateway.inference~inference.svc.cluster.local"
LABELS = {"gateway.networking.k8s.io/gateway-name": "inference-gateway"}
IDLE = {"vllm:num_requests_waiting": 0, "vllm:num_requests_running": 0, "vllm:kv_cache_usage_perc": 0.1}

def config_yaml(gateway_port: int, port: int, picker_port: int, dead_port: int, plain_port: int) -> str:
    docs = [f"""apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: inference-gateway, namespace: inference}}
spec:
  gatewayClassName: istio
  listeners:
  - {{name: http, port: {gateway_port}, protocol: HTTP}}
""", """apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: llm, namespace: inference}
spec:
  parentRefs: [{name: inference-gateway}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /v1}}]
    backendRefs: [{group: inference.networking.k8s.io, kind: InferencePool, name: decoders}]
  - matches: [{path: {type: PathPrefix, value: /open}}]
    backendRefs: [{group: inference.networking.k8s.io, kind: InferencePool, name: decoders-open}]
  - matches: [{path: {type: PathPrefix, value: /closed}}]
    backendRefs: [{group: inference.networking.k8s.io, kind: InferencePool, name: decoders-closed}]
  - matches: [{path: {type: PathPrefix, value: /mixed}}]
    backendRefs:
    - {group: inference.networking.k8s.io, kind: InferencePool, name: decoders, weight: 1}
    - {name: plain, port: 80, weight: 1}
  - matches: [{path: {type: PathPrefix, value: /plain}}]
    backendRefs: [{name: plain, port: 80}]
""", f"""apiVersion: apps/v1
kind: Deployment
metadata: {{name: decoder, namespace: inference}}
spec:
  replicas: 3
  selector: {{matchLabels: {{app: decoder}}}}
  template:
    metadata:
      labels: {{app: decoder}}
      annotations: {{mcp-mesh.io/addresses: "{','.join(HOSTS)}"}}
    spec:
      containers: [{{name: server, image: mcp-mesh}}]
"""]
    for name, picker, mode in (("decoders", "epp", "FailClose"), ("decoders-open", "epp-down", "FailOpen"),
                               ("decoders-closed", "epp-down", "FailClose")):
        docs.append(f"""apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata:
  name: {name}
  namespace: inference
  # decoders: the response headers reach the picker too (the served endpoint after a retry)
  annotations: {{mcp-mesh.io/endpoint-picker-mode: {"answer" if name == "decoders" else "lean"}}}
spec:
  selector: {{matchLabels: {{app: decoder}}}}
  targetPorts: [{{number: {port}}}]
  endpointPickerRef: {{name: {picker}, port: {{number: 9002}}, failureMode: {mode}}}
""")
    for name, service_port, target, port_name in (("epp", 9002, picker_port, "grpc-ext-proc"),
                                                   ("epp-down", 9002, dead_port, "grpc-ext-proc"),
                                                   ("plain", 80, plain_port, "http")):
        app = ", appProtocol: http2" if name != "plain" else ""
        docs.append(f"""apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: inference}}
spec:
  ports: [{{name: {port_name}, port: {service_port}{app}}}]
""")
        docs.append(f"""apiVersion: v1
kind: Endpoints
metadata: {{name: {name}, namespace: inference}}
subsets:
- addresses: [{{ip: 127.0.0.1}}]
  ports: [{{name: {port_name}, port: {target}}}]
""")
    return "---\n".join(docs)


class Picker(PickerProcess):
    """`mcpctl epp serve` for inference/decoders on the directory the control plane watches."""

    def __init__(self, directory: str, port: int):
        super().__init__(directory, "--metrics-interval-ms", "20", grpc_port=port)

    def wait_loads(self, predicate, timeout=5.0) -> dict:
        return self.wait(lambda s: len(s["endpoints"]) == len(HOSTS) and predicate(s["endpoints"]), timeout)


def request(port: int, path: str, body: dict | None = None, headers: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="POST" if data else "GET",
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, None


@pytest.fixture(scope="module")
def stack():
    port = port_free_on_all(HOSTS)
    picker_port, dead_port, gateway_port = free_port(), free_port(), free_port()
    replicas = {h: EchoUpstream(f"replica-{h}", port=port, host=h) for h in HOSTS}
    for u in replicas.values():
        u.metrics = dict(IDLE)
        u.start()
    plain = EchoUpstream("plain").start()
    directory = tempfile.mkdtemp(prefix="inference-pool-xds-")
    with open(os.path.join(directory, "inference.yaml"), "w") as f:
        f.write(config_yaml(gateway_port, port, picker_port, dead_port, plain.port))
    picker = Picker(directory, picker_port)
    try:
        with ControlPlane(directory) as cp:
            assert cp.configz().get("rejected") is None, cp.configz()
            with mesh_envoy(cp, node_id=NODE, namespace="inference", labels=LABELS) as envoy:
                cp.wait_synced(NODE, types=("CDS", "EDS", "LDS", "RDS"))
                picker.wait_loads(lambda eps: all(e["ready"] for e in eps.values()))
                deadline = time.monotonic() + 20
                while request(gateway_port, "/plain")[0] != 200:
                    assert time.monotonic() < deadline, cp.log_tail()
                    time.sleep(0.1)
                yield gateway_port, picker, replicas, plain, port, envoy
    finally:
        picker.stop()
        for u in (*replicas.values(), plain):
            u.stop()
        shutil.rmtree(directory, ignore_errors=True)


def _idle(picker, replicas):
    for u in replicas.values():
        u.metrics, u.status = dict(IDLE), 200
    picker.wait_loads(lambda eps: all(e["waiting"] == 0 for e in eps.values()))


def test_envoy_took_the_pool_cluster_and_the_disabled_ext_proc_filter(stack):
    *_, envoy = stack
    clusters = json.dumps(envoy.config_dump("dynamic_active_clusters"))
    assert "envoy.load_balancing_policies.override_host" in clusters
    assert "x-gateway-destination-endpoint-served" in clusters        # selected_host_key, which Envoy 1.40 knows
    listeners = json.dumps(envoy.config_dump("dynamic_listeners"))
    assert "envoy.filters.http.ext_proc" in listeners


def test_the_replica_that_answers_is_the_one_the_picker_picked(stack):
    gateway_port, picker, replicas, _, port, _ = stack
    *busy, idle = HOSTS
    try:
        for h in busy:
            replicas[h].metrics = {**IDLE, "vllm:num_requests_waiting": 4}
        picker.wait_loads(lambda eps: all(eps[f"{h}:{port}"]["waiting"] == 4 for h in busy))
        before = picker.stats()["decisions"]
        for i in range(6):
            status, seen = request(gateway_port, "/v1/completions", {"model": "tiny", "prompt": f"hello {i}"})
            assert status == 200, seen
            picked = epp.parse_endpoints(seen["headers"][epp.DESTINATION_ENDPOINT])
            assert picked[0] == f"{idle}:{port}"                           # the picker chose the idle replica
            assert seen["upstream"] == f"replica-{idle}"                   # and Envoy went there
            assert seen["headers"]["x-gateway-model-name"] == "tiny"       # the buffered body reached the picker
        assert picker.stats()["decisions"] - before == 6
    finally:
        _idle(picker, replicas)


def test_a_shared_system_prompt_sticks_to_one_replica(stack):
    gateway_port, *_ = stack
    system = "You are the support assistant of an online shop. Answer briefly and politely. " * 4
    answered = {request(gateway_port, "/v1/chat/completions", {"model": "tiny", "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": f"Question {i}: where is my order?"}]}
    )[1]["upstream"] for i in range(6)}
    assert len(answered) == 1, answered


def test_a_retry_walks_the_fallback_list(stack):
    """The picker ranks failing < fallback < last; `failing` answers 503. Every retry goes to
    the next endpoint of the list (round robin with previous_hosts would pick `last` half the time)."""
    gateway_port, picker, replicas, _, port, _ = stack
    failing, fallback, last = HOSTS
    try:
        replicas[fallback].metrics = {**IDLE, "vllm:num_requests_waiting": 1}
        replicas[last].metrics = {**IDLE, "vllm:num_requests_waiting": 3}
        picker.wait_loads(lambda eps: eps[f"{fallback}:{port}"]["waiting"] == 1
                          and eps[f"{last}:{port}"]["waiting"] == 3)
        replicas[failing].status = 503
        before, before_last = len(replicas[failing].requests), len(replicas[last].requests)
        for i in range(6):
            status, seen = request(gateway_port, "/v1/completions", {"model": "tiny", "prompt": f"retry {i}"})
            assert status == 200
            assert epp.parse_endpoints(seen["headers"][epp.DESTINATION_ENDPOINT]) == [
                f"{h}:{port}" for h in (failing, fallback, last)]
            assert seen["upstream"] == f"replica-{fallback}"      # the retry took the next endpoint of the list
        assert len(replicas[failing].requests) == before + 6      # after the first one failed, each time
        assert len(replicas[last].requests) == before_last
    finally:
        _idle(picker, replicas)


def test_picker_down_fail_open_routes_anyway_and_fail_close_refuses(stack):
    gateway_port, _, replicas, *_ = stack
    before = sum(len(u.requests) for u in replicas.values())
    status, seen = request(gateway_port, "/open/completions", {"model": "tiny", "prompt": "x"})
    assert status == 200 and seen["upstream"].startswith("replica-")
    assert epp.DESTINATION_ENDPOINT not in seen["headers"]          # nothing picked: round robin chose
    status, _ = request(gateway_port, "/closed/completions", {"model": "tiny", "prompt": "x"})
    assert status >= 500
    assert sum(len(u.requests) for u in replicas.values()) == before + 1   # only the FailOpen one reached a replica


def test_only_routes_to_a_pool_ask_the_picker(stack):
    gateway_port, picker, *_ = stack
    before = picker.stats()["decisions"]
    status, seen = request(gateway_port, "/plain", {"prompt": "x"})
    assert status == 200 and seen["upstream"] == "plain"
    assert epp.DESTINATION_ENDPOINT not in seen["headers"]
    assert picker.stats()["decisions"] == before
    # A rule split between the pool and a Service: the picker runs exactly for the pool's share.
    upstreams = []
    for i in range(20):
        status, seen = request(gateway_port, "/mixed", {"model": "tiny", "prompt": f"m{i}"})
        assert status == 200
        upstreams.append(seen["upstream"])
        assert (epp.DESTINATION_ENDPOINT in seen["headers"]) == seen["upstream"].startswith("replica-")
    to_pool = sum(u.startswith("replica-") for u in upstreams)
    assert 0 < to_pool < 20, upstreams
    assert picker.stats()["decisions"] - before == to_pool


class RecordingPicker(pb_grpc.ExternalProcessorServicer):
    """A stand-in picker that picks `pick` for every request and records the metadata
    Envoy forwards with the request and response headers."""

    def __init__(self, pick: str):
        self.pick, self.seen = pick, []

    def Process(self, requests, context):
        for req in requests:
            kind = req.WhichOneof("request")
            self.seen.append((kind, json_format.MessageToDict(req.metadata_context)))
            out = pb.ProcessingResponse()
            if kind == "request_headers":
                out.request_headers.response.SetInParent()
                out.dynamic_metadata.update({epp.DESTINATION_NAMESPACE: {epp.DESTINATION_ENDPOINT: self.pick}})
            elif kind == "response_headers":
                out.response_headers.SetInParent()
            else:
                getattr(out, kind).SetInParent()
            yield out


def test_the_picker_hears_where_a_retried_request_ran():
    """override_host's selected_host_key, forwarded by ext_proc with the response headers:
    the first endpoint answers 503, the retry's endpoint is reported served."""
    port = port_free_on_all(HOSTS)
    replicas = [EchoUpstream(f"replica-{h}", port=port, host=h).start() for h in HOSTS]
    replicas[0].status = 503
    plain = EchoUpstream("plain").start()
    recorder = RecordingPicker(",".join(f"{h}:{port}" for h in HOSTS))
    server = grpc.server(futures.ThreadPoolExecutor(4))
    pb_grpc.add_ExternalProcessorServicer_to_server(recorder, server)
    picker_port = free_port()
    server.add_insecure_port(f"127.0.0.1:{picker_port}")
    server.start()
    directory, gateway_port = tempfile.mkdtemp(prefix="inference-pool-served-"), free_port()
    with open(os.path.join(directory, "inference.yaml"), "w") as f:
        f.write(config_yaml(gateway_port, port, picker_port, free_port(), plain.port))
    try:
        with ControlPlane(directory) as cp, mesh_envoy(cp, node_id=NODE, namespace="inference", labels=LABELS):
            cp.wait_synced(NODE, types=("CDS", "EDS", "LDS", "RDS"))
            deadline = time.monotonic() + 20
            while (status := request(gateway_port, "/v1/models"))[0] != 200:
                assert time.monotonic() < deadline, status
                time.sleep(0.1)
            assert status[1]["upstream"] == f"replica-{HOSTS[1]}"
        response = [md for kind, md in recorder.seen if kind == "response_headers"][-1]
        assert response["filterMetadata"][epp.DESTINATION_NAMESPACE][epp.SERVED_KEY] == f"{HOSTS[1]}:{port}"
    finally:
        server.stop(0)
        for u in (*replicas, plain):
            u.stop()
        shutil.rmtree(directory, ignore_errors=True)
