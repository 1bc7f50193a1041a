"""bench_epp's workload and arithmetic (benchmarks/epp_sessions.py), socket-free:
the same seed gives the same sessions, percentiles are nearest-rank, refusals
are counted by class, abandoned turns are the ones never sent, and the prefix
hit rate is the delta of the replicas' counters."""
from benchmarks.epp_sessions import (TurnResult, Workload, make_sessions, percentile, prefix_hits, summarise)


def test_sessions_are_deterministic_share_system_prompts_and_carry_classes():
    w = Workload(sessions=40, groups=4)
    a, b = make_sessions(w), make_sessions(w)
    assert [(s.system, s.user_turns, s.qos) for s in a] == [(s.system, s.user_turns, s.qos) for s in b]
    assert len({s.system for s in a}) == 4
    assert all(3 <= len(s.user_turns) <= 6 for s in a)
    assert all(300 <= len(s.system) - len("You are assistant 0 of the mesh. ") <= 600 for s in a)
    assert [s.qos for s in a[:10]] == ["batch"] + ["standard"] * 4 + ["latency-critical"] + ["standard"] * 4
    assert make_sessions(Workload(sessions=40, groups=4, seed=15))[0].user_turns != a[0].user_turns


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99 and percentile(values, 100) == 100
    assert percentile([7.0], 99) == 7.0 and percentile([], 50) is None


def test_summary_counts_refusals_by_class_failures_and_abandoned_turns():
    w = Workload(sessions=2, turns=(3, 3))
    sessions = make_sessions(w)
    ok = dict(status=200, ttft_ms=10.0, total_ms=40.0, completion_tokens=16, prompt_tokens=100, cached_tokens=60)
    results = [TurnResult(sessions[0].sid, 0, "batch", **ok), TurnResult(sessions[0].sid, 1, "batch", 429),
               TurnResult(sessions[1].sid, 0, "standard", **ok), TurnResult(sessions[1].sid, 1, "standard", **ok),
               TurnResult(sessions[1].sid, 2, "standard", 0, error="TimeoutError")]
    s = summarise(results, sessions, wall_s=2.0)
    assert (s.requests, s.ok, s.failed, s.abandoned_turns) == (5, 3, 1, 1)
    assert s.refused_by_class == {"batch": {"429": 1}}
    assert s.tokens_per_s == 24.0 and s.cached_share == 0.6 and s.ttft_p99_ms == 10.0


def test_prefix_hits_are_the_delta_of_each_replicas_counters():
    def load(hits, queries):
        return {"models": [{"prefix_cache_hits": hits, "prefix_cache_queries": queries}]}
    assert prefix_hits([load(10, 100), load(0, 0)], [load(70, 200), load(30, 100)]) == (90, 200)


def test_the_chat_preset_fits_the_context_shares_system_prompts_and_history_dominates():
    from mcp26.inference.decoder import MAX_CONTEXT
    from mcp26.inference.tokenizer import chat_prompt
    from benchmarks.epp_sessions import ANSWER_BYTES_PER_TOKEN, preset
    w = preset("chat", sessions=45)
    sessions = make_sessions(w)
    assert len({s.system for s in sessions}) == w.groups
    shares = []
    for s in sessions:
        assert len(s.user_turns) >= w.turns[0]
        messages = [{"role": "system", "content": s.system}]
        for user in s.user_turns:       # the longest answers the model can give, resent
            messages.append({"role": "user", "content": user})
            last = len(chat_prompt(messages).encode())
            messages.append({"role": "assistant", "content": "\ufffd" * w.max_tokens})
        assert last + w.max_tokens <= MAX_CONTEXT
        assert len("\ufffd".encode()) == ANSWER_BYTES_PER_TOKEN
        shares.append(len(s.system) / last)
    assert sum(shares) / len(shares) < 0.25      # the session's own history is most of its last prompt


def test_turns_that_would_not_fit_the_context_are_dropped():
    sessions = make_sessions(Workload(sessions=3, user_bytes=(700, 700), turns=(5, 5)))
    assert all(1 <= len(s.user_turns) < 5 for s in sessions)


def test_the_working_set_is_the_most_history_live_at_once():
    from benchmarks.epp_sessions import working_set_tokens
    ok = dict(status=200, completion_tokens=0)
    results = [TurnResult("a", 0, "standard", prompt_tokens=100, due_s=0.0, total_ms=1000, **ok),
               TurnResult("a", 1, "standard", prompt_tokens=250, due_s=2.0, total_ms=1000, **ok),
               TurnResult("b", 0, "standard", prompt_tokens=300, due_s=2.5, total_ms=1500, **ok),
               TurnResult("c", 0, "standard", 429, prompt_tokens=999, due_s=2.5, total_ms=1.0)]
    # a's history is 250 from t=2 to its end at 3; b's 300 from 2.5 to 4; c was refused.
    assert working_set_tokens(results) == 550
