"""The queue under the batcher (inference-backend/batch_queue.py): Triton's priority
levels and queue policies, driven with explicit times - no threads, no clock."""
from __future__ import annotations

import pytest

from mcp26.mesh.batching_policy import BatcherSettings, QueuePolicy
from mcp26.inference.batch_queue import Pending, PriorityQueue
from mcp26.inference.errors import Overloaded

MS = 1_000_000
OPEN = QueuePolicy()


def req(tag: str, level: int, arrival_ns: int = 0, deadline_ns: int = 0) -> Pending:
    return Pending(inputs={}, outputs=(), rows=1, key=(4,), level=level, arrival_ns=arrival_ns,
                   deadline_ns=deadline_ns, context={"tag": tag})


def tags(q: PriorityQueue, top: int = 0) -> list[str]:
    return [p.context["tag"] for p in q.ordered(top)]


def test_batch_order_is_level_then_arrival_and_top_keeps_to_the_high_levels():
    q = PriorityQueue("m")
    for tag, level in [("c3", 3), ("a1", 1), ("d4", 4), ("b1", 1), ("e2", 2), ("f3", 3)]:
        q.enqueue(req(tag, level), OPEN)
    assert tags(q) == ["a1", "b1", "e2", "c3", "f3", "d4"]
    assert tags(q, top=2) == ["a1", "b1", "e2"]
    assert q.depth() == {1: 2, 2: 1, 3: 2, 4: 1} and q.total() == 6


def test_max_queue_size_refuses_at_arrival_per_level_and_makes_room_as_requests_leave():
    q = PriorityQueue("m")
    small = QueuePolicy(max_queue_size=2)
    first, second = req("q0", 3), req("q1", 3)
    q.enqueue(first, small)
    q.enqueue(second, small)
    with pytest.raises(Overloaded, match=r"priority level 3 queue of model 'm' is full \(2 requests\)"):
        q.enqueue(req("q2", 3), small)
    assert tags(q) == ["q0", "q1"]                  # nothing of the refused one stays
    q.enqueue(req("other", 1), small)               # another level has its own bound
    q.take([first])
    q.enqueue(req("q3", 3), small)                  # room again
    assert tags(q) == ["other", "q1", "q3"]


def test_reject_takes_a_request_out_at_its_deadline_not_before():
    q = PriorityQueue("m")
    reject = BatcherSettings(default_queue_policy=QueuePolicy(default_timeout_us=20_000))
    q.enqueue(req("late", 3, 0, 20 * MS), OPEN)
    q.enqueue(req("later", 3, 0, 50 * MS), OPEN)
    q.enqueue(req("never", 3), OPEN)
    assert q.next_deadline == 20 * MS
    assert q.expire(20 * MS - 1, reject) == []
    gone = q.expire(20 * MS, reject)
    assert [p.context["tag"] for p in gone] == ["late"]
    assert tags(q) == ["later", "never"] and q.total() == 2
    assert q.next_deadline == 50 * MS               # the next one is due then
    q.expire(60 * MS, reject)
    assert tags(q) == ["never"] and q.next_deadline == 0


def test_delay_moves_a_timed_out_request_behind_the_fresh_ones_of_its_level_only():
    q = PriorityQueue("m")
    delay = BatcherSettings(queue_policies={3: QueuePolicy(default_timeout_us=10_000, timeout_action="DELAY")})
    q.enqueue(req("old", 3, 0, 10 * MS), OPEN)
    q.enqueue(req("level4", 4, 1 * MS), OPEN)
    q.enqueue(req("fresh", 3, 5 * MS, 15 * MS), OPEN)
    assert q.expire(12 * MS, delay) == []           # delayed, not refused
    assert tags(q) == ["fresh", "old", "level4"] and q.total() == 3
    old = next(p for p in q.ordered() if p.context["tag"] == "old")
    assert old.delayed and old.deadline_ns == 0     # no second timeout
    assert q.next_deadline == 15 * MS
    q.expire(15 * MS, delay)                        # fresh times out too: behind old now
    assert tags(q) == ["old", "fresh", "level4"]


def test_take_removes_requests_from_anywhere_in_the_queue():
    q = PriorityQueue("m")
    ps = [req(f"r{i}", 1 + i % 2) for i in range(6)]
    for p in ps:
        q.enqueue(p, OPEN)
    q.take([ps[3], ps[0]])
    assert tags(q) == ["r2", "r4", "r1", "r5"] and q.depth() == {1: 2, 2: 2}
