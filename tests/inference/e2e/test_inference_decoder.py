"""builtin:tiny-decoder with the server's KV cache: greedy decoding over gRPC equals
onnxruntime run locally on the full prefix; hits, misses and tokens/s are reported."""
from __future__ import annotations

import re
import threading

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as tgrpc

from mcp26.inference.builtin_models import DEC_HEAD_DIM, DEC_HEADS, builtin_path
from mcp26.demo.stack.inference_server import InferenceServer

pytestmark = pytest.mark.e2e
PROMPTS = {101: [72, 101, 108, 108, 111], 202: [7, 7, 7], 303: [250, 3, 99, 12, 0, 44, 45]}
STEPS = 8


@pytest.fixture(scope="module")
def local():
    return ort.InferenceSession(builtin_path("tiny-decoder"), providers=["CPUExecutionProvider"])


def reference(local, prompt: list[int]) -> list[int]:
    """Greedy decoding without any cache: the whole prefix every step."""
    tokens, out = list(prompt), []
    empty = np.zeros((1, DEC_HEADS, 0, DEC_HEAD_DIM), np.float32)
    for _ in range(STEPS):
        nxt = local.run(["next_token"], {"input_ids": np.array([tokens], np.int64),
                                         "past_key": empty, "past_value": empty})[0]
        out.append(int(nxt[0]))
        tokens.append(int(nxt[0]))
    return out


def decode(server, sid: int, prompt: list[int], results: dict, errors: list) -> None:
    client = tgrpc.InferenceServerClient(server.grpc)
    try:
        ids, out = prompt, []
        for step in range(STEPS):
            inp = tgrpc.InferInput("input_ids", [1, len(ids)], "INT64")
            inp.set_data_from_numpy(np.array([ids], np.int64))
            r = client.infer("tiny-decoder", [inp], sequence_id=sid, sequence_start=step == 0,
                             sequence_end=False)
            token = int(r.as_numpy("next_token")[0])
            out.append(token)
            ids = [token]
        results[sid] = out
    except Exception as e:
        errors.append(repr(e))
    finally:
        client.close()


def run_sequences(server):
    results, errors = {}, []
    threads = [threading.Thread(target=decode, args=(server, sid, p, results, errors)) for sid, p in PROMPTS.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{name}\{{[^}}]*\}} ([0-9.e+-]+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def test_decoding_with_kv_cache_equals_full_prefix_onnxruntime(local):
    import time
    with InferenceServer("builtin:tiny-decoder") as server:
        t0 = time.monotonic()
        results = run_sequences(server)
        client_rate = len(PROMPTS) * STEPS / (time.monotonic() - t0)
        status = server.admin("/admin/status")[1]["models"][0]
        read_by = time.monotonic() - t0
        text = server.metrics()
    for sid, prompt in PROMPTS.items():
        assert results[sid] == reference(local, prompt), sid
    kv = status["kv_cache"]
    # every step after the first of each sequence found its cache
    assert kv["hits"] == len(PROMPTS) * (STEPS - 1) and kv["misses"] == 0 and kv["hit_rate"] == 1.0
    assert status["tokens"]["generated"] == len(PROMPTS) * STEPS
    assert metric(text, "mcp_inference_kv_cache_hit_rate") == 1.0
    # the server's tokens/s is the rate the clients saw: its window starts at the first token and
    # ends when the status is read, never shorter than 50 ms (decoder.TokenMeter), so it is at
    # least the tokens over max([t0, read_by], 50 ms). (Against half the clients' own rate, a run
    # under 50 ms failed: CI read 480 = 24 tokens / 50 ms against 1,040.)
    tokens = len(PROMPTS) * STEPS
    assert 0.95 * tokens / max(read_by, 0.05) <= status["tokens"]["tokens_per_second"] <= 2.0 * client_rate
    assert metric(text, "mcp_inference_tokens_per_second") > 0


def test_evicted_cache_is_a_miss_recomputed_from_history_and_still_exact(local):
    # ~12 KiB: one sequence's cache at a dozen tokens is 2*2*12*32*4 B = 6 KiB, so
    # three interleaved sequences evict one another.
    with InferenceServer("builtin:tiny-decoder", "--kv-cache-mb", "0.012") as server:
        results = run_sequences(server)
        status = server.admin("/admin/status")[1]["models"][0]
    for sid, prompt in PROMPTS.items():
        assert results[sid] == reference(local, prompt), sid
    kv = status["kv_cache"]
    assert kv["misses"] > 0 and kv["evictions"] > 0 and kv["hit_rate"] < 1.0
    assert status["tokens"]["recomputed"] > 0


def test_stateless_call_with_explicit_past_equals_local(local):
    with InferenceServer("builtin:tiny-decoder", admin=False) as server:
        client = tgrpc.InferenceServerClient(server.grpc)
        ids = np.array([[5, 6, 7]], np.int64)
        past = np.random.default_rng(3).standard_normal((1, DEC_HEADS, 4, DEC_HEAD_DIM)).astype(np.float32)
        inputs = []
        for name, arr, dt in (("input_ids", ids, "INT64"), ("past_key", past, "FP32"), ("past_value", past * 0.5, "FP32")):
            i = tgrpc.InferInput(name, list(arr.shape), dt)
            i.set_data_from_numpy(arr)
            inputs.append(i)
        r = client.infer("tiny-decoder", inputs)
        want = local.run(None, {"input_ids": ids, "past_key": past, "past_value": past * 0.5})
        names = [o.name for o in local.get_outputs()]
        for name, value in zip(names, want):
            np.testing.assert_allclose(r.as_numpy(name), value, rtol=1e-5, atol=1e-6)
        bad = tgrpc.InferInput("input_ids", [1, 2], "INT64")
        bad.set_data_from_numpy(np.array([[1, 999]], np.int64))
        with pytest.raises(Exception) as e:
            client.infer("tiny-decoder", [bad], sequence_id=9, sequence_start=True)
        assert "INVALID_ARGUMENT" in str(e.value) and "token ids in 0..255" in str(e.value)
        client.close()


def test_context_longer_than_the_model_allows_is_refused_before_it_runs():
    from mcp26.inference.decoder import MAX_CONTEXT
    with InferenceServer("builtin:tiny-decoder", admin=False) as server:
        client = tgrpc.InferenceServerClient(server.grpc)
        first = tgrpc.InferInput("input_ids", [1, MAX_CONTEXT - 1], "INT64")
        first.set_data_from_numpy(np.ones((1, MAX_CONTEXT - 1), np.int64))
        client.infer("tiny-decoder", [first], sequence_id=77, sequence_start=True)
        more = tgrpc.InferInput("input_ids", [1, 2], "INT64")
        more.set_data_from_numpy(np.ones((1, 2), np.int64))
        with pytest.raises(Exception) as e:
            client.infer("tiny-decoder", [more], sequence_id=77)
        assert "INVALID_ARGUMENT" in str(e.value) and f"would reach {MAX_CONTEXT + 1} tokens" in str(e.value)
        huge = tgrpc.InferInput("input_ids", [1, 100_000], "INT64")
        huge.set_data_from_numpy(np.zeros((1, 100_000), np.int64))
        with pytest.raises(Exception, match="context is at most"):
            client.infer("tiny-decoder", [huge], sequence_id=78, sequence_start=True)
        one = tgrpc.InferInput("input_ids", [1, 1], "INT64")   # and the sequence can still take one more
        one.set_data_from_numpy(np.ones((1, 1), np.int64))
        assert client.infer("tiny-decoder", [one], sequence_id=77).as_numpy("next_token").shape == (1,)
        client.close()
