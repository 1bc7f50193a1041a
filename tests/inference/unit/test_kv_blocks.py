"""The block KV cache (inference.kv_blocks): prefix sharing, reference counts,
idle reclaim, LRU within the budget, and that a reused past is the very past of those tokens.

The "model" here is a stand-in whose key/value at a position is a function of the
token there (as builtin:tiny-decoder's, which has no positional term): a step's
present is its past followed by the keys of the tokens it ran, so the past a plan
hands out can be checked against the tokens it claims to cover."""
from __future__ import annotations

import numpy as np

from mcp26.inference.kv_blocks import BLOCK_TOKENS, KVCache, prefix_digests

H, D = 2, 4
EMPTY = np.zeros((1, H, 0, D), np.float32)
BLOCK_BYTES = 2 * H * BLOCK_TOKENS * D * 4


def kv_of(tokens) -> np.ndarray:
    t = np.asarray(tokens, np.float32).reshape(1, 1, -1, 1)
    return np.broadcast_to(t, (1, H, len(tokens), D)).astype(np.float32) + np.arange(D, dtype=np.float32)


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def step(cache: KVCache, sid, new, start=False, end=False, version="1"):
    plan = cache.plan(sid, list(new), start, version, EMPTY)
    # the past handed out is exactly the keys of the tokens before the ones run
    covered = (plan.history + plan.new)[:plan.past_length]
    np.testing.assert_array_equal(plan.past_key, kv_of(covered) if covered else EMPTY)
    present = np.concatenate([plan.past_key, kv_of(plan.ids[0].tolist())], axis=2)
    cache.commit(plan, present, present * 2, end)
    return plan


def test_sequences_with_a_common_prefix_share_its_blocks_with_reference_counts():
    cache = KVCache(1 << 20, clock=Clock())
    shared = list(range(40))                         # two full blocks + 8
    a = step(cache, "a", shared + [200, 201], start=True)
    b = step(cache, "b", shared + [210], start=True)
    assert a.reused == 0 and b.reused == 2 * BLOCK_TOKENS     # b ran only what follows the shared blocks
    assert b.ids.shape[1] == len(shared) + 1 - 2 * BLOCK_TOKENS
    digests = prefix_digests(shared, "1")
    assert [cache.pool.blocks[d].refs for d in digests] == [2, 2]
    assert len(cache.pool.blocks) == 2                # one copy of each shared block
    step(cache, "a", [5], end=True)
    assert [cache.pool.blocks[d].refs for d in digests] == [1, 1]
    step(cache, "b", [6], end=True)
    assert [cache.pool.blocks[d].refs for d in digests] == [0, 0]
    assert set(cache.pool.free) == set(digests) and cache.utilization() == 0.0
    assert cache.bytes == 2 * BLOCK_BYTES             # unreferenced, still cached
    c = step(cache, "c", shared + [1, 2, 3], start=True)
    assert c.reused == 2 * BLOCK_TOKENS and cache.prefix_hits == 4 * BLOCK_TOKENS
    assert cache.prefix_queries == 3 * len(shared) + 6


def test_a_prompt_of_whole_cached_blocks_still_runs_its_last_token():
    cache = KVCache(1 << 20, clock=Clock())
    prompt = list(range(2 * BLOCK_TOKENS))
    step(cache, "a", prompt, start=True, end=True)
    again = step(cache, "b", prompt, start=True)
    assert again.reused == BLOCK_TOKENS and again.ids.shape[1] == BLOCK_TOKENS


def test_another_model_version_never_matches():
    cache = KVCache(1 << 20, clock=Clock())
    step(cache, "a", list(range(33)), start=True, end=True)
    assert step(cache, "b", list(range(33)), start=True, version="2").reused == 0


def test_unreferenced_blocks_are_reclaimed_after_the_idle_time_and_not_before():
    clock = Clock()
    cache = KVCache(1 << 20, idle_s=5.0, clock=clock)
    step(cache, "a", list(range(48)), start=True)          # 3 full blocks (2 shareable + ...)
    held = len(cache.pool.blocks)
    assert held == 3 and cache.utilization() > 0
    clock.t += 60
    cache.reclaim()
    assert len(cache.pool.blocks) == held                  # referenced: kept however old
    step(cache, "a", [1], end=True)
    clock.t += 4.9
    cache.reclaim()
    assert len(cache.pool.blocks) == held and cache.pool.reclaimed_idle == 0
    clock.t += 0.1
    cache.reclaim()
    assert len(cache.pool.blocks) == 0 and cache.bytes == 0 and cache.pool.reclaimed_idle == held


def test_budget_evicts_least_recently_released_free_blocks_first():
    clock = Clock()
    cache = KVCache(3 * BLOCK_BYTES + BLOCK_BYTES // 2, clock=clock)     # 3 blocks + room for a live tail
    for i, sid in enumerate("abc"):                        # one block each, released in order a, b, c
        step(cache, sid, [i * 10] * BLOCK_TOKENS + [1], start=True)
        clock.t += 1
        step(cache, sid, [2], end=True)
    assert len(cache.pool.free) == 3
    live = step(cache, "d", [77] * BLOCK_TOKENS + [1], start=True)     # needs room: evicts a's block only
    assert live.reused == 0 and cache.pool.evicted == 1
    assert step(cache, "x", [0] * BLOCK_TOKENS + [9], start=True).reused == 0       # a's: gone
    assert cache.bytes <= cache.capacity_bytes
    assert step(cache, "y", [20] * BLOCK_TOKENS + [9], start=True).reused == BLOCK_TOKENS   # c's: kept


def test_live_sequences_over_the_budget_evict_the_least_recently_used_one_which_recomputes():
    cache = KVCache(2 * BLOCK_BYTES, clock=Clock())
    step(cache, "a", list(range(20)), start=True)
    step(cache, "b", list(range(100, 120)), start=True)
    step(cache, "c", list(range(200, 220)), start=True)    # over budget: a (least recent) evicted
    assert cache.evictions >= 1 and cache.bytes <= cache.capacity_bytes
    plan = step(cache, "a", [7])                           # a miss: history rerun (step() checks the past)
    assert plan.hit is False and cache.misses == 1 and plan.recomputed + plan.reused == 20
    hits = cache.hits
    step(cache, "a", [8])
    assert cache.hits == hits + 1


def test_end_while_a_step_runs_releases_at_commit():
    cache = KVCache(1 << 20, clock=Clock())
    plan = cache.plan("g", list(range(40)), True, "1", EMPTY)
    cache.end("g")                                         # the client went away mid-step
    present = kv_of(list(range(40)))
    cache.commit(plan, present, present, end=False)
    assert cache.history("g") is None and cache.utilization() == 0.0
    assert all(b.refs == 0 for b in cache.pool.blocks.values()) and len(cache.pool.blocks) == 2


def test_zero_budget_caches_nothing():
    cache = KVCache(0, clock=Clock())
    step(cache, "a", list(range(40)), start=True)
    assert cache.bytes == 0
    plan = step(cache, "a", [1])
    assert plan.hit is False and plan.recomputed == 40 and plan.past_length == 0
