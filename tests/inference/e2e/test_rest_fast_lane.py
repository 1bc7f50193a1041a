"""The REST fast lane (`mcpctl serve --rest-frontend fast`, inference-backend/rest_httptools.py)
against live servers: tritonclient, and raw sockets for the HTTP/1.1 details it must get
right itself (pipelining, chunked bodies, 100-continue, keep-alive, the handoff of any
other request to aiohttp on the same connection, the body limit, malformed input), each
compared with the aiohttp front end where both answer."""
from __future__ import annotations

import json
import socket

import numpy as np
import pytest
import tritonclient.http as thttp

from mcp26.demo.stack.inference_server import InferenceServer
from mcp26.inference.rest_body import INLINE_JSON_BYTES
from mcp26.mesh import headers as H

pytestmark = pytest.mark.e2e
MAX_BODY = 1_000_000
WIDTH = 256                     # builtin:relu: FP32 [-1, 256]


@pytest.fixture(scope="module")
def fast():
    with InferenceServer("builtin:relu", "--max-body-bytes", str(MAX_BODY), "--rest-frontend", "fast",
                         admin=False) as s:
        yield s


@pytest.fixture(scope="module")
def aio():
    with InferenceServer("builtin:relu", "--max-body-bytes", str(MAX_BODY), "--rest-frontend", "aiohttp",
                         admin=False) as s:
        yield s


def rows(seed: int, n: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, WIDTH)).astype(np.float32)


def infer_body(x: np.ndarray, rid: str) -> bytes:
    return json.dumps({"id": rid, "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": list(x.shape),
                                              "data": x.ravel().tolist()}]}).encode()


def post(path: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: t", "Content-Type: application/json",
            f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def get(path: str, *extra: str) -> bytes:
    return ("\r\n".join([f"GET {path} HTTP/1.1", "Host: t", *extra]) + "\r\n\r\n").encode()


class Conn:
    """One client connection; read() parses one answer (status, lower-cased headers, body)."""

    def __init__(self, server: InferenceServer, timeout: float = 10.0):
        self.sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=timeout)
        self.file = self.sock.makefile("rb")

    def send(self, data: bytes) -> "Conn":
        self.sock.sendall(data)
        return self

    def read(self) -> tuple[int, dict, bytes]:
        line = self.file.readline()
        assert line, "connection closed before an answer"
        status = int(line.split()[1])
        headers = {}
        while (h := self.file.readline()) not in (b"\r\n", b""):
            k, v = h.decode().split(":", 1)
            headers[k.strip().lower()] = v.strip()
        return status, headers, self.file.read(int(headers.get("content-length", 0)))

    def closed(self) -> bool:
        """The server closed the connection (EOF, nothing more to read)."""
        try:
            return self.file.read(1) == b""
        except ConnectionResetError:
            return True

    def close(self):
        self.file.close()
        self.sock.close()


def check_relu(answer, x: np.ndarray, rid: str) -> None:
    status, _, body = answer
    assert status == 200, body
    doc = json.loads(body)
    assert doc["id"] == rid
    out = doc["outputs"][0]
    np.testing.assert_array_equal(np.array(out["data"], np.float32).reshape(out["shape"]), np.maximum(x, 0))


def test_tritonclient_json_and_binary(fast):
    client = thttp.InferenceServerClient(fast.http)
    assert client.is_server_ready() and client.is_model_ready("relu")     # aiohttp, on the fast lane's port
    for binary in (True, False):
        x = rows(1 + binary, 3)
        inp = thttp.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        result = client.infer("relu", [inp], outputs=[thttp.InferRequestedOutput("OUTPUT0", binary_data=binary)])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.maximum(x, 0))
        assert (result.get_output("OUTPUT0").get("parameters", {}).get("binary_data_size") is not None) == binary


def test_pipelined_requests_answered_in_request_order(fast):
    # The first body is large JSON (parsed in the parser process: milliseconds), the second
    # tiny: the second's answer is ready first and must still come second.
    big, small = rows(3, 4), rows(4)
    big_body = infer_body(big, "first") + b" " * INLINE_JSON_BYTES       # JSON allows trailing blanks
    assert INLINE_JSON_BYTES < len(big_body) < MAX_BODY
    c = Conn(fast).send(post("/v2/models/relu/infer", big_body) +
                        post("/v2/models/relu/versions/1/infer", infer_body(small, "second")))
    check_relu(c.read(), big, "first")
    check_relu(c.read(), small, "second")
    c.close()


def test_chunked_request_body(fast):
    x = rows(5)
    body = infer_body(x, "chunked")
    parts = [body[:10], body[10:500], body[500:]]
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    c = Conn(fast).send(b"POST /v2/models/relu/infer HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                        + chunked)
    check_relu(c.read(), x, "chunked")
    c.close()


def test_expect_100_continue_is_answered_before_the_body(fast):
    x = rows(6)
    body = infer_body(x, "expect")
    request = post("/v2/models/relu/infer", body, "Expect: 100-continue")
    c = Conn(fast, timeout=5).send(request[:-len(body)])       # the head only, as curl sends it
    status, _, _ = c.read()                                    # times out if no 100 comes
    assert status == 100
    c.send(body)
    check_relu(c.read(), x, "expect")
    c.close()


def test_keep_alive_serves_three_requests_on_one_connection(fast):
    c = Conn(fast)
    for i in range(3):
        x = rows(10 + i)
        check_relu(c.send(post("/v2/models/relu/infer", infer_body(x, f"k{i}"))).read(), x, f"k{i}")
    c.close()


def test_handoff_to_aiohttp_keeps_the_connection_serving(fast):
    x1, x2 = rows(20), rows(21)
    c = Conn(fast)
    check_relu(c.send(post("/v2/models/relu/infer", infer_body(x1, "before"))).read(), x1, "before")
    status, _, body = c.send(get("/v2/health/ready")).read()
    assert (status, body) == (200, b"")
    check_relu(c.send(post("/v2/models/relu/infer", infer_body(x2, "after"))).read(), x2, "after")
    c.close()


def test_handoff_of_a_request_pipelined_behind_an_infer(fast):
    # The GET starts mid-read: its offset is found by re-parsing (rest_fast.message_start).
    x = rows(22)
    c = Conn(fast).send(post("/v2/models/relu/infer", infer_body(x, "pipelined")) + get("/v2") +
                        get("/v2/models/relu/ready"))
    check_relu(c.read(), x, "pipelined")
    status, _, body = c.read()
    assert status == 200 and json.loads(body)["name"] == "mcp-mesh-inference"
    assert c.read()[0] == 200
    c.close()


def test_server_metadata_on_a_fresh_connection(fast):
    status, headers, body = Conn(fast).send(get("/v2")).read()
    assert status == 200 and headers["content-type"].startswith("application/json")
    assert json.loads(body)["name"] == "mcp-mesh-inference"


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_body_over_the_limit_is_413_as_on_aiohttp(fast, aio, framing):
    body = b'{"inputs": [' + b" " * MAX_BODY + b"]}"
    if framing == "content-length":
        request = post("/v2/models/relu/infer", body)
    else:
        request = (b"POST /v2/models/relu/infer HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                   b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
    answers = []
    for server in (fast, aio):
        c = Conn(server).send(request)
        status, _, text = c.read()
        answers.append((status, json.loads(text)))
        c.close()
    assert answers[0] == answers[1]
    assert answers[0] == (413, {"error": f"request body exceeds {MAX_BODY} bytes"})


def test_endless_header_is_431_and_closes(fast):
    # httptools holds a header until it ends: the lane caps what it reads meanwhile (rest_fast.MAX_HEAD_BYTES)
    c = Conn(fast).send(b"POST /v2/models/relu/infer HTTP/1.1\r\nHost: t\r\nX-Big: ")
    try:
        for _ in range(8):
            c.sock.sendall(b"a" * (1 << 20))
    except OSError:
        pass                            # the server answered and closed while we still sent
    status, _, body = c.read()
    assert status == 431 and b"headers exceed" in body
    c.close()


def test_garbage_request_line_is_400_and_closes(fast):
    c = Conn(fast).send(b"\x01\x02 nonsense\r\n\r\n")
    status, headers, body = c.read()
    assert status == 400 and "error" in json.loads(body)
    assert c.closed()


def test_connection_close_closes_after_the_answer(fast):
    x = rows(30)
    c = Conn(fast).send(post("/v2/models/relu/infer", infer_body(x, "last"), "Connection: close"))
    answer = c.read()
    check_relu(answer, x, "last")
    assert answer[1]["connection"] == "close"
    assert c.closed()


def test_http_1_0_closes_unless_keep_alive_is_asked(fast):
    x = rows(31)
    for keep in (False, True):
        request = post("/v2/models/relu/infer", infer_body(x, "old"), *(["Connection: keep-alive"] if keep else []))
        c = Conn(fast, timeout=2).send(request.replace(b"HTTP/1.1", b"HTTP/1.0", 1))
        check_relu(c.read(), x, "old")
        if keep:
            check_relu(c.send(request.replace(b"HTTP/1.1", b"HTTP/1.0", 1)).read(), x, "old")
        else:
            assert c.closed()
        c.close()


def test_unknown_model_is_404_as_on_aiohttp(fast, aio):
    x = rows(40)
    answers = []
    for server in (fast, aio):
        c = Conn(server)
        status, headers, body = c.send(post("/v2/models/nope/infer", infer_body(x, "n"))).read()
        answers.append((status, headers["content-type"], json.loads(body)))
        c.close()
    assert answers[0] == answers[1]
    assert answers[0][0] == 404 and "nope" in answers[0][2]["error"]


@pytest.mark.parametrize("binary", [False, True])
def test_same_answer_headers_as_aiohttp(fast, aio, binary):
    x = rows(50)
    request = post("/v2/models/relu/infer", infer_body(x, "h"))
    if binary:
        head = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, WIDTH],
                                       "parameters": {"binary_data_size": x.nbytes}}],
                           "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
        request = post("/v2/models/relu/infer", head + x.tobytes(), f"Inference-Header-Content-Length: {len(head)}")
    seen = []
    for server in (fast, aio):
        c = Conn(server)
        status, headers, body = c.send(request).read()
        c.close()
        assert status == 200, body
        seen.append(headers)
        if binary:
            # the header's value is this answer's own JSON length (its timing parameters vary
            # from answer to answer): the JSON ends there and the tensor's bytes follow
            n = int(headers["inference-header-content-length"])
            doc = json.loads(body[:n])
            assert doc["outputs"][0]["parameters"]["binary_data_size"] == len(body) - n == x.nbytes
            np.testing.assert_array_equal(np.frombuffer(body[n:], np.float32), np.maximum(x, 0).ravel())
    assert set(seen[0]) == set(seen[1])
    assert {H.QUEUE_TIME_US, H.COMPUTE_TIME_US, H.ORCA_LOAD_REPORT} <= set(seen[0])
    assert ("inference-header-content-length" in seen[0]) == binary
    assert seen[0]["content-type"] == seen[1]["content-type"]


def test_percent_encoded_model_name_is_decoded_as_on_aiohttp(fast):
    # aiohttp decodes the path before matching {name}; the fast lane hands such a path over
    x = rows(60)
    c = Conn(fast)
    check_relu(c.send(post("/v2/models/re%6Cu/infer", infer_body(x, "pct"))).read(), x, "pct")
    check_relu(c.send(post("/v2/models/relu/infer", infer_body(x, "then"))).read(), x, "then")
    c.close()
