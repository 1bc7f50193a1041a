"""The OpenAI-compatible API of `mcpctl serve --model builtin:tiny-decoder`, with the official
`openai` client (sync and async, streamed and not); the block KV cache seen from outside
(prefix reuse exact, cache on vs off; blocks reclaimed after idle); the load report
(/v1/load, vLLM-named /metrics, ORCA) moving under load."""
from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import onnxruntime as ort
import openai
import pytest

from mcp26.inference.builtin_models import DEC_HEAD_DIM, DEC_HEADS, builtin_path
from mcp26.demo.stack.inference_server import InferenceServer

pytestmark = pytest.mark.e2e
MODEL = "tiny-decoder"
BYTES_PER_TOKEN = 2 * DEC_HEADS * DEC_HEAD_DIM * 4          # key + value, FP32
SYSTEM = "You are the tiny decoder of MCP Mesh. Answer in bytes, briefly, and never apologise. " * 2


@pytest.fixture(scope="module")
def local():
    return ort.InferenceSession(builtin_path("tiny-decoder"), providers=["CPUExecutionProvider"])


def reference(local, prompt: list[int], steps: int) -> list[int]:
    """Greedy decoding with no cache at all: the whole prefix every step."""
    tokens, out = list(prompt), []
    empty = np.zeros((1, DEC_HEADS, 0, DEC_HEAD_DIM), np.float32)
    for _ in range(steps):
        nxt = int(local.run(["next_token"], {"input_ids": np.array([tokens], np.int64),
                                             "past_key": empty, "past_value": empty})[0][0])
        out.append(nxt)
        tokens.append(nxt)
    return out


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="unused", max_retries=0, timeout=30)


def get_json(server, path: str) -> dict:
    with urllib.request.urlopen(f"http://{server.http}{path}", timeout=10) as r:
        return json.loads(r.read())


def post(server, path: str, body: bytes, headers: dict | None = None):
    req = urllib.request.Request(f"http://{server.http}{path}", data=body, method="POST",
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read())


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} ([0-9.e+-]+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


@pytest.fixture(scope="module")
def server():
    with InferenceServer("builtin:tiny-decoder", "--openai-model", "gpt-tiny=tiny-decoder:1",
                         "--openai-model", "gpt-next=tiny-decoder:2", admin=False) as s:
        yield s


def test_completion_is_greedy_decoding_exactly_with_usage_and_model_names(server, local):
    c = client(server)
    prompt = "Hello, mesh"
    r = c.completions.create(model="gpt-tiny", prompt=prompt, max_tokens=12, temperature=0,
                             extra_body={"return_token_ids": True, "frobnicate": 1})   # unknown: ignored
    ids = r.choices[0].model_extra["token_ids"]
    assert ids == reference(local, list(prompt.encode()), 12)
    assert r.choices[0].text == bytes(ids).decode("utf-8", "replace")
    assert (r.model, r.object, r.choices[0].finish_reason) == ("gpt-tiny", "text_completion", "length")
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (11, 12, 23)
    # token ids as the prompt are the same request
    again = c.completions.create(model=MODEL, prompt=list(prompt.encode()), max_tokens=12, temperature=0)
    assert again.choices[0].text == r.choices[0].text and again.model == MODEL
    listed = {m.id: m for m in c.models.list().data}
    assert set(listed) == {MODEL, "gpt-tiny"}          # gpt-next names version 2, which is not served
    assert c.models.retrieve("gpt-tiny").id == "gpt-tiny"
    with pytest.raises(openai.NotFoundError) as e:
        c.completions.create(model="gpt-next", prompt="x")
    assert e.value.body["code"] == "model_not_found" and e.value.body["type"] == "invalid_request_error"


def test_errors_have_openai_shape(server):
    c = client(server)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt="x", n=2)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt="y" * 2000, max_tokens=100)
    assert e.value.body["code"] == "context_length_exceeded" and "2048" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=[{"role": "wizard", "content": "hi"}])
    assert e.value.body["param"] == "messages[0].role"
    status, _, body = post(server, "/v1/completions", b"{not json")
    assert status == 400 and set(body["error"]) == {"message", "type", "param", "code"}
    status, _, body = post(server, "/v1/chat/completions", json.dumps({"model": "nope", "messages": []}).encode())
    assert status == 404 and body["error"]["code"] == "model_not_found"


def test_streams_sync_and_async_equal_the_whole_answer_and_stop_sequences_end_it(server):
    c = client(server)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me about meshes"}]
    args = dict(model=MODEL, messages=msgs, max_tokens=24, temperature=0.9, seed=11, top_p=0.95, user="u1")
    whole = c.chat.completions.create(**args)
    text = whole.choices[0].message.content
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    assert whole.usage.completion_tokens == 24 and whole.usage.prompt_tokens == len(
        "system: Be brief.\nuser: Tell me about meshes\nassistant: ")
    chunks = list(c.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    assert c.chat.completions.create(**{**args, "seed": 12}).choices[0].message.content != text

    async def run_async():
        ac = openai.AsyncOpenAI(base_url=f"http://{server.http}/v1", api_key="unused", max_retries=0)
        try:
            streamed = ""
            async for ch in await ac.chat.completions.create(**args, stream=True):
                streamed += ch.choices[0].delta.content or ""
            plain = await ac.chat.completions.create(**args)
            comp = [ch async for ch in await ac.completions.create(model=MODEL, prompt="abc", max_tokens=8,
                                                                   temperature=0, stream=True)]
            return streamed, plain.choices[0].message.content, comp
        finally:
            await ac.close()
    streamed, plain, comp = asyncio.run(run_async())
    assert streamed == text and plain == text
    greedy = c.completions.create(model=MODEL, prompt="abc", max_tokens=8, temperature=0).choices[0].text
    assert "".join(ch.choices[0].text for ch in comp) == greedy and comp[-1].choices[0].finish_reason == "length"

    # a stop sequence taken from the seeded answer: the text ends right before it, streamed or not
    stop = text[6:9]
    expected = text[:text.find(stop)]
    stopped = c.chat.completions.create(**args, stop=[stop, "\x00never"])
    assert stopped.choices[0].message.content == expected and stopped.choices[0].finish_reason == "stop"
    assert stopped.usage.completion_tokens < 24
    streamed_stop = list(c.chat.completions.create(**args, stop=stop, stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in streamed_stop) == expected
    assert streamed_stop[-1].choices[0].finish_reason == "stop"


def _conversations(c, n_users: int = 3) -> list[tuple[list[int], int]]:
    """Chat turns sharing a system prompt, greedy and seeded: (token ids, cached prompt tokens)."""
    out = []
    for i in range(n_users):
        for temperature in (0, 0.8):
            r = c.chat.completions.create(
                model=MODEL, messages=[{"role": "system", "content": SYSTEM},
                                       {"role": "user", "content": f"question {i}"}],
                max_tokens=20, temperature=temperature, seed=5, extra_body={"return_token_ids": True})
            out.append((r.choices[0].model_extra["token_ids"], r.usage.prompt_tokens_details.cached_tokens))
    return out


def test_prefix_reuse_is_exact_same_tokens_with_the_cache_on_and_off():
    with InferenceServer("builtin:tiny-decoder", admin=False) as on, \
            InferenceServer("builtin:tiny-decoder", "--kv-cache-mb", "0", admin=False) as off:
        with_cache = _conversations(client(on))
        without = _conversations(client(off))
        load_on, load_off = get_json(on, "/v1/load"), get_json(off, "/v1/load")
    assert [ids for ids, _ in with_cache] == [ids for ids, _ in without]
    system_tokens = len(f"system: {SYSTEM}\n")
    # every turn after the first found the shared system prompt's blocks
    assert with_cache[0][1] == 0
    assert all(cached >= system_tokens - 16 for _, cached in with_cache[1:])
    assert all(cached == 0 for _, cached in without)
    assert load_on["prefix_cache_hit_rate"] > 0.5 and load_off["prefix_cache_hit_rate"] == 0


def test_a_chat_turn_reuses_the_cached_blocks_of_the_answer_before_it(server):
    """The next turn resends the answer after the same `assistant: ` it was generated after, so
    the blocks the generation cached (its prompt and every generated id but the last) match:
    here the first prompt ends one token short of a block, which the answer completes."""
    from mcp26.inference.tokenizer import chat_prompt, encode
    c = client(server)
    msgs = [{"role": "system", "content": "Reuse check."}, {"role": "user", "content": "Say something!!!!!!!!!!!"}]
    prompt1 = encode(chat_prompt(msgs))
    first = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0,
                                      extra_body={"return_token_ids": True})
    generated = first.choices[0].model_extra["token_ids"]
    text = first.choices[0].message.content
    ok_bytes = encode(text.split("\ufffd")[0])               # the text's bytes as generated (tiny-decoder
    assert generated[:len(ok_bytes)] == ok_bytes              # answers random bytes: U+FFFD soon)
    msgs2 = msgs + [{"role": "assistant", "content": text}, {"role": "user", "content": "And then?"}]
    second = c.chat.completions.create(model=MODEL, messages=msgs2, max_tokens=2, temperature=0)
    held = prompt1 + generated[:-1]                           # what the first request left cached
    prompt2 = encode(chat_prompt(msgs2))
    common = next(i for i, (a, b) in enumerate(zip(held + [None], prompt2)) if a != b)
    expected = min(common, len(prompt2) - 1) // 16 * 16
    assert expected > len(prompt1) // 16 * 16, (              # a block holding answer tokens is reused
        f"the answer's {len(ok_bytes)} bytes as generated do not complete the block the prompt's "
        f"{len(prompt1)} tokens end in")
    assert second.usage.prompt_tokens_details.cached_tokens == expected


def test_kv_utilisation_of_a_live_sequence_and_idle_blocks_reclaimed():
    ids = [int(x) for x in np.random.default_rng(4).integers(0, 256, 500)]

    def triton_step(tokens, **params):
        body = {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, len(tokens)], "data": tokens}],
                "parameters": {"sequence_id": 5, **params}}
        status, _, _ = post(s, f"/v2/models/{MODEL}/infer", json.dumps(body).encode())
        assert status == 200
    with InferenceServer("builtin:tiny-decoder", "--kv-cache-mb", "1", "--kv-idle-seconds", "0.6",
                         admin=False) as s:
        triton_step(ids, sequence_start=True)            # a live Triton sequence of 500 tokens
        load = get_json(s, "/v1/load")
        assert load["kv_cache_utilization"] == pytest.approx(500 * BYTES_PER_TOKEN / (1 << 20), rel=1e-3)
        assert metric(s.metrics(), "vllm:kv_cache_usage_perc") == pytest.approx(load["kv_cache_utilization"])
        triton_step([1], sequence_end=True)
        after_end = get_json(s, "/v1/load")
        # nothing live, but the 31 full blocks stay cached for a prompt that starts the same way
        assert after_end["kv_cache_utilization"] == 0 and after_end["kv_blocks"] == 31
        r = client(s).completions.create(model=MODEL, prompt=ids, max_tokens=2, temperature=0)
        assert r.usage.prompt_tokens_details.cached_tokens == 31 * 16
        t0 = time.monotonic()
        while get_json(s, "/v1/load")["kv_blocks"] and time.monotonic() - t0 < 5:
            time.sleep(0.05)
        waited = time.monotonic() - t0
        final = get_json(s, "/v1/load")
        assert final["kv_blocks"] == 0 and final["kv_cache_bytes"] == 0
        assert 0.4 <= waited < 3, waited                 # not before the idle time; soon after it
        r = client(s).completions.create(model=MODEL, prompt=ids, max_tokens=2, temperature=0)
        assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_load_report_moves_under_load():
    # A long batching delay holds requests in the queue long enough to be seen (plain Triton
    # batching: the fast path would send a request the idle instance can take at once).
    with InferenceServer("builtin:tiny-decoder", "--qos-policy", "throughput", "--max-queue-delay-us", "300000",
                         "--no-fast-path", admin=False) as s:
        idle = get_json(s, "/v1/load")
        assert (idle["waiting"], idle["running"]) == (0, 0)
        seen = {"waiting": 0, "running": 0, "metric_waiting": 0.0}
        done = threading.Event()

        def poll():
            while not done.is_set():
                load = get_json(s, "/v1/load")
                seen["waiting"] = max(seen["waiting"], load["waiting"])
                seen["running"] = max(seen["running"], load["running"])
                if load["waiting"] and not seen["metric_waiting"]:
                    seen["metric_waiting"] = metric(s.metrics(), "vllm:num_requests_waiting")
                time.sleep(0.02)
        poller = threading.Thread(target=poll)
        poller.start()
        errors = []

        def one(i):
            try:
                client(s).completions.create(model=MODEL, prompt=f"request {i} " * 3, max_tokens=3, temperature=0)
            except Exception as e:
                errors.append(repr(e))
        workers = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(30)
        done.set()
        poller.join(10)
        assert not errors, errors
        after = get_json(s, "/v1/load")
        status, headers, _ = post(s, "/v1/completions", json.dumps({"model": MODEL, "prompt": "x",
                                                                    "max_tokens": 1}).encode())
    assert seen["waiting"] >= 4 and seen["running"] >= 4, seen
    assert seen["metric_waiting"] >= 1, seen
    assert (after["waiting"], after["running"]) == (0, 0) and after["tokens_per_second"] > 0
    orca = {k.strip(): v for k, _, v in (p.partition(":") for p in headers["endpoint-load-metrics"][5:].split(","))}
    assert status == 200 and {"named_metrics.queue_depth", "named_metrics.waiting", "named_metrics.running",
                              "named_metrics.kv_cache_utilization"} <= set(orca)
