"""Multi-turn chat sessions for bench_epp, open loop.

The work: sessions of 3-6 turns, each opening with one of a few shared system
prompts (as the apps behind one gateway share theirs), each turn the whole
history so far plus a new user message -- so a replica that served the
session's last turn, or another session of the same app, holds a prefix of
the prompt in its KV cache. Generated deterministically from a seed, and
answered greedily (temperature 0), so every variant of the benchmark does
exactly the same work.

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
from dataclasses import dataclass, field

import aiohttp

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


@dataclass
class Workload:
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
        out.append(Session(f"s{w.seed}-{i}", group, qos, systems[group], turns))
    return out


def request_body(messages: list[dict], max_tokens: int) -> bytes:
    return json.dumps({"model": "tiny-decoder", "messages": messages, "max_tokens": max_tokens,
                       "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}).encode()


async def _turn(http: aiohttp.ClientSession, url: str, s: Session, k: int, messages: list[dict],
                max_tokens: int, due: float, timeout_s: float) -> tuple[TurnResult, str]:
    result = TurnResult(s.sid, k, s.qos, 0)
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
                   out: list[TurnResult]) -> None:
    messages = [{"role": "system", "content": s.system}]
    due = start
    for k, user in enumerate(s.user_turns):
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        messages.append({"role": "user", "content": user})
        result, answer = await _turn(http, url, s, k, messages, w.max_tokens, due, timeout_s)
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
        tasks = [asyncio.create_task(_session(http, url, s, t0 + i / w.rate, w, timeout_s, out))
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


def _model_sum(load: dict, key: str) -> int:
    return sum(int(m.get(key, 0)) for m in load.get("models", ()))
