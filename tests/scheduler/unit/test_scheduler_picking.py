"""The Endpoint Picker's decision (scheduler.picker), socket-free: filters,
scorers and the picker on plain loads, and what the ext_proc layer reads from
a request (scheduler.requests)."""
import json

from mcp26.mesh import endpoint_picker as epp
from mcp26.scheduler.metrics import Load, parse_prometheus
from mcp26.scheduler.requests import build_request, prompt_and_model
from mcp26.scheduler.picker import Pick, Refusal, Request, Scheduler

A, B, C = "127.0.0.2:8000", "127.0.0.3:8000", "127.0.0.4:8000"


def loads(**by):
    out = {}
    for key, (waiting, kv) in by.items():
        out[key] = Load(waiting=waiting, kv_utilisation=kv, scraped_at=1.0)
    return out


def ready(*keys, waiting=0.0, kv=0.0):
    return {k: Load(waiting=waiting, kv_utilisation=kv, scraped_at=1.0) for k in keys}


def test_the_least_loaded_endpoint_is_picked_and_the_others_follow_as_fallbacks():
    s = Scheduler()
    got = s.pick(Request(), [A, B, C], {A: Load(waiting=3, scraped_at=1), B: Load(waiting=0, scraped_at=1),
                                        C: Load(waiting=1, scraped_at=1)})
    assert isinstance(got, Pick) and got.endpoints == [B, C, A]


def test_an_endpoint_never_scraped_or_failing_is_not_eligible():
    s = Scheduler()
    never = Load()
    failing = Load(scraped_at=1, failures=3)
    got = s.pick(Request(), [A, B, C], {A: never, B: failing, C: Load(scraped_at=1)})
    assert got.endpoints == [C]
    assert s.pick(Request(), [A, B], {A: never, B: failing}) == Refusal(503, "no ready endpoint in the pool")


def test_the_subset_hint_limits_the_pick_and_an_empty_or_ineligible_subset_is_503():
    s = Scheduler()
    got = s.pick(Request(subset=(C,)), [A, B, C], ready(A, B, C))
    assert got.endpoints == [C]
    assert s.pick(Request(subset=()), [A, B, C], ready(A, B, C)).status == 503
    assert s.pick(Request(subset=("10.9.9.9:1",)), [A, B, C], ready(A, B, C)).status == 503


def test_a_saturated_pool_sheds_sheddable_requests_and_still_serves_others():
    s = Scheduler()
    full = ready(A, B, waiting=9)
    assert s.pick(Request(sheddable=True), [A, B], full) == Refusal(429, "pool saturated: sheddable request dropped")
    assert isinstance(s.pick(Request(), [A, B], full), Pick)
    # Not saturated everywhere: the sheddable request goes to the endpoint with room.
    mixed = {A: Load(waiting=9, scraped_at=1), B: Load(kv_utilisation=0.1, scraped_at=1)}
    assert s.pick(Request(sheddable=True), [A, B], mixed).endpoints == [B]


def test_critical_requests_avoid_saturated_endpoints_even_when_the_prefix_is_there():
    s = Scheduler()
    prompt = "x" * 640
    s.pick(Request(prompt=prompt), [A], ready(A))                   # A holds the prefix now
    busy = {A: Load(kv_utilisation=0.95, scraped_at=1), B: Load(scraped_at=1)}
    assert s.pick(Request(prompt=prompt), [A, B], busy).endpoints[0] == A   # standard: affinity wins
    assert s.pick(Request(prompt=prompt, critical=True), [A, B], busy).endpoints[0] == B


def test_prefix_affinity_sends_a_shared_prompt_start_where_it_went_before():
    s = Scheduler()
    system = "You are a careful assistant. " * 20
    first = s.pick(Request(prompt=system + "question one"), [A, B, C], ready(A, B, C))
    assert first.prefix_hit == 0.0
    again = s.pick(Request(prompt=system + "another question entirely"), [A, B, C], ready(A, B, C))
    assert again.endpoints[0] == first.endpoints[0] and again.prefix_hit > 0.9
    other = s.pick(Request(prompt="Z" * 700), [A, B, C], ready(A, B, C))
    assert other.prefix_hit == 0.0


def test_prefix_blocks_are_a_hash_chain_so_a_later_equal_block_is_no_hit():
    shared_tail = "t" * 64
    a = Request(prompt="a" * 64 + shared_tail).blocks()
    b = Request(prompt="b" * 64 + shared_tail).blocks()
    assert len(a) == 2 and a[1] != b[1]


def test_session_affinity_keeps_a_session_on_one_endpoint():
    s = Scheduler()
    first = s.pick(Request(session="s-1"), [A, B, C], ready(A, B, C)).endpoints[0]
    for _ in range(5):
        assert s.pick(Request(session="s-1"), [A, B, C], ready(A, B, C)).endpoints[0] == first


def test_in_flight_requests_count_before_metrics_catch_up():
    s = Scheduler()
    seen = []
    for _ in range(4):
        e = s.pick(Request(), [A, B], ready(A, B)).endpoints[0]
        s.started(e)
        seen.append(e)
    assert sorted(seen) == [A, A, B, B]
    s.finished(A), s.finished(A)
    assert s.pick(Request(), [A, B], ready(A, B)).endpoints[0] == A


def test_prompt_and_model_from_completions_and_chat_bodies():
    assert prompt_and_model(json.dumps({"model": "m", "prompt": "hello"}).encode()) == ("hello", "m")
    chat = {"model": "chat", "messages": [{"role": "system", "content": "be brief"},
                                          {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert prompt_and_model(json.dumps(chat).encode()) == ("system:be brief\nuser:hi\n", "chat")
    assert prompt_and_model(b"not json") == ("", None)
    assert prompt_and_model(b"[1,2]") == ("", None)


def test_a_hostile_body_is_routed_without_affinity_never_an_error():
    assert prompt_and_model(b"[" * 200_000 + b"]" * 200_000) == ("", None)      # past the parser's depth
    assert prompt_and_model(b"\xff\xfe not utf-8") == ("", None)
    odd = {"model": 5, "messages": [{"role": "user", "content": [1, {"text": 2}, {"text": "ok"}]}, "x", None]}
    assert prompt_and_model(json.dumps(odd).encode()) == ("user:ok\n", None)
    assert prompt_and_model(json.dumps({"prompt": [1, "a", None, "b"]}).encode()) == ("ab", None)


def test_objectives_classes_and_sessions_become_the_request():
    objectives = {"batch-jobs": -1, "premium": 10}
    r, model = build_request({}, json.dumps({"model": "batch-jobs", "prompt": "p"}).encode(), objectives, None)
    assert r.sheddable and not r.critical and model == "batch-jobs"
    r, _ = build_request({epp.OBJECTIVE_HEADER: "premium", epp.SESSION_HEADER: "abc"}, b"", objectives, ("x:1",))
    assert r.critical and r.session == "abc" and r.subset == ("x:1",)
    r, _ = build_request({"x-mcp-qos-class": "batch"}, b"", {}, None)
    assert r.sheddable
    r, _ = build_request({"x-mcp-qos-class": "no-such-class"}, b"", {}, None)
    assert not r.sheddable and not r.critical


def test_prometheus_text_is_summed_per_name():
    text = ('# HELP x\nvllm:num_requests_waiting{model="a"} 2\nvllm:num_requests_waiting{model="b"} 3\n'
            'vllm:kv_cache_usage_perc 0.25\nbad line\n')
    assert parse_prometheus(text) == {"vllm:num_requests_waiting": 5.0, "vllm:kv_cache_usage_perc": 0.25}


def test_new_sessions_go_where_fewest_sessions_are_live_and_quiet_sessions_stop_counting():
    from mcp26.scheduler.picker import SESSION_LIVE_S
    now = [100.0]
    s = Scheduler(clock=lambda: now[0])
    pool = ready(A, B)

    def first_turn(sid, subset=None):
        prompt = f"session {sid} opens with its own words, long enough for a few prefix blocks " * 3
        return s.pick(Request(prompt=prompt, session=sid, subset=subset), [A, B], pool).endpoints[0]

    assert [first_turn(f"s{i}", (A,)) for i in range(3)] == [A, A, A]
    # A holds three live sessions, B none: the next two new sessions both go to B (round robin
    # alone would alternate).
    assert [first_turn("s3"), first_turn("s4")] == [B, B]
    now[0] += SESSION_LIVE_S + 1           # s0-s4 fall quiet
    assert [first_turn(f"s{i}", (B,)) for i in (5, 6)] == [B, B]
    # Only s5 and s6 are live now (both on B): a new session goes to A.
    assert first_turn("s7") == A
