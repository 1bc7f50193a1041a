"""Priority queues under load, queue policies (full, timeout) and the L6 session check,
against live `mcpctl serve` processes."""
from __future__ import annotations

import concurrent.futures
import json
import queue
import re
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from mcp26.mesh import headers as H
from mcp26.mesh.qos import QosClass
from mcp26.mesh.session import sign_headers
from mcp26.demo.stack.inference_server import InferenceServer

pytestmark = pytest.mark.e2e


def _input(seed: int):
    x = np.random.default_rng(seed).standard_normal((1, 64)).astype(np.float32)
    inp = tgrpc.InferInput("INPUT0", [1, 64], "FP32")
    inp.set_data_from_numpy(x)
    return inp


def _wait_queued(server: InferenceServer, at_least: int, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, status = server.admin("/admin/status")
        depth = sum(status["models"][0]["queue_depth"].values())
        if depth >= at_least:
            return depth
        time.sleep(0.002)
    raise AssertionError(f"queue never reached {at_least}")


LOWS = 120


def test_high_priority_overtakes_queued_low_priority():
    """max batch 1 and a backlog of batch-class requests: latency-critical requests,
    sent after them (by the mesh header or by the protocol's priority parameter),
    are answered before most of that backlog."""
    with InferenceServer("builtin:mlp", "--max-batch", "1", "--qos-policy", "throughput") as server:
        client = tgrpc.InferenceServerClient(server.grpc)
        done: queue.Queue = queue.Queue()

        def send(tag, seed, **kw):
            client.async_infer("mlp", [_input(seed)], request_id=tag,
                               callback=lambda result, error: done.put((tag, result, error, time.monotonic())), **kw)

        # More lows than the wait needs: on a busy machine the server may drain them
        # almost as fast as this client sends, and the backlog must still pass 25.
        for i in range(LOWS):
            send(f"low{i}", i, headers={H.QOS_CLASS: QosClass.BATCH.header_value})
        _wait_queued(server, 25)
        for i in range(3):
            send(f"high{i}", 100 + i, headers={H.QOS_CLASS: QosClass.LATENCY_CRITICAL.header_value})
        for i in range(3, 5):
            send(f"high{i}", 100 + i, priority=1)
        order, queue_us = [], {}
        for _ in range(LOWS + 5):
            tag, result, error, _ = done.get(timeout=60)
            assert error is None, error
            order.append(tag)
            params = result.get_response().parameters
            queue_us[tag] = params["queue_time_us"].uint64_param
            assert params["priority_level"].uint64_param == (1 if tag.startswith("high") else 4)
        client.close()
    last_high = max(order.index(f"high{i}") for i in range(5))
    lows_after = [t for t in order[last_high:] if t.startswith("low")]
    # All low requests were sent first; at least 25 were queued when the
    # high ones arrived, so honest FIFO would finish >= 25 lows before them.
    assert len(lows_after) >= 15, order
    high_wait = max(queue_us[f"high{i}"] for i in range(5))
    low_wait = sorted(queue_us[f"low{i}"] for i in range(LOWS))[LOWS // 2]
    assert high_wait < low_wait, (high_wait, low_wait)


POLICY = """
apiVersion: scheduling.mcp-mesh.io/v1alpha1
kind: L7SchedulingPolicy
metadata:
  name: overload-test
spec:
  qosPolicy: throughput
  maxBatchSize: 1
  queuePolicies:
    2:
      maxQueueSize: 3
    4:
      defaultTimeoutMicroseconds: 5000
      timeoutAction: REJECT
"""


@pytest.fixture(scope="module")
def overload_server(tmp_path_factory):
    path = tmp_path_factory.mktemp("policy") / "policy.yaml"
    path.write_text(POLICY)
    with InferenceServer("builtin:mlp", "--policy-file", str(path)) as s:
        yield s


def _flood(client, n, done, level_class=QosClass.STANDARD):
    for i in range(n):
        client.async_infer("mlp", [_input(i)], headers={H.QOS_CLASS: level_class.header_value},
                           callback=lambda result, error: done.put((result, error)))


def test_queue_full_is_resource_exhausted_and_429(overload_server):
    client = tgrpc.InferenceServerClient(overload_server.grpc)
    done: queue.Queue = queue.Queue()
    _flood(client, 40, done)                          # level 3, unbounded: a backlog
    _wait_queued(overload_server, 10)
    _flood(client, 12, done, QosClass.INTERACTIVE)    # level 2 holds at most 3
    errors = []
    for _ in range(52):
        _, error = done.get(timeout=60)
        if error is not None:
            errors.append(error)
    assert errors and all(e.status() == "StatusCode.RESOURCE_EXHAUSTED" for e in errors)
    assert all("priority level 2 queue of model 'mlp' is full (3 requests)" in e.message() for e in errors)
    assert len(errors) >= 2      # 12 sent at once into a queue of 3 behind a busy model
    # REST: the same refusal is 429.
    _flood(client, 40, done)
    _wait_queued(overload_server, 10)
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 64], "datatype": "FP32",
                                   "data": [0.0] * 64}]}).encode()
    barrier = threading.Barrier(16)

    def post(_):
        req = urllib.request.Request(f"http://{overload_server.http}/v2/models/mlp/infer", data=body,
                                     headers={H.QOS_CLASS: "interactive"}, method="POST")
        barrier.wait()
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, ""
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())["error"]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(post, range(16)))
    statuses = [code for code, _ in answers]
    assert all("is full" in reason for code, reason in answers if code == 429)
    for _ in range(40):
        done.get(timeout=60)
    assert 429 in statuses and set(statuses) <= {200, 429}, statuses
    rejected = re.search(r'^mcp_inference_rejections_total\{[^}]*reason="queue_full"[^}]*\} ([0-9.]+)$',
                         overload_server.metrics(), re.M)
    assert rejected and float(rejected.group(1)) >= len(errors) + statuses.count(429)
    client.close()


def test_queue_timeout_under_reject_is_resource_exhausted_and_429(overload_server):
    client = tgrpc.InferenceServerClient(overload_server.grpc)
    done: queue.Queue = queue.Queue()
    # Twice the backlog the wait needs: a batch of one takes ~1.5 ms on a fast core, so a client
    # slowed by other work can be drained almost as fast as it sends (seen once in CI at 40).
    flood = 80
    _flood(client, flood, done)
    _wait_queued(overload_server, 20)
    t0 = time.monotonic()
    with pytest.raises(InferenceServerException) as e:
        client.infer("mlp", [_input(1)], headers={H.QOS_CLASS: "batch"})
    waited = time.monotonic() - t0
    assert e.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "timed out" in e.value.message() and "priority level 4" in e.value.message()
    assert waited < 0.5          # refused at its 5 ms timeout, not after the backlog drained
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]})
    req = urllib.request.Request(f"http://{overload_server.http}/v2/models/mlp/infer", data=body.encode(),
                                 headers={H.QOS_CLASS: "batch"}, method="POST")
    _wait_queued(overload_server, 5)
    with pytest.raises(urllib.error.HTTPError) as he:
        urllib.request.urlopen(req, timeout=30)
    assert he.value.code == 429 and "timed out" in json.loads(he.value.read())["error"]
    for _ in range(flood):
        _, error = done.get(timeout=60)
        assert error is None
    client.close()


def test_session_signature_is_checked_403_and_permission_denied(tmp_path):
    key = b"k" * 32
    key_file = tmp_path / "session.key"
    key_file.write_bytes(key)
    session = {H.END_USER: "alice", H.TENANT: "acme", H.QOS_CLASS: "interactive"}
    signed = dict(session, **{H.SESSION_SIG: sign_headers(session, key)})
    with InferenceServer("builtin:mlp", "--session-key-file", str(key_file), admin=False) as server:
        http = thttp.InferenceServerClient(server.http)   # it writes into the headers dict: pass copies
        hin = thttp.InferInput("INPUT0", [1, 64], "FP32")
        hin.set_data_from_numpy(np.zeros((1, 64), np.float32))
        assert http.infer("mlp", [hin], headers=dict(signed)).as_numpy("OUTPUT0").shape == (1, 16)
        tampered = dict(signed, **{H.TENANT: "evil"})
        with pytest.raises(InferenceServerException) as e:
            http.infer("mlp", [hin], headers=dict(tampered))
        assert e.value.status() == "403" and "do not match their signature" in e.value.message()
        client = tgrpc.InferenceServerClient(server.grpc)
        assert client.infer("mlp", [_input(0)], headers=signed).as_numpy("OUTPUT0").shape == (1, 16)
        upgraded = dict(signed, **{H.QOS_CLASS: "latency-critical"})
        with pytest.raises(InferenceServerException) as e:
            client.infer("mlp", [_input(0)], headers=upgraded)
        assert e.value.status() == "StatusCode.PERMISSION_DENIED" and "session check failed" in e.value.message()
        unsigned = {H.END_USER: "mallory"}
        with pytest.raises(InferenceServerException) as e:
            client.infer("mlp", [_input(0)], headers=unsigned)
        assert e.value.status() == "StatusCode.PERMISSION_DENIED" and "without" in e.value.message()
