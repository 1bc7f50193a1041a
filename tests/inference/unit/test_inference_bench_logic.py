"""mcp-bench's pure logic: priority mix, percentiles, URL and input parsing,
error classes, HTTP/1.1 response parsing."""
from __future__ import annotations

import json

import numpy as np
import pytest

from mcp26.inference.bench import errors
from mcp26.inference.bench.http1 import _parse_head, encode_request
from mcp26.inference.bench.mix import MixSequence, parse_mix
from mcp26.inference.bench.stats import Recorder, percentile, schedule_lag, summarize_rows
from mcp26.inference.bench.target import TargetError, build_tensors, parse_shapes, parse_url, rest_body, use_binary
from mcp26.mesh.error_classes import ERROR_CLASSES, GRPC_STATUS
from mcp26.mesh.qos import QosClass


def test_mix_names_map_to_mesh_qos_classes_and_normalise():
    mix = parse_mix("critical=1, low=3")
    assert [(p.label, p.qos, s) for p, s in mix] == [("critical", QosClass.LATENCY_CRITICAL, 0.25),
                                                     ("low", QosClass.BATCH, 0.75)]
    assert parse_mix("interactive=1")[0][0].qos is QosClass.INTERACTIVE
    assert mix[0][0].level == QosClass.LATENCY_CRITICAL.priority_level


@pytest.mark.parametrize("bad,match", [("urgent=1", "unknown priority"), ("high", "NAME=FRACTION"),
                                       ("high=x", "not a number"), ("high=-1", ">= 0"),
                                       ("high=0,low=0", "above 0"), ("high=1,high=2", "twice")])
def test_mix_rejects_bad_input_clearly(bad, match):
    with pytest.raises(ValueError, match=match):
        parse_mix(bad)


def test_mix_sequence_holds_the_shares_on_every_prefix():
    seq = MixSequence(parse_mix("high=0.1,medium=0.3,low=0.6"))
    picks = [seq.next() for _ in range(1000)]
    for k in (10, 100, 333, 1000):
        counts = np.bincount(picks[:k], minlength=3)
        assert np.all(np.abs(counts - k * np.array([0.1, 0.3, 0.6])) <= 1), (k, counts)


def test_nearest_rank_percentiles():
    s = np.arange(1, 1001, dtype=float)     # 1..1000
    assert percentile(s, 50) == 500 and percentile(s, 99) == 990 and percentile(s, 99.9) == 999
    assert percentile(s, 100) == 1000 and percentile(np.array([7.0]), 99.9) == 7
    assert percentile(np.array([]), 50) is None


def test_summary_rows_split_by_priority_and_count_errors():
    rec = Recorder()
    for i in range(10):
        err = "overload/http-429" if i == 9 else None
        rec.add(0.0, 0.001 * i, 0.010 * (i + 1), i % 2, err, 100.0 if i % 2 else None, 50.0, i >= 8)
    rows = summarize_rows(rec, ["high", "low"], 0.0, 1.0)
    assert [r["priority"] for r in rows] == ["all", "high", "low"]
    assert rows[0]["ok"] == 9 and rows[0]["error_classes"] == {"overload/http-429": 1}
    assert rows[1]["requests"] == 5 and rows[1]["server_queue_us"] is None
    assert rows[2]["server_queue_us"]["p50"] == 100 and rows[2]["errors"] == 1
    assert rows[0]["latency_ms"]["max"] == 90.0      # the failed 100 ms one is not a latency sample
    lag = schedule_lag(rec)
    assert lag["max_ms"] == 9.0 and lag["waited_for_slot"] == 2 and lag["generator_max_ms"] == 7.0


def test_url_forms():
    t = parse_url("http://127.0.0.1:8000/v2/models/mlp/infer")
    assert (t.host, t.port, t.model, t.model_path) == ("127.0.0.1", 8000, "mlp", "/v2/models/mlp")
    t = parse_url("127.0.0.1:9001/v2/models/m/versions/2", grpc=True)
    assert (t.port, t.model, t.version) == (9001, "m", "2")
    assert parse_url("http://127.0.0.1:8000/v2/health/ready").model is None
    with pytest.raises(TargetError, match="needs a model"):
        parse_url("127.0.0.1:8001", grpc=True)
    with pytest.raises(TargetError, match="scheme"):
        parse_url("ftp://127.0.0.1/x")
    with pytest.raises(TargetError, match="(?i)port"):
        parse_url("http://127.0.0.1:99999/x")


def test_inputs_from_metadata_and_shape_overrides():
    meta = {"name": "m", "inputs": [{"name": "a", "datatype": "FP32", "shape": [-1, 3]},
                                    {"name": "ids", "datatype": "INT64", "shape": [-1, -1]},
                                    {"name": "s", "datatype": "BYTES", "shape": [1]}]}
    tensors = build_tensors(meta, parse_shapes("ids:2,5"))
    assert [(n, d, s) for n, d, s, _ in tensors] == [("a", "FP32", [1, 3]), ("ids", "INT64", [2, 5]),
                                                     ("s", "BYTES", [1])]
    assert tensors[1][3].dtype == np.int64 and tensors[1][3].size == 10
    headers, raw = rest_body(tensors, 1)
    body = json.loads(raw)
    assert headers["Content-Type"] == "application/json"
    assert body["parameters"] == {"priority": 1} and len(body["inputs"][1]["data"]) == 10
    # the binary-tensor extension: JSON header of the declared length, then each input's bytes
    numeric = tensors[:2]
    headers, raw = rest_body(numeric, None, binary=True)
    n = int(headers["Inference-Header-Content-Length"])
    head = json.loads(raw[:n])
    assert [i["parameters"]["binary_data_size"] for i in head["inputs"]] == [12, 80]
    assert raw[n:] == numeric[0][3].tobytes() + numeric[1][3].tobytes()
    assert not use_binary(tensors, "always")            # BYTES inputs stay JSON
    assert use_binary(numeric, "always") and not use_binary(numeric, "auto")
    with pytest.raises(TargetError, match="unknown input"):
        build_tensors(meta, {"zzz": [1]})
    with pytest.raises(TargetError, match="positive dims"):
        parse_shapes("a:0,3")
    with pytest.raises(TargetError, match="no inputs"):
        build_tensors({"name": "m", "inputs": []})


def test_error_labels_use_mesh_classes():
    assert errors.http_error(200) is None
    assert errors.http_error(404) == "client/http-404"
    assert errors.http_error(429) == "overload/http-429"
    assert errors.http_error(503) == "unavailable/http-503"
    assert errors.http_error(500) == "server/http-500"
    assert errors.grpc_error(GRPC_STATUS["NOT_FOUND"]) == "client/NOT_FOUND"
    assert errors.grpc_error(GRPC_STATUS["RESOURCE_EXHAUSTED"]) == "overload/RESOURCE_EXHAUSTED"
    for label in (errors.CONNECT, errors.CLOSED, errors.TIMEOUT, errors.PROTOCOL):
        assert errors.error_class_of(label) in ERROR_CLASSES


def test_http_head_parsing():
    r = _parse_head(b"HTTP/1.1 429 Too Many\r\nContent-Length: 12\r\nX-MCP-Queue-Time-Us: 40\r\n"
                    b"x-mcp-compute-time-us: 7\r\nConnection: close")
    assert (r.status, r.length, r.close, r.queue_us, r.compute_us) == (429, 12, True, 40.0, 7.0)
    r = _parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked")
    assert r.chunked and not r.close
    assert _parse_head(b"HTTP/1.1 204 No Content").length == 0
    with pytest.raises(ValueError):
        _parse_head(b"SSH-2.0-OpenSSH")
    req = encode_request("POST", "/v2/models/m/infer", "h:1", {"x-mcp-qos-class": "batch"}, b"{}")
    assert req.endswith(b"\r\n\r\n{}") and b"Content-Length: 2\r\n" in req


def test_input_specs_replace_metadata():
    from mcp26.inference.bench.target import parse_inputs
    meta = parse_inputs(["INPUT0:fp32:1,64", "ids:INT64:2,3"])
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64]},
                              {"name": "ids", "datatype": "INT64", "shape": [2, 3]}]
    assert parse_inputs(None) is None
    for bad in ("INPUT0:FP32", "x:FLOAT:1", "x:FP32:a,b"):
        with pytest.raises(TargetError, match="--input"):
            parse_inputs([bad])
