"""Multi-turn chat sessions for bench_epp, open loop.

The work: sessions that each open with one of a few shared system prompts (as
the apps behind one gateway share theirs), each turn the whole history so far
(system prompt, earlier user messages, earlier answers) plus a new user
message -- so the replica that served the session's last turn holds most of
the next prompt in its KV cache, and a replica that served another session of
the same app holds the system prompt. Generated deterministically from a
seed, answered greedily (temperature 0), so every variant of the benchmark
does exactly the same work.

Two named shapes (PRESETS); what routing can win depends entirely on which:

- "chat" (the default): realistic multi-turn chat, shaped like GIE's
  prefix-cache benchmarks (benchmarking/prefix-cache-aware: many prefix
  groups whose cached prefixes together exceed one server's cache, so where a
  request lands decides whether it hits). 45 sessions started at 1.5/s over
  30 s, each opening with one of 6 system prompts (100-250 tokens: byte-level
  tokens), 6-10 turns of 80-200-token user messages and 24-token answers, 2 s
  of thinking between turns; by the last turns the session's own history is
  over 3/4 of its prompt (tiny-decoder's 2,048-token context is the cap:
  make_sessions drops turns that would not fit). The working set the replicas'
  counters measure is ~10.3 MB of KV; each replica's budget is 6 MB (12,288
  tokens at tiny-decoder's 512 B a token): more than one replica holds, less
  than two. A balancer that scatters a session's turns makes every replica
  hold every session, so each evicts what the session's next turn needs; one
  that keeps a session together holds only its share. The think time stays
  under the replicas' 5 s idle reclaim of unreferenced blocks. The ratio moves
  with the budget: on a quiet machine, 6 MB gave EPP/LEAST_REQUEST 1.61x
  (2 replicas) and 1.84x (3); 4 MB gave 1.50x and 2.17x (at 4 MB two replicas
  cannot hold half the working set each, so the picker's affinity misses too).
  What any picker could reach at all (hit_ceiling: every block an earlier
  request made is held, nothing forgotten) is 0.79 on this work: a session's
  first turn can hit only its system prompt, and each turn computes its new
  user message and the previous answer (the cache holds the answer as
  generated, right after `assistant:`; the next prompt resends it after
  `assistant: `, so the blocks differ from there on). So 2x
  LEAST_REQUEST is possible only where LEAST_REQUEST hits under 0.40. The 6 MB
  budget stays (scheduler/README.md "Benchmark", KV-budget sweep 4-8 MB):
  no budget lets two replicas' pool hold the working set while LEAST_REQUEST
  stays under half the ceiling -- at two replicas it lands a turn where the
  session's previous turn was half the time -- and the 2x floor held only at
  4 MB with 3 replicas (`--kv-cache-mb 4`: 2.06x, TTFT p99 1.18x
  LEAST_REQUEST's), where 2 replicas' 8 MB cannot hold the working set and
  the EPP reached 1.51x.
- "shared-prompt" (the earlier shape, kept to compare): 3-6 short turns
  (40-120 tokens, 16-token answers) after 300-600-token system prompts, a
  64 MB budget that holds everything: the few system prompts end up cached on
  every replica and are most of every prompt, so any balancer hits ~0.7 and
  prefix affinity can add little.

Open loop: session i starts at t0 + i / rate whatever happened before; its
turn k+1 is due `think_s` after turn k's answer (a user reads, then types).
Latency counts from the due time, so a generator or gateway that falls behind
shows up in the figures instead of lowering the offered load (no coordinated
omission); the offered work does not shrink when the system slows down.
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field, replace

import aiohttp

from inference_backend.decoder import MAX_CONTEXT
from inference_backend.kv_blocks import BLOCK_TOKENS, prefix_digests
from inference_backend.tokenizer import chat_prompt, encode

WORDS = ("the mesh routes each request to a replica that already holds its prefix so the model "
         "skips work it has done before while queues stay short and tokens keep flowing under load "
         "policy gateway cache block session turn answer question system prompt context budget "
         "latency throughput endpoint picker envoy cluster metric scrape weight score filter").split()
CLASSES = ("standard", "latency-critical", "batch")


@dataclass
class Session:
    sid: str
    group: int                      # which shared system prompt
    qos: str                        # x-mcp-qos-class: standard, latency-critical or batch
    system: str
    user_turns: list[str]


@dataclass
class TurnResult:
    sid: str
    turn: int
    qos: str
    status: int                     # HTTP status; 0: no answer (connection error or timeout)
    ttft_ms: float | None = None    # due time -> first SSE data chunk
    total_ms: float | None = None   # due time -> [DONE]
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    due_s: float = 0.0              # when it was due, seconds after the run's t0
    answer: str = ""                # the answer's text, as the next turn resends it


@dataclass
class Workload:
    """The defaults are the "shared-prompt" shape; PRESETS["chat"] is the realistic one."""
    sessions: int = 120
    rate: float = 2.0               # sessions started per second
    think_s: float = 0.5
    groups: int = 8                 # distinct system prompts
    system_bytes: tuple[int, int] = (300, 600)
    user_bytes: tuple[int, int] = (40, 120)
    turns: tuple[int, int] = (3, 6)
    max_tokens: int = 16
    critical_every: int = 10        # session i is latency-critical when i % 10 == 5
    batch_every: int = 10           # and batch (sheddable) when i % 10 == 0
    seed: int = 14
    kv_cache_mb: float = 64         # each replica's KV-cache budget (the bench passes it to `mcpctl serve`)


# Seconds of session starts per round in each shape: chat's 45 sessions at 1.5/s, shared-prompt's
# 60 at 3/s (bench_epp's --seconds overrides). See the module docstring for the why of each figure.
PRESETS = {
    "chat": Workload(rate=1.5, think_s=2.0, groups=6, system_bytes=(100, 250), user_bytes=(80, 200),
                     turns=(6, 10), max_tokens=24, kv_cache_mb=6),
    "shared-prompt": Workload(rate=3.0, think_s=0.5, groups=8, kv_cache_mb=64),
}
PRESET_SECONDS = {"chat": 30.0, "shared-prompt": 20.0}
# An answer's bytes as the next prompt resends them: a generated byte that is not valid UTF-8
# comes back as U+FFFD, 3 bytes (inference_backend.tokenizer).
ANSWER_BYTES_PER_TOKEN = 3


def preset(name: str, **overrides) -> Workload:
    return replace(PRESETS[name], **overrides)


def _text(rng: random.Random, size: int) -> str:
    out = []
    n = 0
    while n < size:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:size]


def make_sessions(w: Workload) -> list[Session]:
    rng = random.Random(w.seed)
    systems = [f"You are assistant {g} of the mesh. " + _text(rng, rng.randint(*w.system_bytes))
               for g in range(w.groups)]
    out = []
    for i in range(w.sessions):
        group = rng.randrange(w.groups)
        qos = ("batch" if w.batch_every and i % w.batch_every == 0 else
               "latency-critical" if w.critical_every and i % w.critical_every == w.critical_every // 2 else
               "standard")
        turns = [_text(rng, rng.randint(*w.user_bytes)) + "?" for _ in range(rng.randint(*w.turns))]
        turns = _fitting(systems[group], turns, w.max_tokens)
        out.append(Session(f"s{w.seed}-{i}", group, qos, systems[group], turns))
    return out


def _fitting(system: str, turns: list[str], max_tokens: int) -> list[str]:
    """The turns whose prompt (with the longest answers before it) and answer fit the model's
    context: a turn past it would be a 400, not work."""
    answer = "\ufffd" * max_tokens          # 3 bytes each: the longest an answer can come back
    messages = [{"role": "system", "content": system}]
    for k, user in enumerate(turns):
        messages.append({"role": "user", "content": user})
        if len(chat_prompt(messages).encode()) + max_tokens > MAX_CONTEXT:
            return turns[:k]
        messages.append({"role": "assistant", "content": answer})
    return turns


def request_body(messages: list[dict], max_tokens: int) -> bytes:
    return json.dumps({"model": "tiny-decoder", "messages": messages, "max_tokens": max_tokens,
                       "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}).encode()


async def _turn(http: aiohttp.ClientSession, url: str, s: Session, k: int, messages: list[dict],
                max_tokens: int, due: float, timeout_s: float, t0: float) -> tuple[TurnResult, str]:
    result = TurnResult(s.sid, k, s.qos, 0, due_s=due - t0)
    headers = {"content-type": "application/json", "x-session-id": s.sid}
    if s.qos != "standard":
        headers["x-mcp-qos-class"] = s.qos
    text = []
    try:
        async with asyncio.timeout(timeout_s):
            async with http.post(url, data=request_body(messages, max_tokens), headers=headers) as resp:
                result.status = resp.status
                if resp.status != 200:
                    result.error = (await resp.text())[:200]
                    return result, ""
                async for line in resp.content:
                    if not line.startswith(b"data: "):
                        continue
                    if result.ttft_ms is None:
                        result.ttft_ms = (time.perf_counter() - due) * 1000
                    data = line[6:].strip()
                    if data == b"[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        result.error = str(chunk["error"].get("message"))[:200]
                    for c in chunk.get("choices") or ():
                        text.append(c.get("delta", {}).get("content") or "")
                    if chunk.get("usage"):
                        u = chunk["usage"]
                        result.completion_tokens = u.get("completion_tokens", 0)
                        result.prompt_tokens = u.get("prompt_tokens", 0)
                        result.cached_tokens = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        result.total_ms = (time.perf_counter() - due) * 1000
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
        result.status, result.error = 0, f"{type(e).__name__}: {e}"[:200]
    return result, "".join(text)


async def _session(http, url: str, s: Session, start: float, w: Workload, timeout_s: float,
                   out: list[TurnResult], t0: float) -> None:
    messages = [{"role": "system", "content": s.system}]
    due = start
    for k, user in enumerate(s.user_turns):
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        messages.append({"role": "user", "content": user})
        result, answer = await _turn(http, url, s, k, messages, w.max_tokens, due, timeout_s, t0)
        result.answer = answer
        out.append(result)
        if result.status != 200 or result.error:
            return                  # shed or failed: this user gives up (the rest is counted as abandoned)
        messages.append({"role": "assistant", "content": answer})
        due = time.perf_counter() + w.think_s


async def run_sessions(url: str, sessions: list[Session], w: Workload,
                       timeout_s: float = 30.0) -> tuple[list[TurnResult], float]:
    """Every session against `url` (…/v1/chat/completions); -> (results, wall seconds)."""
    out: list[TurnResult] = []
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as http:
        t0 = time.perf_counter() + 0.2
        tasks = [asyncio.create_task(_session(http, url, s, t0 + i / w.rate, w, timeout_s, out, t0))
                 for i, s in enumerate(sessions)]
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    return out, wall


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    v = sorted(values)
    rank = max(1, -(-len(v) * q // 100))        # ceil(n * q / 100), at least 1
    return v[int(min(rank, len(v))) - 1]


@dataclass
class Summary:
    requests: int = 0
    ok: int = 0
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    total_p50_ms: float | None = None
    total_p99_ms: float | None = None
    tokens_per_s: float = 0.0
    cached_share: float | None = None            # usage.cached_tokens / prompt_tokens, OK turns
    refused_by_class: dict = field(default_factory=dict)    # {class: {status: n}} for non-200 answers
    failed: int = 0                              # no answer, or an error event in the stream
    abandoned_turns: int = 0                     # turns never sent because an earlier one was refused


def summarise(results: list[TurnResult], sessions: list[Session], wall_s: float) -> Summary:
    ok = [r for r in results if r.status == 200 and not r.error]
    s = Summary(requests=len(results), ok=len(ok))
    ttft = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    total = [r.total_ms for r in ok if r.total_ms is not None]
    s.ttft_p50_ms, s.ttft_p99_ms = percentile(ttft, 50), percentile(ttft, 99)
    s.total_p50_ms, s.total_p99_ms = percentile(total, 50), percentile(total, 99)
    s.tokens_per_s = sum(r.completion_tokens for r in ok) / wall_s if wall_s > 0 else 0.0
    prompt = sum(r.prompt_tokens for r in ok)
    s.cached_share = sum(r.cached_tokens for r in ok) / prompt if prompt else None
    for r in results:
        if r.status not in (0, 200):
            by = s.refused_by_class.setdefault(r.qos, {})
            by[str(r.status)] = by.get(str(r.status), 0) + 1
        elif r.status == 0 or r.error:
            s.failed += 1
    s.abandoned_turns = sum(len(x.user_turns) for x in sessions) - len(results)
    return s


def prefix_hits(loads_before: list[dict], loads_after: list[dict]) -> tuple[int, int]:
    """(hits, queries) of prompt tokens over the replicas between two `GET /v1/load` snapshots."""
    hits = queries = 0
    for before, after in zip(loads_before, loads_after):
        for key in ("prefix_cache_hits", "prefix_cache_queries"):
            delta = _model_sum(after, key) - _model_sum(before, key)
            if key == "prefix_cache_hits":
                hits += delta
            else:
                queries += delta
    return hits, queries


def working_set_tokens(results: list[TurnResult]) -> int:
    """The most prompt tokens the sessions alive at one moment had sent (each session counted
    at its latest turn, from its first turn's due time to its last turn's end): what the pool's
    KV caches must hold at once for every session's next turn to hit."""
    spans: dict[str, list] = {}
    for r in results:
        if r.status != 200 or r.total_ms is None:
            continue
        span = spans.setdefault(r.sid, [r.due_s, 0.0, []])
        span[0] = min(span[0], r.due_s)
        span[1] = max(span[1], r.due_s + r.total_ms / 1000)
        span[2].append((r.due_s, r.prompt_tokens + r.completion_tokens))
    events = []
    for start, end, turns in spans.values():
        prev = 0
        for due, tokens in sorted(turns):
            events.append((due, tokens - prev))   # the session's history grows at each turn
            prev = tokens
        events.append((end, -prev))
    live = peak = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
        live += delta
        peak = max(peak, live)
    return peak


def turn_tokens(sessions: list[Session], results: list[TurnResult]) -> list[tuple[float, list[int], list[int]]]:
    """Each answered turn as a replica saw it, in the order they were due: (due_s, the prompt's
    token ids, the ids the replica's KV cache keeps after the prompt). A generation's last token
    is sampled but never fed back, so the cache holds the answer's ids but the last; those are
    known from the text only up to its first U+FFFD (an invalid byte, whose id the text lost), so
    the answer is cut there. (They hardly matter: the next prompt resends the answer after
    `assistant: `, so its blocks diverge where the answer starts.)"""
    by_sid = {s.sid: s for s in sessions}
    answers = {(r.sid, r.turn): r.answer for r in results if r.status == 200 and not r.error}
    due = {(r.sid, r.turn): r.due_s for r in results}
    out = []
    for (sid, k), answer in answers.items():
        s = by_sid[sid]
        messages = [{"role": "system", "content": s.system}]
        for j in range(k):
            messages += [{"role": "user", "content": s.user_turns[j]},
                         {"role": "assistant", "content": answers[(sid, j)]}]
        messages.append({"role": "user", "content": s.user_turns[k]})
        exact = answer.split("\ufffd", 1)[0]           # ids known before the first invalid byte
        kept = encode(answer)[:-1] if exact == answer else encode(exact)
        out.append((due[(sid, k)], encode(chat_prompt(messages)), kept))
    out.sort(key=lambda t: t[0])
    return out


def hit_ceiling(turns, block_tokens: int = BLOCK_TOKENS) -> tuple[int, int]:
    """(hits, queries) in prompt tokens, counted as the replicas' `/v1/load` counters count them
    (inference_backend.kv_blocks: a prompt looks up the full blocks of all but its last token --
    one token is always run -- and a hit is the longest run of leading blocks held, in whole
    blocks; every prompt token is a query), for a cache that never forgets and a picker that
    always sends a request where every block any earlier request made is held: the best any
    picker can do on this work. `turns`: (prompt ids, ids cached after the prompt) in the order
    they are sent (a 3-tuple with a leading due time is also taken). An upper bound: a block
    counts as held as soon as the request that makes it was sent, and never reclaimed."""
    held: set[bytes] = set()
    hits = queries = 0
    for t in turns:
        prompt, after = t[-2], t[-1]
        n = 0
        for d in prefix_digests(prompt[:len(prompt) - 1], "", block_tokens):
            if d not in held:
                break
            n += 1
        hits += n * block_tokens
        queries += len(prompt)
        held.update(prefix_digests(list(prompt) + list(after), "", block_tokens))
    return hits, queries


def _model_sum(load: dict, key: str) -> int:
    return sum(int(m.get(key, 0)) for m in load.get("models", ()))
