"""Scheduler.pick_by_session: a live session's request picked on its headers
alone, only where the full decision on the body would pick the same endpoint;
everywhere else None, so the picker waits for the body."""
from mcp26.scheduler.metrics import Load
from mcp26.scheduler.picker import SESSION_LIVE_S, Pick, Request, Scheduler

A, B = "127.0.0.2:8000", "127.0.0.3:8000"
PROMPT = "system: you are the mesh's assistant. " * 20


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def idle(*keys):
    return {k: Load(scraped_at=1.0) for k in keys}


def started_on(endpoint_loads) -> tuple[Scheduler, Clock, str]:
    """A session whose first turn was picked on its body; where it went."""
    clock = Clock()
    s = Scheduler(clock=clock)
    first = s.pick(Request(prompt=PROMPT, session="s1"), [A, B], endpoint_loads)
    return s, clock, first.endpoints[0]


def test_the_next_turn_goes_where_the_session_lives_with_the_others_as_fallbacks():
    s, _, home = started_on(idle(A, B))
    got = s.pick_by_session(Request(session="s1"), [A, B], idle(A, B))
    assert isinstance(got, Pick) and got.endpoints[0] == home and set(got.endpoints) == {A, B}
    # and the full decision on the body agrees
    assert s.pick(Request(prompt=PROMPT + "user: more", session="s1"), [A, B], idle(A, B)).endpoints[0] == home


def test_no_session_an_unknown_one_or_one_gone_quiet_needs_the_body():
    s, clock, _ = started_on(idle(A, B))
    assert s.pick_by_session(Request(), [A, B], idle(A, B)) is None
    assert s.pick_by_session(Request(session="other"), [A, B], idle(A, B)) is None
    clock.now += SESSION_LIVE_S + 1
    assert s.pick_by_session(Request(session="s1"), [A, B], idle(A, B)) is None


def test_a_home_that_is_not_ready_saturated_busier_or_outside_the_subset_needs_the_body():
    s, _, home = started_on(idle(A, B))
    other = B if home == A else A
    not_ready = {home: Load(), other: Load(scraped_at=1.0)}
    # KV past the saturation bound with an equal queue: only the saturation filter can refuse it
    saturated = {home: Load(kv_utilisation=0.9, scraped_at=1.0), other: Load(scraped_at=1.0)}
    busier = {home: Load(waiting=2, scraped_at=1.0), other: Load(scraped_at=1.0)}
    for loads in (not_ready, saturated, busier):
        assert s.pick_by_session(Request(session="s1"), [A, B], loads) is None
    assert s.pick_by_session(Request(session="s1", subset=(other,)), [A, B], idle(A, B)) is None
    # one request more is within the slack: the held history outweighs it in the full decision too
    one_more = {home: Load(waiting=1, scraped_at=1.0), other: Load(scraped_at=1.0)}
    assert s.pick_by_session(Request(session="s1"), [A, B], one_more).endpoints[0] == home
    assert s.pick(Request(prompt=PROMPT + "user: more", session="s1"), [A, B], one_more).endpoints[0] == home


def test_a_header_pick_keeps_the_session_live():
    s, clock, home = started_on(idle(A, B))
    for _ in range(3):
        clock.now += SESSION_LIVE_S * 0.6
        assert s.pick_by_session(Request(session="s1"), [A, B], idle(A, B)).endpoints[0] == home
    assert s.live_sessions[home] == 1
