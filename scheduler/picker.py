"""One scheduling decision, as the Gateway API Inference Extension's
scheduler shapes it: filters -> scorers -> picker. Pure: a request and the
candidates' state in, a pick (an endpoint and its fallbacks) or a refusal out.

Filters: ready endpoints, within the proxy's subset hint; when the pool is
saturated a sheddable request is refused (429) -- the lowest class goes
first -- and a critical one is kept to the least loaded endpoints.
Scorers (each 0..1, weighted): queue (the larger of waiting + running and
this picker's in flight there; 1 for the least loaded, 0 at QUEUE_SPREAD
requests more), KV-cache utilisation (1 - utilisation), prefix
affinity (the share of the prompt's leading blocks this endpoint was sent
before), session affinity (the endpoint the session used last), and for a
session's first request only, session spread (1 for the endpoint with the
fewest live sessions, 0 at SESSION_SPREAD more): where a chat session starts
is where its growing history will be cached, so new sessions are placed
evenly instead of following the shared system prompt they open with.
Picker: the highest total; ties go to the endpoint with fewer requests in
flight, then round robin. The next best endpoints follow as fallbacks.
"""
from __future__ import annotations

import hashlib
import itertools
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from mcp26.scheduler.metrics import Load

PREFIX_BLOCK_CHARS = 64          # GIE's prefix plugin hashes characters in blocks too
MAX_PREFIX_BLOCKS = 256          # of a prompt's start: long prompts cost the same
PREFIX_LRU_BLOCKS = 50_000       # remembered per endpoint
SESSIONS_KEPT = 100_000
# The queue score falls from 1 (the least loaded candidate) to 0 at this many requests more:
# absolute, not min-max (with two candidates min-max is all or nothing for a difference of
# one request). One request more costs less than a held prefix, two more outweigh it: in
# benchmarks/bench_epp.py a spread of 4 let shared system prompts pile 60/40 onto one
# replica; 2 kept the picks even at the same prefix-hit rate.
QUEUE_SPREAD = 2.0
# A session is live (it counts towards its endpoint's share) until it has been quiet this long:
# longer than a user's pause between turns; the replicas' caches keep idle blocks less (5 s).
SESSION_LIVE_S = 30.0
# The spread score falls from 1 (the endpoint with the fewest live sessions) to 0 at this many
# more: benchmarks/bench_epp.py --preset chat, where each session's history is most of its prompts.
SESSION_SPREAD = 2.0
# A live session's request is picked on its headers alone (pick_by_session) while its endpoint's
# queue is at most this many requests longer than the shortest: the queue scorer costs it
# 1.5 (weight 3 over QUEUE_SPREAD 2) against the ~2.5-3 its held history and the session add.
SESSION_QUEUE_SLACK = 1.0


@dataclass(frozen=True)
class Weights:
    # Prefix affinity is what saves work (a cached prefix is prefill not run); session
    # affinity only adds to it what blocks cannot see (a prompt shorter than a block), so it
    # stays below the queue's full weight: a session moves off a replica QUEUE_SPREAD requests
    # busier (scheduler/README.md "Benchmark").
    queue: float = 3.0
    kv_cache: float = 1.0
    prefix: float = 3.0
    session: float = 1.0
    # Only on a session's first request, where the prefix held is at most the shared system
    # prompt (recomputed once per endpoint) while the placement decides where the session's
    # history, soon the larger part of every prompt, is cached.
    spread: float = 2.0


@dataclass(frozen=True)
class Saturation:
    """An endpoint is saturated when its queue or KV cache is past these
    (GIE's defaults: queue depth 5, KV-cache utilisation 0.8); the pool is
    saturated when every candidate is."""
    queue_depth: float = 5.0
    kv_utilisation: float = 0.8


@dataclass
class Request:
    prompt: str = ""
    session: str | None = None
    sheddable: bool = False            # negative InferenceObjective priority, or the batch class
    critical: bool = False             # latency-critical class or a positive priority
    subset: tuple[str, ...] | None = None   # the proxy's subset hint (None: no hint)

    def blocks(self) -> list[bytes]:
        """Hash chain of the prompt's leading blocks: block i's hash covers blocks 0..i."""
        out, h = [], b""
        text = self.prompt[:PREFIX_BLOCK_CHARS * MAX_PREFIX_BLOCKS]
        for i in range(0, len(text) - PREFIX_BLOCK_CHARS + 1, PREFIX_BLOCK_CHARS):
            h = hashlib.blake2b(h + text[i:i + PREFIX_BLOCK_CHARS].encode(), digest_size=8).digest()
            out.append(h)
        return out


@dataclass
class Pick:
    endpoints: list[str]                       # first: the pick; then fallbacks in order
    scores: dict[str, float] = field(default_factory=dict)
    prefix_hit: float = 0.0                    # share of the prompt's blocks the pick held
    prompt_blocks: int = 0                     # how many blocks the prompt has (0: no prefix to match)


@dataclass
class Refusal:
    status: int                                # 503: nothing eligible; 429: shed
    reason: str


class Scheduler:
    """Holds what decisions learn from: per-endpoint prefix LRU, sessions, in-flight counts."""

    def __init__(self, weights: Weights = Weights(), saturation: Saturation = Saturation(), fallbacks: int = 2,
                 clock=time.monotonic):
        self.weights, self.saturation, self.fallbacks, self.clock = weights, saturation, fallbacks, clock
        self.prefixes: dict[str, OrderedDict] = {}
        self.sessions: OrderedDict[str, str] = OrderedDict()
        self.live: OrderedDict[str, tuple[str, float]] = OrderedDict()   # session -> (endpoint, last seen), oldest first
        self.live_sessions: dict[str, int] = {}                          # endpoint -> live sessions there
        self.inflight: dict[str, int] = {}
        self._rr = itertools.count()

    # -- the decision -------------------------------------------------------------
    def pick(self, request: Request, endpoints: list[str], loads: dict[str, Load]) -> Pick | Refusal:
        candidates = [e for e in endpoints if (loads.get(e) or Load()).ready]
        if request.subset is not None:
            allowed = set(request.subset)
            candidates = [e for e in candidates if e in allowed]
            if not candidates:
                return Refusal(503, "no ready endpoint in the subset hint")
        if not candidates:
            return Refusal(503, "no ready endpoint in the pool")
        unsaturated = [e for e in candidates if not self._saturated(loads[e], e)]
        if not unsaturated:
            if request.sheddable:
                return Refusal(429, "pool saturated: sheddable request dropped")
        elif request.critical or request.sheddable:
            # Critical requests avoid saturated endpoints; sheddable ones never add to them.
            candidates = unsaturated
        blocks = request.blocks()
        now = self.clock()
        self._expire(now)
        scores = self._scores(request, blocks, candidates, loads)
        start = next(self._rr)
        order = sorted(range(len(candidates)), key=lambda i: (-scores[candidates[i]],
                                                              self.inflight.get(candidates[i], 0),
                                                              (i - start) % len(candidates)))
        ranked = [candidates[i] for i in order]
        chosen = ranked[0]
        hit = self._prefix_share(chosen, blocks)
        self._learn(request, blocks, chosen, now)
        return Pick(ranked[:1 + self.fallbacks], scores, hit, len(blocks))

    def pick_by_session(self, request: Request, endpoints: list[str], loads: dict[str, Load]) -> Pick | None:
        """A request of a live session picked without its body: the session's endpoint, where
        the full decision would send it anyway (ready, within the subset hint, not saturated,
        its queue within SESSION_QUEUE_SLACK of the shortest) -- so the picker need not read the
        body (one ext_proc message instead of two). None: decide on the body (`pick`)."""
        if not request.session:
            return None
        now = self.clock()
        self._expire(now)
        live = self.live.get(request.session)
        endpoint = live[0] if live else None
        if endpoint is None or endpoint not in endpoints:
            return None
        if request.subset is not None and endpoint not in request.subset:
            return None
        load = loads.get(endpoint)
        if load is None or not load.ready or self._saturated(load, endpoint):
            return None
        ready = [e for e in endpoints if (loads.get(e) or Load()).ready]
        queues = {e: self._queue(loads[e], e) for e in ready}
        if queues[endpoint] - min(queues.values()) > SESSION_QUEUE_SLACK:
            return None
        self._learn(request, [], endpoint, now)            # the session stays live there
        fallbacks = sorted((e for e in ready if e != endpoint), key=lambda e: queues[e])[:self.fallbacks]
        return Pick([endpoint, *fallbacks])

    def started(self, endpoint: str) -> None:
        self.inflight[endpoint] = self.inflight.get(endpoint, 0) + 1

    def finished(self, endpoint: str) -> None:
        n = self.inflight.get(endpoint, 0)
        self.inflight[endpoint] = max(0, n - 1)

    # -- filters and scorers --------------------------------------------------------
    def _saturated(self, load: Load, endpoint: str) -> bool:
        s = self.saturation
        return load.waiting >= s.queue_depth or load.kv_utilisation >= s.kv_utilisation

    def _queue(self, load: Load, endpoint: str) -> float:
        # What this picker sent and has not seen finish is also in the server's running count
        # once scraped: the larger of the two counts each request once, and covers the 50 ms
        # before the scrape (the sum counted this picker's requests twice).
        return max(load.waiting + load.running, self.inflight.get(endpoint, 0))

    def _scores(self, request: Request, blocks: list[bytes], candidates: list[str],
                loads: dict[str, Load]) -> dict[str, float]:
        w = self.weights
        queues = {e: self._queue(loads[e], e) for e in candidates}
        lo = min(queues.values())
        session_ep = self.sessions.get(request.session) if request.session else None
        first = request.session is not None and session_ep is None
        fewest = min(self.live_sessions.get(e, 0) for e in candidates)
        out = {}
        for e in candidates:
            queue = max(0.0, 1.0 - (queues[e] - lo) / QUEUE_SPREAD)
            kv = 1.0 - loads[e].kv_utilisation
            prefix = self._prefix_share(e, blocks)
            session = 1.0 if session_ep == e else 0.0
            spread = max(0.0, 1.0 - (self.live_sessions.get(e, 0) - fewest) / SESSION_SPREAD) if first else 0.0
            out[e] = (w.queue * queue + w.kv_cache * kv + w.prefix * prefix + w.session * session +
                      w.spread * spread)
        return out

    def _prefix_share(self, endpoint: str, blocks: list[bytes]) -> float:
        """The share of leading blocks (a prefix, so stop at the first miss) `endpoint` was sent."""
        held = self.prefixes.get(endpoint)
        if not blocks or not held:
            return 0.0
        n = 0
        for b in blocks:
            if b not in held:
                break
            n += 1
        return n / len(blocks)

    def _expire(self, now: float) -> None:
        while self.live:
            sid, (endpoint, seen) = next(iter(self.live.items()))
            if now - seen < SESSION_LIVE_S and len(self.live) <= SESSIONS_KEPT:
                break
            del self.live[sid]
            self.live_sessions[endpoint] -= 1

    def _learn(self, request: Request, blocks: list[bytes], endpoint: str, now: float) -> None:
        held = self.prefixes.setdefault(endpoint, OrderedDict())
        for b in blocks:
            held[b] = True
            held.move_to_end(b)
        while len(held) > PREFIX_LRU_BLOCKS:
            held.popitem(last=False)
        if request.session:
            old = self.live.pop(request.session, None)
            if old is not None:
                self.live_sessions[old[0]] -= 1
            self.live[request.session] = (endpoint, now)
            self.live_sessions[endpoint] = self.live_sessions.get(endpoint, 0) + 1
            self.sessions[request.session] = endpoint
            self.sessions.move_to_end(request.session)
            while len(self.sessions) > SESSIONS_KEPT:
                self.sessions.popitem(last=False)
