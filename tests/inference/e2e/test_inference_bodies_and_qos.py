"""Hostile input to a live `mcpctl serve` (issue 11, items 1, 5 and 7): every bad request
ends in a 4xx / gRPC status with a reason and is counted, an unsigned QoS class is not
honoured, and a large or deeply nested JSON body does not stall other requests."""
from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest

from mcp26.mesh import headers as H
from mcp26.mesh.session import sign_headers
from mcp26.demo.stack.inference_server import InferenceServer
from mcp26.inference.protos import grpc_service_pb2 as pb
from mcp26.inference.protos import grpc_service_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.adversarial]

KEY = b"adversarial-session-key-32bytes!"
BODY = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}]}).encode()


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    key_file = tmp_path_factory.mktemp("key") / "session.key"
    key_file.write_bytes(KEY)
    with InferenceServer("builtin:mlp", "--session-key-file", str(key_file), admin=False) as server:
        yield server


def rest(server, headers: dict | None = None, body: bytes = BODY, timeout: float = 30) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://{server.http}/v2/models/mlp/infer", data=body,
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def raw_http(server, header_lines: bytes, body: bytes = BODY) -> tuple[int, bytes]:
    """One request with header bytes exactly as given (urllib would refuse non-ASCII values)."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as c:
        c.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: backend\r\nConnection: close\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body) + header_lines + b"\r\n" + body)
        data = b""
        while chunk := c.recv(65536):
            data += chunk
    head, _, rest_ = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), rest_


def grpc_infer(server, metadata=(), priority: int | None = None):
    req = pb.ModelInferRequest(model_name="mlp")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 64])
    req.raw_input_contents.append(np.full(64, 0.5, np.float32).tobytes())
    if priority is not None:
        req.parameters["priority"].int64_param = priority
    with grpc.insecure_channel(server.grpc) as ch:
        return pb_grpc.GRPCInferenceServiceStub(ch).ModelInfer(req, metadata=tuple(metadata), timeout=30)


def metric(server, name: str, **labels) -> float:
    with urllib.request.urlopen(f"http://{server.http}/metrics", timeout=10) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            total += float(m.group(2))
    return total


# -- item 1: a QoS class is honoured only when signed ----------------------------------------

def test_unsigned_qos_class_gets_the_default_level_and_is_counted(keyed):
    before = metric(keyed, "mcp_inference_qos_ignored_total", reason="unsigned_class")
    status, doc = rest(keyed, {H.QOS_CLASS: "latency-critical"})
    assert status == 200 and doc["parameters"]["priority_level"] == 3        # default, not 1
    r = grpc_infer(keyed, [(H.QOS_CLASS, "latency-critical")])
    assert r.parameters["priority_level"].uint64_param == 3
    assert metric(keyed, "mcp_inference_qos_ignored_total", reason="unsigned_class") == before + 2
    assert "x-mcp-qos-class: 'latency-critical' is not covered by x-mcp-session-sig" in keyed.log_tail()

    signed = {H.QOS_CLASS: "latency-critical"}
    signed[H.SESSION_SIG] = sign_headers(signed, KEY)
    status, doc = rest(keyed, signed)
    assert status == 200 and doc["parameters"]["priority_level"] == 1
    assert grpc_infer(keyed, list(signed.items())).parameters["priority_level"].uint64_param == 1


def test_priority_parameter_cannot_raise_an_unsigned_request(keyed):
    before = metric(keyed, "mcp_inference_qos_ignored_total", reason="priority_parameter")
    assert grpc_infer(keyed, priority=1).parameters["priority_level"].uint64_param == 3
    doc = json.loads(BODY)
    doc["parameters"] = {"priority": 1}
    status, out = rest(keyed, body=json.dumps(doc).encode())
    assert status == 200 and out["parameters"]["priority_level"] == 3
    assert metric(keyed, "mcp_inference_qos_ignored_total", reason="priority_parameter") == before + 2
    # lowering itself stays the client's choice
    assert grpc_infer(keyed, priority=4).parameters["priority_level"].uint64_param == 4


def test_priority_worker_with_a_key_serves_only_a_signed_latency_critical(tmp_path):
    key_file = tmp_path / "session.key"
    key_file.write_bytes(KEY)
    with InferenceServer("builtin:mlp", "--session-key-file", str(key_file), "--serve-class", "latency-critical",
                         "--intra-op-threads", "1", admin=False) as worker:
        status, doc = rest(worker, {H.QOS_CLASS: "latency-critical"})
        assert status == 403 and "serves only" in doc["error"]
        with pytest.raises(grpc.RpcError) as e:
            grpc_infer(worker, [(H.QOS_CLASS, "latency-critical")])
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        signed = {H.QOS_CLASS: "latency-critical"}
        signed[H.SESSION_SIG] = sign_headers(signed, KEY)
        status, doc = rest(worker, signed)
        assert status == 200 and doc["parameters"]["priority_level"] == 1


# -- item 7: a header the signature cannot cover is a 403 with a reason, counted -------------

@pytest.mark.parametrize("value", [b"\xe2\x82\xac", b"\xe9", b"caf\xc3\xa9"])
def test_non_ascii_session_header_is_403_not_500(keyed, value):
    before = metric(keyed, "mcp_inference_requests_total", protocol="http", code="PERMISSION_DENIED")
    internal = metric(keyed, "mcp_inference_requests_total", protocol="http", code="INTERNAL")
    sig = sign_headers({H.END_USER: "x"}, KEY).encode()
    status, body = raw_http(keyed, b"end-user: " + value + b"\r\nx-mcp-session-sig: " + sig + b"\r\n")
    assert status == 403, body
    assert "session check failed" in json.loads(body)["error"]
    assert metric(keyed, "mcp_inference_requests_total", protocol="http", code="PERMISSION_DENIED") == before + 1
    assert metric(keyed, "mcp_inference_requests_total", protocol="http", code="INTERNAL") == internal


def test_without_a_key_a_twice_given_class_is_400_not_the_first_one(plain):
    before = metric(plain, "mcp_inference_requests_total", protocol="http", code="INVALID_ARGUMENT")
    status, body = raw_http(plain, b"x-mcp-qos-class: batch\r\nx-mcp-qos-class: latency-critical\r\n")
    assert status == 400 and "x-mcp-qos-class appears 2 times" in json.loads(body)["error"]
    assert metric(plain, "mcp_inference_requests_total", protocol="http", code="INVALID_ARGUMENT") == before + 1


# -- item 5: no body stalls the loop that serves everyone; nesting and memory are bounded ------

@pytest.fixture(scope="module")
def plain():
    with InferenceServer("builtin:mlp", admin=False) as server:
        yield server


def json_body(data: bytes, shape: bytes = b"[1, 64]") -> bytes:
    return b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": ' + shape + b', "data": ' + data + b"}]}"


class Probe(threading.Thread):
    """Small gRPC infers back to back (bounded in count) while something else happens."""

    def __init__(self, server):
        super().__init__(daemon=True)
        self.server, self.latencies, self.stop = server, [], threading.Event()

    def run(self):
        with grpc.insecure_channel(self.server.grpc) as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            req = pb.ModelInferRequest(model_name="mlp")
            req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 64])
            req.raw_input_contents.append(np.zeros(64, np.float32).tobytes())
            while not self.stop.is_set() and len(self.latencies) < 20_000:
                t0 = time.monotonic()
                stub.ModelInfer(req, timeout=60)
                self.latencies.append(time.monotonic() - t0)


def high_water_mark(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))


def test_json_nested_990_deep_is_400_and_counted(plain):
    before = metric(plain, "mcp_inference_requests_total", protocol="http", code="INVALID_ARGUMENT")
    status, doc = rest(plain, body=json_body(b"[" * 990 + b"]" * 990))
    assert status == 400 and "deeper than 64 levels" in doc["error"]
    assert metric(plain, "mcp_inference_requests_total", protocol="http", code="INVALID_ARGUMENT") == before + 1


def test_data_is_checked_against_the_declared_shape_before_conversion(plain):
    status, doc = rest(plain, body=json_body(b"[" + b"1," * 200_000 + b"1]"))
    assert status == 400 and "200001 elements for shape [1, 64]" in doc["error"]
    status, doc = rest(plain, body=json_body(b"[[" + b"[1]," * 63 + b"[1]]]"))
    assert status == 400 and "nested deeper or wider than its shape" in doc["error"]


@pytest.mark.slow      # a latency bound beside a 60 MB body
def test_a_60mb_json_body_does_not_stall_other_requests(plain):
    """60 MB of JSON data under a [1, 64] shape: refused with a reason, while gRPC
    requests on the same server keep being answered in well under a second."""
    big = json_body(b"[" + b"1," * 30_000_000 + b"1]")
    probe = Probe(plain)
    probe.start()
    time.sleep(0.3)
    try:
        status, doc = rest(plain, body=big, timeout=120)
    finally:
        time.sleep(0.2)
        probe.stop.set()
        probe.join(60)
    assert status == 400 and "30000001 elements for shape [1, 64]" in doc["error"]
    assert len(probe.latencies) > 10
    assert max(probe.latencies) < 1.0, f"a probe waited {max(probe.latencies):.2f}s"


def test_a_nested_json_bomb_is_413_and_server_memory_stays_bounded(plain):
    """[[1],[1],...]: 40 MB of JSON that parses into ~900 MB of Python lists. The parser
    process runs out of its allowance (413); the server process does not grow by it."""
    before = high_water_mark(plain.proc.pid)
    status, doc = rest(plain, body=json_body(b"[" + b"[1]," * 10_000_000 + b"[1]]"), timeout=120)
    assert status == 413 and "more memory to parse" in doc["error"], doc
    grown = high_water_mark(plain.proc.pid) - before
    assert grown < 300 << 20, f"the server's peak memory grew by {grown >> 20} MiB"
    # the next large body gets a parser again, and the answer is the same as inline
    small = json_body(json.dumps([0.25] * 64).encode())
    padded = small[:-1] + b" " * (300 << 10) + small[-1:]
    s1, inline = rest(plain, body=small)
    s2, parsed_aside = rest(plain, body=padded)
    assert s1 == s2 == 200 and parsed_aside["outputs"] == inline["outputs"]
