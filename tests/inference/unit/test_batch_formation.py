"""Batch formation (inference-backend/batch_formation.py), the pure part of the batcher:
Triton's dynamic-batching rules, idle dispatch, the reserved lane, instances, regrouping,
split under load and the lone-request path, each driven with explicit `now` values (ns) -
no threads, no sleeps, no clock. The runtime around it (batcher.py) is tested in
test_inference_batcher.py and its neighbours."""
from __future__ import annotations

import concurrent.futures
import heapq
import math

import pytest

from mcp26.mesh.batching_policy import BatcherSettings, QueuePolicy
from mcp26.inference.batch_formation import GATED_RECHECK_S, SPLIT_SETTLE_NS, BatchFormation
from mcp26.inference.batch_queue import Pending
from mcp26.inference.errors import InvalidArgument, Overloaded, Unavailable

MS = 1_000_000
T0 = 1_000 * MS         # a clock that is not at zero
# Triton's own rules: strict level order, nothing frozen (the seed's rules are tested below)
TRITON = dict(level_weights=None, freeze_levels=())


def req(tag: str, rows: int = 1, width: int = 4, timeout_us: int | None = None) -> Pending:
    return Pending(inputs={}, outputs=(), rows=rows, key=(width,), timeout_us=timeout_us, context={"tag": tag})


def arrive(f: BatchFormation, p: Pending | str, now: int, qos_class: str | None = None,
           priority: int | None = None) -> Pending:
    p = req(p) if isinstance(p, str) else p
    f.enqueue(p, f.admit(p, qos_class, priority, now))
    return p


def tags(batch) -> list[str]:
    return [p.context["tag"] for p in batch or ()]


def formation(idle_dispatch: bool = False, instances: int = 1, split: int = 0, **settings) -> BatchFormation:
    return BatchFormation("m", BatcherSettings(**settings), idle_dispatch, instances, split)


def run(f: BatchFormation, now: int, instance: int = 0) -> list[Pending]:
    """A main instance's next batch at `now` (it stays busy until `f.finished`)."""
    turn = f.next_batch(now, instance)
    assert turn.batch, turn
    return turn.batch


# -- Triton's rules ------------------------------------------------------------------------
def test_batches_go_in_level_then_arrival_order_and_the_qos_class_wins_over_priority():
    f = formation(max_batch_size=1, **TRITON)
    for i, (tag, level) in enumerate([("c3", 3), ("a1", 1), ("d4", 4), ("b1", 1), ("e2", 2), ("f3", 3)]):
        arrive(f, tag, T0 + i, priority=level)
    low = arrive(f, "asked-1-but-batch", T0 + 10, qos_class="batch", priority=1)
    high = arrive(f, "interactive", T0 + 11, qos_class="interactive")
    assert (low.level, high.level) == (4, 2)
    order = []
    while f.queue.total():
        batch = run(f, T0 + 20)
        f.finished(batch)
        order += tags(batch)
    assert order == ["a1", "b1", "e2", "interactive", "c3", "f3", "d4", "asked-1-but-batch"]


def test_what_admission_refuses_names_the_request_and_queues_nothing():
    f = formation(max_batch_size=4)
    with pytest.raises(InvalidArgument, match="unknown QoS class"):
        arrive(f, "x", T0, qos_class="platinum")
    with pytest.raises(InvalidArgument, match="batch size 5 exceeds max_batch_size 4 of model 'm'"):
        arrive(f, req("big", rows=5), T0)
    f.settings = BatcherSettings(max_batch_size=4, queue_policies={3: QueuePolicy(max_queue_size=1)})
    arrive(f, "one", T0)
    with pytest.raises(Overloaded, match="priority level 3 queue of model 'm' is full"):
        arrive(f, "two", T0)
    f.stopping = True
    with pytest.raises(Unavailable, match="model 'm' is shutting down"):
        arrive(f, "late", T0, priority=1)
    assert f.queue.depth() == {3: 1}


def test_a_lone_request_waits_max_queue_delay_then_leaves():
    f = formation(max_batch_size=8, max_queue_delay_us=30_000)
    arrive(f, "alone", T0)
    assert f.form(T0) == (None, 0.030)
    batch, wait = f.form(T0 + 30 * MS - 1)
    assert batch is None and 0 < wait < 1e-6
    assert tags(f.form(T0 + 30 * MS)[0]) == ["alone"]


def test_the_largest_preferred_size_a_prefix_reaches_leaves_without_the_delay():
    f = formation(max_batch_size=8, preferred_batch_sizes=(2, 4), max_queue_delay_us=5_000_000)
    arrive(f, "p0", T0)
    assert f.form(T0)[0] is None                     # 1 is not preferred: it waits
    for i in range(1, 5):
        arrive(f, f"p{i}", T0 + i)
    assert tags(f.form(T0 + 5)[0]) == ["p0", "p1", "p2", "p3"]     # 4, not 2 or all 5


def test_max_batch_size_closes_a_batch_at_once_and_a_request_never_splits():
    f = formation(max_batch_size=4, max_queue_delay_us=200_000)
    for i in range(3):
        arrive(f, req(f"m{i}", rows=2), T0)
    batch, wait = f.form(T0)                         # 2 + 2 = 4: full, no wait
    assert tags(batch) == ["m0", "m1"] and wait is None
    f.started(batch)
    batch, wait = f.form(T0)
    assert batch is None and wait == 0.2             # m2 alone waits the delay


def test_requests_of_other_shapes_never_share_a_batch():
    f = formation(max_batch_size=8)
    for tag, width in [("w4", 4), ("w5", 5), ("w4b", 4)]:
        arrive(f, req(tag, width=width), T0)
    first = run(f, T0)
    f.finished(first)
    assert tags(first) == ["w4", "w4b"] and tags(run(f, T0)) == ["w5"]


def test_cancelled_requests_leave_the_queue_when_a_batch_is_formed():
    f = formation(max_batch_size=8)
    gone, stay = req("gone"), req("stay")
    for p in (gone, stay):
        p.future = concurrent.futures.Future()
        arrive(f, p, T0)
    gone.future.cancel()
    assert tags(run(f, T0)) == ["stay"] and f.queue.total() == 0


def test_a_request_may_only_shorten_its_levels_timeout():
    f = formation(queue_policies={3: QueuePolicy(default_timeout_us=50_000, allow_timeout_override=True),
                                  4: QueuePolicy(default_timeout_us=50_000)})
    assert arrive(f, req("short", timeout_us=5_000), T0).deadline_ns == T0 + 5 * MS
    assert arrive(f, req("long", timeout_us=900_000), T0).deadline_ns == T0 + 50 * MS
    assert arrive(f, req("fixed", timeout_us=5_000), T0, priority=4).deadline_ns == T0 + 50 * MS
    assert [p.context["tag"] for p in f.expire(T0 + 5 * MS)] == ["short"]


def test_a_thread_waits_no_longer_than_the_next_timeout():
    f = formation(max_batch_size=8, max_queue_delay_us=50_000,
                  default_queue_policy=QueuePolicy(default_timeout_us=10_000))
    arrive(f, "a", T0)
    assert f.form(T0)[1] == 0.05                     # the batch could wait 50 ms ...
    assert f.next_batch(T0).wait == 0.01             # ... but the request times out in 10


def test_new_settings_apply_to_the_next_batch_formed():
    f = formation(max_batch_size=1)
    for i in range(4):
        arrive(f, f"u{i}", T0)
    f.settings = BatcherSettings(max_batch_size=4)  # what update_settings does under the lock
    assert len(run(f, T0)) == 4


def test_the_admission_hook_holds_a_request_in_its_place_while_others_pass():
    f = formation(max_batch_size=4)
    seen = []

    def admits(p, taking, head):
        seen.append((p.context["tag"], taking))
        return None if p.context["tag"].startswith("wait") else 10

    for tag in ("wait-1", "go-1", "go-2"):
        arrive(f, tag, T0)
    batch, _ = f.form(T0, admits=admits)
    assert tags(batch) == ["go-1", "go-2"] and seen == [("wait-1", 0), ("go-1", 0), ("go-2", 10)]
    f.started(batch)
    assert f.form(T0, admits=admits) == (None, GATED_RECHECK_S)     # looked at again shortly
    assert tags(f.queue.ordered()) == ["wait-1"]


# -- idle dispatch, instances, the reserved lane --------------------------------------------
SLOW = dict(max_batch_size=8, preferred_batch_sizes=(8,), max_queue_delay_us=5_000_000)


def test_idle_dispatch_sends_a_lone_request_at_once_unless_one_is_being_decoded():
    plain = formation(**SLOW)
    arrive(plain, "a", T0)
    assert plain.form(T0) == (None, 5.0)             # Triton: the whole delay
    f = formation(idle_dispatch=True, **SLOW)
    f.arriving = 1                                   # a front end is decoding another
    arrive(f, "a", T0)
    assert f.form(T0) == (None, 5.0)                 # waited for ...
    f.arriving = 0
    arrive(f, "b", T0 + MS)
    assert tags(f.form(T0 + MS)[0]) == ["a", "b"]    # ... and it joins


def test_while_another_instance_computes_a_batch_waits_for_company():
    f = formation(idle_dispatch=True, instances=2, max_batch_size=8, max_queue_delay_us=150_000)
    arrive(f, "first", T0)
    assert tags(run(f, T0)) == ["first"]            # every instance idle: at once
    arrive(f, "second", T0 + MS)
    assert f.next_batch(T0 + MS, 1).wait == pytest.approx(0.150)
    arrive(f, "late", T0 + 2 * MS)
    assert tags(run(f, T0 + 151 * MS, 1)) == ["second", "late"]


def test_two_instances_take_two_batches_and_a_serial_executor_keeps_to_instance_0():
    f = formation(instances=2, max_batch_size=1)
    for tag in "abc":
        arrive(f, tag, T0)
    assert tags(run(f, T0, 0)) == ["a"] and tags(run(f, T0, 1)) == ["b"]
    assert f.next_batch(T0, 0).batch is None and not f.instance_free()     # c waits for one
    g = formation(instances=3, max_batch_size=1)
    for tag in "abc":
        arrive(g, tag, T0)
    assert g.next_batch(T0, 1, serial=True).batch is None and g.next_batch(T0, 2, serial=True).batch is None
    assert tags(g.next_batch(T0, 0, serial=True).batch) == ["a"]


def test_the_reserved_lane_starts_a_top_level_request_beside_a_running_low_batch_alone():
    f = formation(idle_dispatch=True, max_batch_size=4, max_queue_delay_us=2_000_000, reserved_lane_levels=1)
    slow = [arrive(f, f"slow{i}", T0, qos_class="batch") for i in range(4)]
    assert run(f, T0) == slow                        # the main instance computes them
    for i in range(2):
        arrive(f, f"low{i}", T0 + MS, qos_class="batch")
    arrive(f, "high", T0 + 2 * MS, qos_class="latency-critical")
    assert f.next_batch(T0 + 2 * MS).batch is None   # the main instance is busy
    lane = f.next_batch(T0 + 2 * MS, lane=True)
    assert tags(lane.batch) == ["high"]              # at once, and never back-filled
    assert tags(f.queue.ordered()) == ["low0", "low1"] and f.in_flight == 4   # the lane is no main instance
    assert f.next_batch(T0 + 3 * MS, lane=True) == (None, None, False)       # nothing of its levels
    f.settings = BatcherSettings(max_batch_size=4)   # a policy update switches it off
    arrive(f, "high2", T0 + 4 * MS, qos_class="latency-critical")
    assert f.next_batch(T0 + 4 * MS, lane=True).batch is None


def test_without_the_lane_the_high_request_is_back_filled_with_lower_levels():
    f = formation(max_batch_size=4, max_queue_delay_us=2_000, **TRITON)
    for i in range(2):
        arrive(f, f"low{i}", T0, qos_class="batch")
    arrive(f, "high", T0, qos_class="latency-critical")
    assert tags(run(f, T0 + 2 * MS)) == ["high", "low0", "low1"]    # Triton: lower levels fill the rest
    assert f.next_batch(T0, lane=True).batch is None


def test_stopping_drains_on_instance_0_without_the_delay_and_the_other_threads_end():
    f = formation(instances=2, max_batch_size=8, max_queue_delay_us=5_000_000, reserved_lane_levels=1)
    arrive(f, "a", T0)
    f.stopping = True
    assert f.next_batch(T0, lane=True).stop
    assert tags(run(f, T0)) == ["a"]                 # what is queued still goes, at once
    assert f.next_batch(T0, 1).stop and f.next_batch(T0, 0).stop


# -- regrouping ------------------------------------------------------------------------------
REGROUP = dict(max_batch_size=8, preferred_batch_sizes=(8,), max_queue_delay_us=50_000)


def closed_loop(f: BatchFormation, delays_ms: list[float], rounds: int | list[int],
                starts_ms: list[float] | None = None, compute_ms: float = 30) -> tuple[list[int], list[list[float]]]:
    """Clients that each submit, wait for the answer, come back `delays_ms[i]` after it, `rounds`
    times; one main instance whose every batch takes `compute_ms`. Event by event on a clock of
    our own. -> (the batch sizes, each client's queue times in ms)."""
    compute = int(compute_ms * MS)
    left = list(rounds) if isinstance(rounds, list) else [rounds] * len(delays_ms)
    arrivals = [(T0 + int((starts_ms[i] if starts_ms else 0) * MS), i) for i in range(len(delays_ms))]
    heapq.heapify(arrivals)
    running, wake = None, None
    sizes, queued = [], [[] for _ in delays_ms]
    while arrivals or running or f.queue.total():
        now = min(t for t in (arrivals[0][0] if arrivals else None, running and running[0], wake) if t)
        if running and running[0] == now:
            batch, running = running[1], None
            f.computed(now, len(batch), sum(p.rows for p in batch), compute)
            f.finished(batch)
            for p in batch:
                c = p.context["client"]
                left[c] -= 1
                if left[c]:
                    heapq.heappush(arrivals, (now + int(delays_ms[c] * MS), c))
        while arrivals and arrivals[0][0] == now:
            c = heapq.heappop(arrivals)[1]
            p = req(f"c{c}")
            p.context["client"] = c
            arrive(f, p, now)
        if running is None:
            turn = f.next_batch(now)
            wake = now + math.ceil(turn.wait * 1e9) if turn.wait else None
            if turn.batch:
                running = (now + compute, turn.batch)
                sizes.append(len(turn.batch))
                for p in turn.batch:
                    queued[p.context["client"]].append((now - p.arrival_ns) / MS)
    return sizes, queued


# Two groups of four clients, the second starting 5 ms after the first: each batch finds the other
# group queued, and each group's answers bring its clients back within 6 ms of a 30 ms batch.
GROUPS = dict(delays_ms=[0.5, 2, 4, 6] * 2, starts_ms=[0.0] * 4 + [5.0] * 4)


def test_two_groups_of_a_closed_loop_become_one_batch():
    f = formation(idle_dispatch=True, **REGROUP)
    sizes, _ = closed_loop(f, rounds=14, **GROUPS)
    # 4 + 4 while it learns how soon they come back (after the second batch), then 8 for good
    assert sizes == [4, 4] + [8] * 13, sizes
    assert f.regroup_waits == 13


def test_without_regrouping_the_two_groups_stay_apart(monkeypatch):
    f = formation(idle_dispatch=True, **REGROUP)
    monkeypatch.setattr(f, "_regroup_wait", lambda now: 0)      # the control: the same clients
    sizes, _ = closed_loop(f, rounds=14, **GROUPS)
    assert sizes == [4] * 28, sizes


def test_a_lone_client_is_not_delayed():
    f = formation(idle_dispatch=True, **REGROUP)
    _, queued = closed_loop(f, [1.0], 6)
    assert queued == [[0.0] * 6] and f.regroup_waits == 0


def test_clients_slower_than_a_batch_are_not_waited_for():
    f = formation(idle_dispatch=True, **REGROUP)
    sizes, _ = closed_loop(f, [0.5, 40], 8)         # the second is back 40 ms after its answer: > 30
    assert f.regroup_waits == 0 and sizes == [2] + [1] * 14, sizes     # apart after the first


def test_clients_back_within_a_batch_are_waited_for():
    # back 35 ms after the answer: over half a 60 ms batch (the bound until 2026-12-05), under all of
    # it. A lone request goes first, so that the two queue behind it and share a batch (what
    # regrouping learns the return time from).
    f = formation(idle_dispatch=True, max_batch_size=8, preferred_batch_sizes=(8,), max_queue_delay_us=100_000)
    sizes, queued = closed_loop(f, [1000, 0.5, 35], [1, 8, 8], starts_ms=[0, 5, 5], compute_ms=60)
    # the first return is not known yet when the quick one comes back, so it goes alone once; from
    # then on it waits the 34.5 ms for the slow one, and they share every batch
    assert sizes == [1, 2, 1] + [2] * 6 + [1], sizes
    assert f.regroup_waits == 7 and queued[1][3:] == [34.5] * 5


def test_the_wait_ends_when_one_never_comes_back():
    f = formation(idle_dispatch=True, **REGROUP)
    sizes, queued = closed_loop(f, rounds=[12] * 7 + [11], **GROUPS)
    assert sizes[-2:] == [8, 7], sizes
    # the last seven waited for the eighth, but not past their own return plus a row's compute
    # (the last came 6 ms after the batch ended, a row is 30 / 8 ms), far under the 30 ms bound
    last = [q[-1] for q in queued[:7]]
    assert max(last) == pytest.approx(6 + 30 / 8 - 0.5) and min(last) == pytest.approx(30 / 8)


def _after_batches_coming_back(f: BatchFormation, back_ms: list[float], compute_ms: float = 20,
                               rows_each: int = 2) -> int:
    """Two batches of len(back_ms) requests; the second's come back `back_ms` after the first
    ended and are its batch, so the formation knows how soon they come back. -> when the
    second ended (its requests have not come back yet)."""
    compute = int(compute_ms * MS)
    for i in range(len(back_ms)):
        arrive(f, req(f"g{i}", rows=rows_each), T0)
    now = T0
    for _ in range(2):
        batch = run(f, now)
        now += compute
        f.computed(now, len(batch), sum(p.rows for p in batch), compute)
        f.finished(batch)
        for i, ms in enumerate(back_ms):
            arrive(f, req(f"g{i}", rows=rows_each), now + int(ms * MS))
        now += int(max(back_ms) * MS)
    batch = run(f, now)
    now += compute
    f.computed(now, len(batch), sum(p.rows for p in batch), compute)
    f.finished(batch)
    return now


def test_the_regrouping_wait_ends_at_1_25x_the_return_time_or_a_row_after_the_last_arrival_capped():
    # batches of 4 requests, 8 rows, 20 ms (a row: 2.5 ms); their requests came back within 4 ms
    f = formation(idle_dispatch=True, max_batch_size=8, max_queue_delay_us=50_000)
    end = _after_batches_coming_back(f, [1, 2, 3, 4])
    arrive(f, req("r0", rows=2), end + MS)
    assert f.form(end + MS) == (None, pytest.approx(0.004))       # until 1.25 x 4 ms after the end
    arrive(f, req("r1", rows=2), end + 4 * MS)
    assert f.form(end + 4 * MS) == (None, pytest.approx(0.0025))  # still coming: a row's time more
    assert tags(f.form(end + 6_500_000)[0]) == ["r0", "r1"]       # nobody else came: they go
    # a 6 ms queue delay caps the same wait at 6 ms after the end
    g = formation(idle_dispatch=True, max_batch_size=8, max_queue_delay_us=6_000)
    end = _after_batches_coming_back(g, [1, 2, 3, 4])
    arrive(g, req("r0", rows=2), end + 4 * MS)
    assert g.form(end + 4 * MS) == (None, pytest.approx(0.002))
    # all four back: no wait at all
    for i in range(1, 4):
        arrive(g, req(f"r{i}", rows=2), end + 5 * MS)
    assert len(g.form(end + 5 * MS)[0]) == 4


# -- split under load --------------------------------------------------------------------------
SPLIT = dict(split=2, max_batch_size=4, max_queue_delay_us=1000)


def one_at_a_time(f: BatchFormation, now: int, n: int = 1) -> int:
    """`n` requests, each on an empty server, run where the formation says; -> the instance."""
    for i in range(n):
        arrive(f, f"one{i}", now)
        instance = 1 if f.split else 0
        turn = f.next_batch(now, instance)
        if not turn.batch:
            turn = f.next_batch(now + math.ceil(turn.wait * 1e9), instance)
        f.finished(turn.batch)
    return instance


def backlog(f: BatchFormation, now: int, n: int = 60) -> int:
    """The instance in use holds a batch while `n` more arrive; then they all run. -> the time
    the last one started (batches that are not full wait the queue delay)."""
    delay = f.settings.max_queue_delay_us * 1000
    arrive(f, "held", now)
    now += delay
    held = run(f, now, 1 if f.split else 0)
    for i in range(n):
        arrive(f, f"b{i}", now)
    f.finished(held)
    while f.queue.total():
        now += delay
        f.finished(run(f, now, 1 if f.split else 0))
    return now


def test_light_load_stays_on_the_wide_instance():
    f = formation(**SPLIT)
    for i in range(100):
        assert one_at_a_time(f, T0 + i * MS) == 0
    assert not f.split and f.split_changes == 0 and f.seen_load < 1


def test_a_backlog_moves_the_batches_to_the_narrow_instances_and_only_a_settled_fall_back():
    f = formation(**SPLIT)
    arrive(f, "held", T0)
    held = run(f, T0 + MS)                           # the wide instance computes (after the 1 ms delay)
    n, before = 0, 0.0
    while not f.split:
        before = f.seen_load
        arrive(f, f"b{n}", T0 + MS)
        n += 1
    assert n < 60 and before < (2 - 0.75) * 4 <= f.seen_load     # at N - 0.75 batches of 4
    assert f.parked(0) and not f.parked(1) and not f.parked(2)
    assert f.next_batch(T0 + MS, 0).batch is None    # the wide thread parks
    assert len(run(f, T0 + MS, 1)) == 4              # a narrow instance beside the wide batch
    assert f.next_batch(T0 + MS, 2).batch is None    # two instances' worth of batches computing
    f.finished(held)
    assert len(run(f, T0 + MS, 2)) == 4
    # The load goes away: arrivals find the server empty; once the average is under one batch
    # (N - 1) it must stay there SPLIT_SETTLE_NS before the wide instance takes over again.
    f.queue.take(list(f.queue.ordered()))
    f.in_flight = f.busy_instances = 0
    now = T0 + 2 * MS
    while f.seen_load >= 4:
        one_at_a_time(f, now)
        now += MS
    light = now - MS
    one_at_a_time(f, light + SPLIT_SETTLE_NS - 1)
    assert f.split and f.split_changes == 1
    one_at_a_time(f, light + SPLIT_SETTLE_NS)
    assert not f.split and f.split_changes == 2 and one_at_a_time(f, light + SPLIT_SETTLE_NS + 1) == 0


def test_a_dip_shorter_than_the_settle_time_keeps_the_split():
    """A closed-loop client that stalls sends its requests back in a burst that finds the server
    nearly empty: the average dips under one batch, but only staying there for SPLIT_SETTLE_NS
    moves the batches back to the wide instance; a rise in between starts the count again."""
    f = formation(**SPLIT)
    backlog(f, T0)
    assert f.split

    def dip(now: int) -> int:
        while f.seen_load >= 4:
            one_at_a_time(f, now)
            now += MS
        return now - MS                              # the first arrival under one batch

    first = dip(T0 + 100 * MS)
    again = backlog(f, first + 50 * MS)              # back over one batch: the count starts again
    assert f.split and again < first + SPLIT_SETTLE_NS
    second = dip(again + MS)
    one_at_a_time(f, first + SPLIT_SETTLE_NS)        # a settle time after the first dip: still split
    assert f.split and f.split_changes == 1
    one_at_a_time(f, second + SPLIT_SETTLE_NS)
    assert not f.split and f.split_changes == 2


def test_while_a_narrow_instance_computes_the_next_batch_waits_to_be_full():
    """Preferred sizes 2 and 4 would send 2 rows at once; split, with another instance busy,
    the batch waits for 4 rows (or the queue delay)."""
    f = formation(split=2, max_batch_size=4, preferred_batch_sizes=(2, 4), max_queue_delay_us=2_000_000)
    t = backlog(f, T0)
    assert f.split
    for i in range(2):
        arrive(f, f"two{i}", t + 10 * MS)
    assert len(run(f, t + 10 * MS, 1)) == 2          # nothing computing: a preferred size goes
    for i in range(2):
        arrive(f, f"two{i}", t + 11 * MS)
    assert f.next_batch(t + 11 * MS, 2) == (None, pytest.approx(2.0), False)    # not full: waits
    for i in range(2):
        arrive(f, f"more{i}", t + 12 * MS)
    assert len(run(f, t + 12 * MS, 2)) == 4          # full: the other narrow instance starts at once


def test_split_needs_two_threads_to_mean_anything():
    assert formation(split=1).split_width == 0 and not formation(split=1).parked(1)


# -- a lone request run without a queue (run_alone) ----------------------------------------------
def _state(why: str) -> BatchFormation:
    f = formation(idle_dispatch=True, **SLOW)
    if why == "queued":
        arrive(f, "before", T0)
    elif why == "decoding":
        f.arriving = 1
    elif why == "busy":
        arrive(f, "running", T0)
        run(f, T0)
    elif why == "regrouping":                 # the last batch had 4; its requests come back fast
        _after_batches_coming_back(f, [0.1, 0.2, 0.3, 0.4], compute_ms=1)
    elif why == "stopping":
        f.stopping = True
    return f


@pytest.mark.parametrize("why", ["queued", "decoding", "busy", "regrouping", "stopping"])
def test_take_alone_declines_and_changes_nothing_when_a_flush_would_not_run_it_alone_now(why):
    f = _state(why)
    p = req("a")
    f.admit(p, None, None, T0 + 100 * MS)
    before = (f.queue.total(), f.busy_instances, f.in_flight, f._since_done)
    assert f.take_alone(p) is False
    assert (f.queue.total(), f.busy_instances, f.in_flight, f._since_done) == before


def test_take_alone_holds_an_instance_and_counts_as_an_arrival():
    f = _state("idle")
    p = req("a")
    f.admit(p, None, None, T0)
    assert f.take_alone(p) is True
    assert f.busy_instances == 1 and f.in_flight == 1 and not f.instance_free() and f.queue.total() == 0
    assert f._since_done == 1 and f._last_arrival_ns == T0         # regrouping saw it arrive
    assert f.next_batch(T0).batch is None            # an inline run holds the last free instance
    f.finished([p])
    assert f.instance_free() and f.in_flight == 0


def test_a_batch_whose_requests_come_back_slowly_does_not_hold_a_lone_request():
    """Regrouping waits only while returns take under a batch's compute time: a cheap model's
    batch of 4 whose requests take longer to come back than it took does not hold the next."""
    f = formation(idle_dispatch=True, **SLOW)
    end = _after_batches_coming_back(f, [1.1, 1.2, 1.3, 1.4], compute_ms=1)
    p = req("a")
    f.admit(p, None, None, end + MS)
    assert f.take_alone(p) is True
    g = formation(idle_dispatch=True, **SLOW)        # the control: returns within the batch's time
    end = _after_batches_coming_back(g, [0.1, 0.2, 0.3, 0.4], compute_ms=1)
    g.admit(p, None, None, end + MS // 10)
    assert g.take_alone(p) is False

