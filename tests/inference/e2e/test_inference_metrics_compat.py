"""The model server's /metrics, scraped from a running `mcpctl serve`: one metrics library
(no otel_scope_* labels), one label name (`model`; vLLM's own series `model_name`), a
bounded requests_total whatever names clients send, Triton's nv_inference_* counters, and
vLLM's series (latency histograms included) for generative models only."""
from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
import uuid

import numpy as np
import openai
import pytest

from mcp26.demo.stack.inference_server import InferenceServer

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def mlp():
    with InferenceServer("builtin:mlp") as s:
        yield s


@pytest.fixture(scope="module")
def decoder():
    with InferenceServer("builtin:tiny-decoder") as s:
        yield s


def infer(server, model: str, data=None) -> int:
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 64], "datatype": "FP32",
                                   "data": data if data is not None else [0.5] * 64}]}).encode()
    req = urllib.request.Request(f"http://{server.http}/v2/models/{model}/infer", data=body, method="POST",
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def samples(text: str) -> list[tuple[str, dict, float]]:
    out = []
    for line in text.splitlines():
        m = re.match(r"([^\s{#]+)(?:\{(.*)\})? (\S+)$", line)
        if m:
            out.append((m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")), float(m.group(3))))
    return out


def value(text: str, name: str, **labels) -> float | None:
    for n, lab, v in samples(text):
        if n == name and all(lab.get(k) == str(x) for k, x in labels.items()):
            return v
    return None


def test_unknown_model_names_are_one_series(mlp):
    assert infer(mlp, "mlp") == 200
    for _ in range(50):
        assert infer(mlp, f"m-{uuid.uuid4().hex[:10]}") == 404
    text = mlp.metrics()
    models = {lab["model"] for n, lab, _v in samples(text) if n == "mcp_inference_requests_total"}
    assert models == {"mlp", "_unknown"}
    assert value(text, "mcp_inference_requests_total", model="_unknown", protocol="http", code="NOT_FOUND") == 50


def test_triton_counters_by_model_and_version(mlp):
    before = mlp.metrics()
    ok0 = value(before, "nv_inference_request_success", model="mlp", version="1") or 0
    fail0 = value(before, "nv_inference_request_failure", model="mlp", version="1") or 0
    for _ in range(3):
        assert infer(mlp, "mlp") == 200
    assert infer(mlp, "mlp", data=[0.5] * 10) == 400            # found, then refused: a failure
    text = mlp.metrics()
    assert "# TYPE nv_inference_request_success untyped" in text  # Triton's name: no `_total`
    assert value(text, "nv_inference_request_success", model="mlp", version="1") == ok0 + 3
    assert value(text, "nv_inference_request_failure", model="mlp", version="1") == fail0 + 1
    assert value(text, "nv_inference_count", model="mlp", version="1") >= ok0 + 3
    assert 1 <= value(text, "nv_inference_exec_count", model="mlp", version="1") <= ok0 + 3
    for name in ("nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                 "nv_inference_compute_infer_duration_us"):
        assert value(text, name, model="mlp", version="1") > 0, name
    # the same numbers as Triton's statistics extension
    with urllib.request.urlopen(f"http://{mlp.http}/v2/models/mlp/stats", timeout=10) as r:
        stats = json.loads(r.read())["model_stats"][0]
    assert value(mlp.metrics(), "nv_inference_count", model="mlp", version="1") == stats["inference_count"]


def test_one_library_one_label_no_vllm_for_a_classifier(mlp):
    text = mlp.metrics()
    assert "otel_scope" not in text and "target_info" not in text
    names = samples(text)
    assert not [n for n, _l, _v in names if n.startswith("vllm:")]
    mcp = [(n, lab) for n, lab, _v in names if n.startswith("mcp_")]
    assert mcp and not [n for n, lab in mcp if "model_name" in lab]
    assert value(text, "mcp_inference_queue_depth", model="mlp", priority_level="1") is not None


def test_vllm_series_and_latency_histograms_for_a_generative_model(decoder):
    client = openai.OpenAI(base_url=f"http://{decoder.http}/v1", api_key="unused", max_retries=0, timeout=30)
    stream = client.completions.create(model="tiny-decoder", prompt="hello", max_tokens=6, stream=True)
    assert len("".join(c.choices[0].text for c in stream if c.choices)) > 0
    text = decoder.metrics()
    assert value(text, "vllm:time_to_first_token_seconds_count", model_name="tiny-decoder") == 1
    assert value(text, "vllm:time_per_output_token_seconds_count", model_name="tiny-decoder") >= 1
    assert value(text, "vllm:e2e_request_latency_seconds_count", model_name="tiny-decoder") == 1
    assert value(text, "vllm:time_to_first_token_seconds_bucket", model_name="tiny-decoder", le="10.0") == 1
    assert value(text, "vllm:num_requests_waiting", model_name="tiny-decoder") == 0
    assert "# TYPE mcp_inference_tokens_total counter" in text      # was a gauge
    assert value(text, "mcp_inference_tokens_total", model="tiny-decoder", kind="generated") >= 1
    assert value(text, "mcp_inference_requests_total", model="tiny-decoder", protocol="openai", code="OK") == 1
