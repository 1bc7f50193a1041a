"""The load engine: closed loop and open loop over a set of slots.

A slot carries one request at a time (an HTTP/1.1 connection, or one of the
concurrent streams on a gRPC channel). `slot.start(prio, on_done)` sends and
later calls `on_done(error_label, queue_us, compute_us)`; the engine records
each completion with its intended time, send time and end time.

Closed loop: each slot sends its next request as soon as the last returns.
Open loop: request i is *due* at t0 + i/rate, whatever happened before; due
requests wait in a FIFO for a free slot, and their latency counts from the
due time, so queueing in front of a saturated server shows up in the
percentiles instead of silently lowering the offered rate (coordinated
omission, as wrk2 corrects it).
"""
from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

from mcp26.inference.bench.mix import MixSequence
from mcp26.inference.bench.stats import Recorder

OnDone = Callable[[str | None, float | None, float | None], None]


class Slot(Protocol):
    def start(self, prio: int, on_done: OnDone) -> None: ...
    def expire(self, older_than: float) -> None: ...   # abort a request started before this
    def close(self) -> None: ...


@dataclass
class Load:
    requests: int                      # at most this many
    duration: float | None = None      # and for at most this long (s)
    rate: float | None = None          # open loop at this many per second
    timeout: float = 30.0              # per request
    mix: MixSequence | None = None
    recorder: Recorder = field(default_factory=Recorder)
    t_start: float = 0.0
    t_end: float = 0.0
    # stop early when each of the first `probe` answers was this error (a URL with no model
    # behind it answers 404 to every request: nothing would be measured)
    probe: int = 0
    probe_error: str = "client/http-404"
    aborted: str | None = None

    def check_probe(self) -> None:
        rec = self.recorder
        # early: a run no longer than the probe ends anyway, its 404s counted and reported
        if self.probe and self.aborted is None and len(rec) == self.probe and self.requests > self.probe:
            if all(e == self.probe_error for e in rec.error):
                self.aborted = self.probe_error
            self.probe = 0


async def run(load: Load, slots: list[Slot]) -> Load:
    """Drive `load` through `slots` until done; fills load.recorder."""
    sweeper = asyncio.get_running_loop().create_task(_expire_loop(slots, load.timeout))
    try:
        if load.rate:
            await _open_loop(load, slots)
        else:
            await _closed_loop(load, slots)
    finally:
        sweeper.cancel()
    return load


async def _expire_loop(slots: list[Slot], timeout: float) -> None:
    period = min(max(timeout / 4, 0.005), 0.1)
    while True:
        await asyncio.sleep(period)
        cutoff = time.perf_counter() - timeout
        for s in slots:
            s.expire(cutoff)


def _next_prio(load: Load) -> int:
    return load.mix.next() if load.mix else 0


async def _closed_loop(load: Load, slots: list[Slot]) -> None:
    finished = asyncio.get_running_loop().create_future()
    rec, now = load.recorder, time.perf_counter
    state = {"issued": 0, "outstanding": 0}
    load.t_start = now()
    stop_at = load.t_start + load.duration if load.duration else float("inf")

    def issue(slot: Slot) -> None:
        if state["issued"] >= load.requests or now() >= stop_at or load.aborted:
            if state["outstanding"] == 0 and not finished.done():
                finished.set_result(None)
            return
        state["issued"] += 1
        state["outstanding"] += 1
        prio, t = _next_prio(load), now()

        def done(label, queue_us, compute_us) -> None:
            end = now()
            state["outstanding"] -= 1
            rec.add(t, t, end, prio, label, queue_us, compute_us)
            load.check_probe()
            issue(slot)

        slot.start(prio, done)

    for s in slots:
        issue(s)
    if state["outstanding"] == 0 and not finished.done():
        finished.set_result(None)
    await finished
    load.t_end = now()


async def _open_loop(load: Load, slots: list[Slot]) -> None:
    loop = asyncio.get_running_loop()
    rec, now = load.recorder, time.perf_counter
    n = load.requests
    if load.duration:
        n = min(n, int(load.duration * load.rate))
    interval = 1.0 / load.rate
    idle = collections.deque(slots)
    due: collections.deque = collections.deque()   # (intended time, prio) waiting for a slot
    state = {"outstanding": 0}
    finished = loop.create_future()

    def send(slot: Slot, intended: float, prio: int, waited: bool = False) -> None:
        sent = now()
        state["outstanding"] += 1

        def done(label, queue_us, compute_us) -> None:
            state["outstanding"] -= 1
            rec.add(intended, sent, now(), prio, label, queue_us, compute_us, waited)
            load.check_probe()
            if load.aborted:
                due.clear()
            if due:
                send(slot, *due.popleft(), True)
            else:
                idle.append(slot)
                if state["outstanding"] == 0 and (next_i >= n or load.aborted) and not finished.done():
                    finished.set_result(None)

        slot.start(prio, done)

    t0 = load.t_start = now() + 0.001
    next_i = 0
    while next_i < n and not load.aborted:
        t = now()
        # everything due by now goes out (or queues), however late we woke
        last_due = min(n, int((t - t0) / interval) + 1)
        while next_i < last_due:
            intended = t0 + next_i * interval
            prio = _next_prio(load)
            next_i += 1
            if idle:
                send(idle.popleft(), intended, prio)
            else:
                due.append((intended, prio))
        if next_i < n:
            await asyncio.sleep(max(0.0, t0 + next_i * interval - now()))
    if state["outstanding"] or due:
        await finished
    load.t_end = now()

