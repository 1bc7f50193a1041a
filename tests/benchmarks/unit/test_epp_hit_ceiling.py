"""benchmarks.epp_sessions.hit_ceiling: the best prefix-hit rate any picker could reach on a
workload, counted as a replica's KV cache counts it -- checked on hand-made token sequences and
against inference.kv_blocks.KVCache itself with a budget that never evicts."""
import numpy as np

from benchmarks.epp_sessions import Session, TurnResult, hit_ceiling, turn_tokens
from mcp26.inference.kv_blocks import KVCache
from mcp26.inference.tokenizer import chat_prompt, encode


def test_first_prompt_hits_nothing_and_a_shared_prefix_hits_in_whole_blocks():
    a = list(range(10))                        # blocks of 4: [0-3] [4-7], tail 8 9
    b = list(range(8)) + [20, 21, 22]          # the same two leading blocks, then its own
    assert hit_ceiling([(a, []), (b, [])], block_tokens=4) == (8, 21)


def test_the_last_prompt_token_is_always_run():
    a = list(range(10))
    c = list(range(8))                         # both its blocks are held, but only [0-3] is looked up
    assert hit_ceiling([(a, []), (c, [])], block_tokens=4) == (4, 18)


def test_answer_ids_count_only_as_far_as_the_cache_holds_them():
    a = list(range(10))
    d = a + [100, 101, 102, 103, 5]           # the answer resent after the prompt
    with_answer = hit_ceiling([(a, [100, 101, 102]), (d, [])], block_tokens=4)
    without = hit_ceiling([(a, []), (d, [])], block_tokens=4)
    assert with_answer == (12, 25)             # [8 9 100 101] was made by the answer's decode steps
    assert without == (8, 25)


def test_a_diverging_block_ends_the_prefix_even_if_later_blocks_match():
    a = list(range(12))
    e = [0, 1, 2, 3, 9, 9, 9, 9, 8, 9, 10, 11, 0]   # block 3 equals a's, but block 2 does not
    assert hit_ceiling([(a, []), (e, [])], block_tokens=4) == (4, 25)


def _replica_counts(turns, block_tokens):
    """What one replica's counters read after serving `turns` in order with a cache that keeps
    everything: prefill, one decode step per cached answer id, then the generation's end."""
    cache = KVCache(capacity_bytes=1 << 40, block_tokens=block_tokens, idle_s=1e9)
    empty = np.zeros((1, 1, 0, 1), np.float32)
    for i, (prompt, after) in enumerate(turns):
        steps = [(list(prompt), True)] + [([t], False) for t in after]
        for new, start in steps:
            plan = cache.plan(i + 1, new, start, "v", empty)
            length = plan.past_length + plan.ids.shape[1]
            present = np.zeros((1, 1, length, 1), np.float32)
            cache.commit(plan, present, present, end=False)
        cache.end(i + 1)
    return cache.prefix_hits, cache.prefix_queries


def test_it_counts_what_a_kv_cache_that_never_evicts_counts():
    system = encode("system: you are terse and exact\n")
    turns, history = [], []
    for k in range(4):
        prompt = system + history + encode(f"user: question {k} about blocks?\nassistant:")
        answer = encode(f" answer {k} here")
        turns.append((prompt, answer[:-1]))
        history = prompt[len(system):] + answer + encode("\n")
    other = system + encode("user: another session's first question\nassistant:")
    turns.insert(2, (other, encode(" short")))
    for bt in (4, 16):
        assert hit_ceiling(turns, block_tokens=bt) == _replica_counts(turns, bt)
    hits, queries = hit_ceiling(turns)
    assert 0 < hits < queries


def test_turn_tokens_rebuilds_each_prompt_with_the_answers_before_it():
    s = Session("s1", 0, "standard", "be brief", ["first?", "second?"])
    results = [TurnResult("s1", 1, "standard", 200, due_s=3.0, answer="ok\ufffdx"),
               TurnResult("s1", 0, "standard", 200, due_s=1.0, answer=" fine")]
    out = turn_tokens([s], results)
    assert [t[0] for t in out] == [1.0, 3.0]
    first = chat_prompt([{"role": "system", "content": "be brief"}, {"role": "user", "content": "first?"}])
    second = chat_prompt([{"role": "system", "content": "be brief"}, {"role": "user", "content": "first?"},
                          {"role": "assistant", "content": " fine"}, {"role": "user", "content": "second?"}])
    assert out[0][1:] == (encode(first), encode(" fin"))      # the last generated id is never fed
    assert out[1][1:] == (encode(second), encode("ok"))       # cut at the byte the text lost


def test_unanswered_turns_are_left_out():
    s = Session("s1", 0, "standard", "sys", ["a?", "b?"])
    results = [TurnResult("s1", 0, "standard", 200, due_s=0.0, answer="x"),
               TurnResult("s1", 1, "standard", 429, due_s=1.0)]
    assert len(turn_tokens([s], results)) == 1
