"""The queued requests: one FIFO per priority level with Triton's queue policies.

Triton's PriorityQueue / PolicyQueue (core src/scheduler_utils.h): level 1 is the
highest; each level's policy bounds its length (max_queue_size: refused at arrival)
and its wait (a deadline from default_timeout_microseconds, which the request may
only shorten, QueuePolicy.timeout_us). On timeout REJECT takes the request out (the
caller fails it) and DELAY moves it behind every fresh request of its level, where it
has no deadline any more. `ordered()` walks the queue in Triton's batch order: by
level, and within a level the fresh requests before the delayed ones; `ordered_shared()`
in the order of a weighted share between levels (batch_formation.py "Weighted share").

Pure: no threads, no lock, no clock. The batcher holds its lock around every call and
passes `now` (time.monotonic_ns()) where time matters.
"""
from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from mcp26.mesh.batching_policy import BatcherSettings, QueuePolicy
from mcp26.inference.errors import Overloaded

_seq = itertools.count()


@dataclass(eq=False, slots=True)
class Pending:
    """One request in the queue."""
    inputs: dict[str, np.ndarray]
    outputs: tuple[str, ...]          # requested outputs; empty: all
    rows: int                         # its batch dimension
    key: tuple                        # requests with equal keys can share a run
    level: int = 0                    # filled at admission (BatchFormation.admit)
    timeout_us: int | None = None     # the request's own timeout (parameter `timeout`)
    context: dict = field(default_factory=dict)
    arrival_ns: int = 0
    deadline_ns: int = 0              # 0: none
    delayed: bool = False
    order: int = field(default_factory=_seq.__next__)
    # A concurrent.futures.Future, made when it is queued (submit, submit_deferred), where another
    # thread may wait for it; a request run on its own thread (run_alone) gets a batcher.Settled one.
    future: object = None


class PriorityQueue:
    """The per-level queues of one model (module docstring)."""

    def __init__(self, model: str):
        self.model = model
        self._fresh: dict[int, collections.deque] = {}
        self._delayed: dict[int, collections.deque] = {}
        self._count: dict[int, int] = collections.defaultdict(int)
        self.next_deadline = 0        # the nearest deadline of a queued request; 0: none

    def enqueue(self, p: Pending, policy: QueuePolicy) -> None:
        """Queue `p` at the back of its level; Overloaded when the level is full."""
        if policy.max_queue_size and self._count[p.level] >= policy.max_queue_size:
            raise Overloaded(f"priority level {p.level} queue of model {self.model!r} is full "
                             f"({policy.max_queue_size} requests)")
        self._fresh.setdefault(p.level, collections.deque()).append(p)
        self._count[p.level] += 1
        if p.deadline_ns and (not self.next_deadline or p.deadline_ns < self.next_deadline):
            self.next_deadline = p.deadline_ns

    def expire(self, now: int, settings: BatcherSettings) -> list[Pending]:
        """Apply each level's timeout action to the requests whose deadline is `now` or
        before: DELAY moves them to the back, REJECT takes them out; -> those taken out."""
        if not self.next_deadline or now < self.next_deadline:
            return []
        rejected, nearest = [], 0
        for level, dq in self._fresh.items():
            keep = collections.deque()
            for p in dq:
                if p.deadline_ns and p.deadline_ns <= now:
                    if settings.policy_for(level).timeout_action == "DELAY":
                        p.delayed, p.deadline_ns = True, 0
                        self._delayed.setdefault(level, collections.deque()).append(p)
                    else:
                        self._count[level] -= 1
                        rejected.append(p)
                    continue
                if p.deadline_ns and (not nearest or p.deadline_ns < nearest):
                    nearest = p.deadline_ns
                keep.append(p)
            self._fresh[level] = keep
        self.next_deadline = nearest
        return rejected

    def ordered(self, top: int = 0) -> Iterator[Pending]:
        """Every queued request in batch order; `top` > 0: levels 1..top only."""
        for level in sorted(set(self._fresh) | set(self._delayed)):
            if top and level > top:
                return
            yield from self._fresh.get(level, ())
            yield from self._delayed.get(level, ())

    def _level(self, level: int) -> Iterator[Pending]:
        yield from self._fresh.get(level, ())
        yield from self._delayed.get(level, ())

    def ordered_shared(self, strict: int, weight_of, passes: dict[int, float],
                       skip: tuple[int, ...] = ()) -> Iterator[Pending]:
        """Every queued request but those of `skip` levels, levels 1..`strict` first in level
        order, then the weighted levels' requests interleaved: each next one from the level
        whose pass is least (ties: the higher priority), each request advancing its level's
        pass by 1 / weight_of(level); then the levels of weight 0, in level order. `passes`:
        each level's pass at the start (stride scheduling)."""
        shared, after = {}, []
        for level in sorted(set(self._fresh) | set(self._delayed)):
            if level in skip or not self._count[level]:
                continue
            if level <= strict:
                yield from self._level(level)
            elif weight_of(level) > 0:
                shared[level] = [passes.get(level, 0.0), self._level(level), 1.0 / weight_of(level)]
            else:
                after.append(level)
        while shared:
            level = min(shared, key=lambda lv: (shared[lv][0], lv))
            entry = shared[level]
            p = next(entry[1], None)
            if p is None:
                del shared[level]
                continue
            yield p
            entry[0] += entry[2]
        for level in after:
            yield from self._level(level)

    def waiting(self, level: int) -> int:
        return self._count.get(level, 0)

    def take(self, batch: list[Pending]) -> None:
        """Take the requests of `batch` out of the queue (wherever they are in it)."""
        taken = set(map(id, batch))
        for queues in (self._fresh, self._delayed):
            for level, dq in queues.items():
                if any(id(p) in taken for p in dq):
                    queues[level] = collections.deque(p for p in dq if id(p) not in taken)
        for p in batch:
            self._count[p.level] -= 1

    def depth(self) -> dict[int, int]:
        """Queued requests per level (levels with none left out)."""
        return {level: n for level, n in self._count.items() if n}

    def total(self) -> int:
        return sum(self._count.values())
