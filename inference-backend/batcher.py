"""The dynamic batcher: priority queues with Triton's dynamic-batching semantics.

Requests wait in one FIFO per priority level (1 is the highest); a batch is
taken in (level, arrival) order from requests that can share one run (same
inputs, same non-batch shape, same outputs). A batch leaves when it reaches
max_batch_size, when it reaches the largest preferred_batch_size it can, or
when the oldest request in it has waited max_queue_delay_microseconds. Each
level's queue policy bounds its length (max_queue_size: reject at arrival)
and its wait (default_timeout_microseconds, overridable downwards by the
request when allow_timeout_override): on timeout, REJECT fails the request,
DELAY moves it behind every fresh request of its level and above.

One compute thread per model instance takes the batches; everything else
(parsing, encoding) happens on the server's threads, which only enqueue.

Instances (`instances` N, Triton's instance_group count; `mcpctl serve
--instances`). N compute threads take batches from the same queues, each
running its batch on the same session beside the others (ORT's run is
thread-safe). On a CPU a batch then runs on fewer intra-op threads
(model_server gives each instance its share of the cores): a GEMM split over
two threads waits at its end for the slower half, and on a machine whose
cores also parse and answer requests one half is often descheduled, while two
single-threaded batches never wait for each other (builtin:mlp batch 32 under
a 0.6-core background load: 3,000-3,500 rows/s against 2,100-2,400 with one
two-thread instance, inference-backend/README.md). An executor that cannot
run concurrently (`concurrent_runs = False`, the decoder) uses instance 0 only.

Split under load (`split` N >= 2; `mcpctl serve --split-under-load`). One
batch on all N intra-op threads finishes soonest while the load fits one
batch; once more than a batch waits, N single-threaded batches side by side
do more per second (no GEMM half waits for the other; builtin:mlp batch 32
alone: 459 us of CPU a row on one thread, 520 on two). So thread 0 runs
batches on the executor's N-thread session while the requests that arrivals
find in the server (queued + computing, an average over the last ~64
arrivals) stay under (N - 0.75) max batches; above that, threads 1..N run
batches on its one-thread session (`run_batch(batch, narrow=True)`) until
that average falls under N - 1 batches and stays there for 100 ms
(SPLIT_SETTLE_NS: a stalled client's burst of returns is no fall of the
load). The narrow threads run at SCHED_IDLE: they take only the CPU the
event loop, the gRPC threads and (in a container: the same cgroup) anything
else leave, so the front end answers and reads without waiting for a
batch. While a narrow instance computes, another forms only full batches
(or waits the queue delay): smaller preferred sizes would split the load
into batches that each read all the weights for fewer rows.

One-thread instances (`executor.yields_cpu`: a CPU session on one intra-op
thread) compute at SCHED_IDLE too, split or not, for the same reason: the
loop then has its core whenever it has work, and the batch takes the rest.
builtin:mlp REST c=64 as `--workers 2 --intra-op-threads 1`: 1.06x the req/s
at normal priority (3,322 against 3,125; relu REST at --workers 2, whose
batches mostly run inline on the loop: 0.99-1.01x). A hot reload that swaps in a
session of another thread count moves the thread to match (back to
SCHED_OTHER needs CAP_SYS_NICE or room in RLIMIT_NICE; refused, it stays and
says so).

Reserved lane (`reserved_lane_levels` N > 0; on in the latency-critical
preset). A batch cannot be pre-empted, so with one instance a top-level
request that arrives while a low-priority batch computes waits for all of it
(measured: its queue p99 was the low batch's compute time, ~10 ms of a
~38 ms p99). Triton's answer is a second model instance (instance_group
count 2); a plain second instance would be taken by low-priority work as
soon as it is free, so under saturating low load both would be busy and
nothing would change. The lane is a second compute thread over the same
model that only ever forms batches from levels 1..N: it idles (costing
nothing) until such a request waits, and then starts it at once, beside
whatever the main instance is computing. Being made of levels 1..N only,
its batches are never back-filled with lower levels (their compute time is
the high requests' own). The main instance keeps Triton's rules: it takes
the highest level first and fills the rest of the batch from lower levels.

Idle dispatch (`idle_dispatch=True`; `mcpctl serve` turns it on unless
`--no-fast-path`). Triton's max_queue_delay_microseconds is an upper bound on
how long a batch may wait for more requests. When the instance forming the
batch is idle and no request is on its way into the queue (`arriving`: the
front ends count requests they have read and not yet submitted), waiting
cannot grow the batch except by requests not yet received, so the batch
leaves at once, as with max_queue_delay 0. While the instance computes,
requests still gather and leave together when it is free, and a request that
is being decoded when the instance frees up is still waited for (up to the
delay). Every batch formed is one Triton's rules allow: (level, arrival)
order, at most max_batch_size rows, never older than the delay. What differs
is only that a lone request on an idle server does not pay the delay.

Regrouping (with idle dispatch, one main instance). Clients that wait for an
answer before sending again (closed loops: benchmarks, agents, a proxy's
pooled connections) split into groups once one batch leaves without some of
them: each group then comes back while the other computes, and leaves alone
when the instance frees up - for good (builtin:mlp REST c=16: batches of
6 + 10 or 1 + 15 instead of 16, 20 % fewer req/s, in two runs of five).
So an idle lone instance that just finished a batch of n requests waits for n
requests to arrive since its end before forming the next batch, when such a
return has been taking (averaged over batches of two or more) less than
that batch's compute time. Two groups pay the part of a batch that does not
grow with its rows twice a round, and what they seem to gain by overlapping
one group's return with the other's batch is small where both run on the
same cores (a lone instance on every core, as by default): the loop's work
for the returning requests takes those cores from the batch. builtin:mlp
REST c=64, batches of up to 64 on both cores of a 2-core VM: returns took
4.3-5.3 ms against 6.6-7.1 ms batches; waiting for them made batches of 62-64
rows instead of 45-57 and 1.08-1.14x the req/s (4 paired runs; half a batch,
the bound before, never waited there); c=16 and c=64 at the preset's 32, and
gRPC, moved within the spread (2026-12-05). The wait ends once n have come,
at 1.25x the average return time (extended while requests keep coming, by a
row's compute time after each), and at the latest a batch's compute time or
the queue delay after the batch ended, whichever is sooner. Requests already
queued when it ended (the other group) wait with it: the queue delay bounds
the wait from the instance's end, not from their arrival. Nothing waits when
returns take longer (clients slower than the model), for a lone request's
return (c=1), with more than one instance, or in the reserved lane.

Deferred submits and inline runs (`submit_deferred` + `flush`). The event
loop queues every request it decodes in one turn without waking the compute
thread, then flushes once: the requests read together leave together (one
wake-up, not one per request). For a model whose batch-1 run is cheaper than
a thread hop (`executor.inline_ok`, measured at warm-up), the flush runs those
batches itself, on the loop, while the main instance is idle: the same
batches the compute thread would have formed, minus the hand-over to it and
back. Otherwise the flush wakes the compute thread (and the lane).

Admission hook (`executor.admits(p, taking, head)`, optional). An executor may hold a
request back from the batch being formed (None: it keeps its place and others pass it;
the queue is looked at again every GATED_RECHECK_S, since room is made outside it) or say
what it will take. The decoder uses it to start batch-class sequences only while its KV
budget has room (inference.decoder).
"""
from __future__ import annotations

import collections
import concurrent.futures
import itertools
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from mcp26.mesh.batching_policy import BatcherSettings
from mcp26.inference.errors import InferenceError, Internal, InvalidArgument, Overloaded, Unavailable

log = logging.getLogger("mcp26.inference")
_seq = itertools.count()
GATED_RECHECK_S = 0.005
SPLIT_EWMA = 1 / 64         # weight of one arrival in the split decision's load average
# How long the load average must stay under N - 1 batches before the wide instance takes
# the batches back. A closed-loop client that stalls for a moment sends its requests back
# in a burst that finds the server nearly empty; such a dip of the average lasted 0.1-2.5 ms
# (builtin:mlp REST c=64, with and without bursts of CPU beside it) and, switching at once,
# one CI run flipped 10 times in 2 s of steady load. A real fall of the load stays down.
SPLIT_SETTLE_NS = 100_000_000
BACK_EWMA = 1 / 8           # weight of one batch in the regrouping's average time until its requests are back


@dataclass(eq=False, slots=True)
class Pending:
    """One request in the queue."""
    inputs: dict[str, np.ndarray]
    outputs: tuple[str, ...]          # requested outputs; empty: all
    rows: int                         # its batch dimension
    key: tuple                        # requests with equal keys can share a run
    level: int = 0                    # filled by submit()
    timeout_us: int | None = None     # the request's own timeout (parameter `timeout`)
    context: dict = field(default_factory=dict)
    arrival_ns: int = 0
    deadline_ns: int = 0              # 0: none
    delayed: bool = False
    order: int = field(default_factory=_seq.__next__)
    # Made when it is queued (submit, submit_deferred), where another thread may wait for it; a
    # request run on its own thread (run_alone) gets a Settled one: no lock, no Condition.
    future: "concurrent.futures.Future | Settled | None" = None


class Settled:
    """The future of a request run alone on the caller's thread (DynamicBatcher.run_alone):
    settled before anyone looks, seen by no other thread, so none of a concurrent future's
    locking (the Condition it makes cost a gRPC call a few us). The methods the batcher and
    ServedModel.infer call."""

    __slots__ = ("_result", "_error")

    def __init__(self):
        self._result = self._error = None

    def done(self) -> bool:
        return self._result is not None or self._error is not None

    def cancelled(self) -> bool:
        return False

    def cancel(self) -> bool:
        return False

    def set_result(self, result) -> None:
        self._result = result

    def set_exception(self, error: BaseException) -> None:
        self._error = error

    def exception(self) -> BaseException | None:
        return self._error

    def result(self, timeout: float | None = None):
        if self._error is not None:
            raise self._error
        return self._result


@dataclass
class Result:
    outputs: dict[str, np.ndarray]
    queue_us: int
    compute_us: int
    assemble_us: int
    batch_size: int                   # rows in the run this request was part of
    batch_requests: int
    level: int
    version: str = ""                 # of the model version that computed it
    parameters: dict = field(default_factory=dict)


class Executor(Protocol):
    def run_batch(self, batch: list[Pending]) -> tuple[list[dict], list[dict], float, float]:
        """-> (outputs per request, response parameters per request, assemble s, compute s)."""


class Observer(Protocol):
    def on_batch(self, batch: list[Pending], result_times: tuple[int, int, int], rows: int,
                 version: str = "") -> None: ...
    def on_reject(self, level: int, reason: str) -> None: ...


class DynamicBatcher:
    def __init__(self, name: str, executor: Executor, settings: BatcherSettings,
                 observer: Observer | None = None, idle_dispatch: bool = False, instances: int = 1,
                 split: int = 0):
        self.name = name
        self.executor = executor
        self.settings = settings
        self.observer = observer
        lock = threading.Lock()
        # One lock, four conditions, so that a submit wakes only the thread that
        # has something to do: the main instance, the lane (levels 1..N only), the
        # timeout reaper (only for a nearer deadline); split under load parks the
        # threads of the mode not in use on the fourth.
        self._cond = threading.Condition(lock)
        self._lane_cond = threading.Condition(lock)
        self._reap_cond = threading.Condition(lock)
        self._parked = threading.Condition(lock)   # split under load: the threads of the other mode
        self._fresh: dict[int, collections.deque] = {}
        self._delayed: dict[int, collections.deque] = {}
        self._count: dict[int, int] = collections.defaultdict(int)
        self._next_deadline = 0
        self._stopping = False
        self.in_flight = 0                 # requests of the batches being computed (main instances)
        self.busy_ns = 0                   # main instances' compute time so far, summed, for utilisation
        self.lane_busy_ns = 0              # the reserved lane's
        self.lane_batches = 0
        self.completed = 0
        self.idle_dispatch = idle_dispatch
        self.arriving = 0                  # requests read by a front end, not yet submitted (idle dispatch)
        self.inline_runs = 0
        self.instances = max(1, instances)
        self._busy_instances = 0           # main instances running a batch (their thread, or an inline run)
        # Split under load (module docstring): 0 off, else N narrow threads beside the wide one.
        self.split_width = split if split >= 2 else 0
        self.split = False                 # the narrow threads take the batches now
        self.split_changes = 0
        self.narrow_batches = 0
        self.seen_load = 0.0               # requests in the server as arrivals find it, averaged
        self._light_since_ns = 0           # split, and the average under N - 1 batches since then
        # Regrouping (module docstring): the last batch of a lone main instance, and what came since.
        self._done_ns = 0                  # when it finished
        self._done_requests = 0            # its requests
        self._batch_ns = 0                 # its compute time
        self._row_ns = 0                   # ... per row
        self._last_arrival_ns = 0
        self._regrouping = False           # waiting for them now
        self._since_done = 0               # requests queued since it finished
        self._back_ns = 0.0                # from a batch's end until as many requests came, averaged
        self.regroup_waits = 0             # batches that waited so
        # Policy changes and when the first batch under each was formed (wall clock, so another
        # process - a benchmark, the decision loop - can compare with its own times): /admin/status.
        self.policy_generation = 0
        self.policy_changes: collections.deque = collections.deque(maxlen=64)
        self._batch_generation = 0
        self._lane: threading.Thread | None = None
        threads = 1 + self.split_width if self.split_width else self.instances
        self._threads = [threading.Thread(target=self._loop, kwargs={"instance": i}, daemon=True,
                                          name=f"batcher-{name}" + (f"-{i}" if i else ""))
                         for i in range(threads)]
        for t in self._threads:
            t.start()
        self._start_lane()
        # Timeouts fire at their deadline even while the compute thread is busy
        # with a long batch: a refused client should hear so at once.
        self._reaper = threading.Thread(target=self._reap, name=f"batcher-{name}-timeouts", daemon=True)
        self._reaper.start()

    # -- called from request threads ------------------------------------------------
    def submit(self, p: Pending, qos_class: str | None = None, priority: int | None = None) -> concurrent.futures.Future:
        policy = self._admit(p, qos_class, priority)
        if p.future is None:
            p.future = concurrent.futures.Future()
        with self._cond:
            self._enqueue(p, policy)
        return p.future

    def _admit(self, p: Pending, qos_class: str | None, priority: int | None):
        """The request's level, checks and deadline (no lock)."""
        s = self.settings
        try:
            p.level = s.level_for(qos_class, priority)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
        if p.rows > s.max_batch_size:
            raise InvalidArgument(f"batch size {p.rows} exceeds max_batch_size {s.max_batch_size} of model {self.name!r}")
        policy = s.policy_for(p.level)
        p.arrival_ns = time.monotonic_ns()
        timeout = policy.timeout_us(p.timeout_us)
        p.deadline_ns = p.arrival_ns + timeout * 1000 if timeout else 0
        return policy

    def _enqueue(self, p: Pending, policy, wake: bool = True) -> None:
        """Queue `p` (the lock is held); `wake`: tell the compute threads now."""
        if self._stopping:
            raise Unavailable(f"model {self.name!r} is shutting down")
        if policy.max_queue_size and self._count[p.level] >= policy.max_queue_size:
            reason = f"priority level {p.level} queue of model {self.name!r} is full ({policy.max_queue_size} requests)"
            if self.observer:
                self.observer.on_reject(p.level, "queue_full")
            raise Overloaded(reason)
        self._fresh.setdefault(p.level, collections.deque()).append(p)
        self._count[p.level] += 1
        self._arrival(p)
        if self.split_width:
            self._observe_load()
        if p.deadline_ns and (not self._next_deadline or p.deadline_ns < self._next_deadline):
            self._next_deadline = p.deadline_ns
            self._reap_cond.notify()
        if not wake:
            return
        self._cond.notify()
        if self._lane is not None and p.level <= self.settings.reserved_lane_levels:
            self._lane_cond.notify()

    def _arrival(self, p: Pending) -> None:
        """What regrouping learns from an arrival (the lock is held)."""
        self._since_done += 1
        self._last_arrival_ns = p.arrival_ns
        if self._since_done == self._done_requests > 1:     # as many as the last batch had: "back"
            back = p.arrival_ns - self._done_ns             # (a lone request's return says nothing of a group's)
            self._back_ns += (back - self._back_ns) * BACK_EWMA if self._back_ns else back

    def run_alone(self, p: Pending, qos_class: str | None = None, priority: int | None = None) -> bool:
        """Run `p` now, on this thread, as a batch of one, when that is the batch a flush would
        form at once: a cheap model (inline runs), an idle main instance, nothing queued or being
        decoded, no regrouping wait. It never enters a queue, so none of a queue's bookkeeping is
        done for it, and its future is a Settled one (ServedModel.submit's `run_now`). False:
        nothing was done (beyond the admission checks, which raise as submit's do); queue it."""
        if not (self.idle_dispatch and getattr(self.executor, "inline_ok", False)) or self.split_width:
            return False
        self._admit(p, qos_class, priority)
        with self._cond:
            if (self._stopping or self.arriving > 0 or not self.instance_free()
                    or any(self._count.values()) or self._regroups(self._since_done + 1)):
                return False
            self._arrival(p)
            self._formed()
            self._busy_instances += 1
            self.in_flight += 1
            executor = self.executor
        p.future = Settled()
        self.inline_runs += 1
        try:
            self._run(executor, [p])
        finally:
            with self._cond:
                self._finished([p])
        return True

    def submit_deferred(self, p: Pending, qos_class: str | None = None, priority: int | None = None) -> None:
        """Queue `p` without waking anyone: the caller (the event loop) calls `flush()` once
        it has taken every request it can read this turn, so they leave as one batch."""
        policy = self._admit(p, qos_class, priority)
        if p.future is None:
            p.future = concurrent.futures.Future()
        with self._cond:
            self._enqueue(p, policy, wake=False)

    def flush(self) -> None:
        """After a turn of deferred submits: run what is queued here, in batches, when the
        model is cheap enough and the main instance idle (inline runs, module docstring);
        else wake the compute threads once."""
        inline = self.idle_dispatch and getattr(self.executor, "inline_ok", False)
        while inline:
            with self._cond:
                if not self.instance_free() or self._stopping:
                    break
                batch, _ = self._form(time.monotonic_ns())
                if not batch:           # nothing queued, or a batch waiting for a request being decoded
                    break
                self._started(batch)
                executor = self.executor
            self.inline_runs += 1
            try:
                self._run(executor, batch)
            finally:
                with self._cond:
                    self._finished(batch)
        with self._cond:
            if any(self._count.values()):
                self._cond.notify()
                if self._lane is not None:
                    self._lane_cond.notify()

    def arrived(self) -> None:
        """A front end read a request it will submit (or refuse): `departed()` follows."""
        self.arriving += 1

    def departed(self, submitting: bool = False) -> None:
        """`submitting`: the request is submitted next (its submit wakes the instance)."""
        self.arriving -= 1
        if not submitting and self.arriving == 0 and self.idle_dispatch and any(self._count.values()):
            with self._cond:            # a batch may have been waiting for this one
                self._cond.notify()

    def update_settings(self, settings: BatcherSettings) -> None:
        """Take new settings for every batch formed from now on; queued requests keep
        their place (a level beyond the new priority_levels is served as the lowest)."""
        with self._cond:
            self.settings = settings
            self.policy_generation += 1
            self.policy_changes.append({"generation": self.policy_generation, "policy": settings.name,
                                        "applied_at": time.time(), "first_batch_at": None})
            self._start_lane()
            self._notify_all()

    def instance_free(self) -> bool:
        """A main instance is idle (read without the lock, it is a hint)."""
        return self._busy_instances < self._capacity()

    def _capacity(self) -> int:
        if self.split_width:
            return self.split_width if self.split else 1
        return self.instances

    def _observe_load(self) -> None:
        """An arrival (the lock is held): update the load average and switch wide / narrow."""
        seen = self.in_flight + self.total_queued()
        self.seen_load += (seen - self.seen_load) * SPLIT_EWMA
        batches = self.seen_load / max(1, self.settings.max_batch_size)
        if not self.split:
            if batches >= self.split_width - 0.75:
                self._switch_split()
        elif batches >= self.split_width - 1:
            self._light_since_ns = 0
        elif not self._light_since_ns:
            self._light_since_ns = time.monotonic_ns()
        elif time.monotonic_ns() - self._light_since_ns >= SPLIT_SETTLE_NS:
            self._switch_split()

    def _switch_split(self) -> None:
        self.split = not self.split
        self.split_changes += 1
        self._light_since_ns = 0
        self._cond.notify_all()         # the threads of the old mode park,
        self._parked.notify_all()       # those of the new one take over

    def _started(self, batch: list[Pending]) -> None:
        """A main instance takes `batch` (the lock is held)."""
        self._take(batch)
        self._formed()
        self._busy_instances += 1
        self.in_flight += len(batch)

    def _finished(self, batch: list[Pending]) -> None:
        """...and is done with it (the lock is held)."""
        self._busy_instances -= 1
        self.in_flight -= len(batch)

    def _formed(self) -> None:
        """A batch was just taken (the lock is held): the first under a new policy is recorded."""
        if self._batch_generation != self.policy_generation:
            self._batch_generation = self.policy_generation
            if self.policy_changes and self.policy_changes[-1]["first_batch_at"] is None:
                self.policy_changes[-1]["first_batch_at"] = time.time()

    def _notify_all(self) -> None:
        self._cond.notify_all()
        self._parked.notify_all()
        self._lane_cond.notify_all()
        self._reap_cond.notify_all()

    def _start_lane(self) -> None:
        on = bool(self.settings.reserved_lane_levels)
        if on and self._lane is None:
            self._lane = threading.Thread(target=self._loop, args=(True,), name=f"batcher-{self.name}-lane",
                                          daemon=True)
            self._lane.start()

    def set_executor(self, executor: Executor) -> None:
        """Swap the model under the queue; the batch being computed finishes on the old one."""
        with self._cond:
            self.executor = executor

    def queue_depth(self) -> dict[int, int]:
        with self._cond:
            return {level: n for level, n in self._count.items() if n}

    def total_queued(self) -> int:
        return sum(self._count.values())

    def stop(self, timeout: float = 10.0) -> None:
        """Serve what is queued, then end the compute thread."""
        with self._cond:
            self._stopping = True
            self._notify_all()
        for t in self._threads:
            t.join(timeout)
        if self._lane:
            self._lane.join(timeout)
        self._reaper.join(timeout)

    # -- the compute thread (and the timeout reaper) --------------------------------
    def _reap(self) -> None:
        with self._cond:
            while not self._stopping:
                now = time.monotonic_ns()
                self._expire(now)
                wait = (self._next_deadline - now) / 1e9 if self._next_deadline else None
                self._reap_cond.wait(wait if wait is None else max(wait, 0.0005))
    def _ordered(self, top: int = 0):
        for level in sorted(set(self._fresh) | set(self._delayed)):
            if top and level > top:
                return
            yield from self._fresh.get(level, ())
            yield from self._delayed.get(level, ())

    def _expire(self, now: int) -> None:
        if not self._next_deadline or now < self._next_deadline:
            return
        nearest = 0
        for level, dq in self._fresh.items():
            keep = collections.deque()
            for p in dq:
                if p.deadline_ns and p.deadline_ns <= now:
                    action = self.settings.policy_for(level).timeout_action
                    if action == "DELAY":
                        p.delayed, p.deadline_ns = True, 0
                        self._delayed.setdefault(level, collections.deque()).append(p)
                        continue
                    self._count[level] -= 1
                    waited = (now - p.arrival_ns) // 1000
                    if self.observer:
                        self.observer.on_reject(level, "timeout")
                    _fail(p, Overloaded(f"request timed out after {waited} us in the priority level {level} "
                                        f"queue of model {self.name!r} (timeout_action REJECT)"))
                    continue
                if p.deadline_ns and (not nearest or p.deadline_ns < nearest):
                    nearest = p.deadline_ns
                keep.append(p)
            self._fresh[level] = keep
        self._next_deadline = nearest

    def _take(self, batch: list[Pending]) -> None:
        taken = set(map(id, batch))
        for queues in (self._fresh, self._delayed):
            for level, dq in queues.items():
                if any(id(p) in taken for p in dq):
                    queues[level] = collections.deque(p for p in dq if id(p) not in taken)
        for p in batch:
            self._count[p.level] -= 1

    def _form(self, now: int, top: int = 0) -> tuple[list[Pending] | None, float | None]:
        """-> (a batch to run now, or None and how long to wait in seconds).
        `top` > 0: only from levels 1..top (the reserved lane)."""
        s = self.settings
        head, batch, rows, overflow, oldest = None, [], 0, False, 0
        cancelled = []
        admits = getattr(self.executor, "admits", None)     # e.g. a decoder's KV budget (decoder.py)
        taking, gated = 0, False
        for p in self._ordered(top):
            if p.future.cancelled():
                cancelled.append(p)
                continue
            if admits is not None:
                cost = admits(p, taking, head)
                if cost is None:         # must wait for room; stays in its place in the queue
                    gated = True
                    continue
            if head is None:
                head = p
            if p.key != head.key:
                continue
            if rows + p.rows > s.max_batch_size:
                overflow = True
                break
            batch.append(p)
            rows += p.rows
            if admits is not None:
                taking += cost
            oldest = p.arrival_ns if not oldest else min(oldest, p.arrival_ns)
        if cancelled:
            self._take(cancelled)
        if not batch:
            # a gated request is looked at again shortly: room is made by sequences ending,
            # which does not go through the queue
            return None, (GATED_RECHECK_S if gated else None)
        if overflow or rows >= s.max_batch_size or s.max_queue_delay_us == 0 or self._stopping:
            return batch, None
        if self.idle_dispatch and (top or not self._busy_instances):
            wait = 0 if top else self._regroup_wait(now)
            if wait:                    # the last batch's requests are coming back: they join this one
                return None, wait
            if self.arriving <= 0:
                # nothing can join in time and every main instance is idle (while another computes,
                # its answers bring more requests, so Triton's rules below apply); the reserved
                # lane's top-level requests never wait for company
                return batch, None
        if s.preferred_batch_sizes and not (self.split and self._busy_instances):
            # Triton: the largest preferred size a prefix of the queue reaches goes now
            # (split: full batches only while a narrow instance computes, module docstring).
            total, best = 0, 0
            for i, p in enumerate(batch):
                total += p.rows
                if total in s.preferred_batch_sizes:
                    best = i + 1
            if best:
                return batch[:best], None
        wait_until = oldest + s.max_queue_delay_us * 1000
        if now >= wait_until:
            return batch, None
        return None, (wait_until - now) / 1e9

    def _regroups(self, since_done: int) -> bool:
        """May an idle lone instance wait for its last batch's requests to come back, `since_done`
        of them having come? Only while such returns take under a batch's compute time."""
        return (self._capacity() == 1 and since_done < self._done_requests and bool(self._back_ns)
                and self._back_ns <= self._batch_ns)

    def _regroup_wait(self, now: int) -> float:
        """Seconds an idle lone instance waits for as many requests as its last batch had to
        arrive (module docstring, "Regrouping"); 0: none."""
        if not self._regroups(self._since_done):
            return 0
        # until they are expected back, or while they keep coming, within the queue delay
        until = min(max(self._done_ns + self._back_ns * 1.25, self._last_arrival_ns + self._row_ns),
                    self._done_ns + min(self._batch_ns, self.settings.max_queue_delay_us * 1000))
        if now >= until:
            return 0
        if not self._regrouping:
            self._regrouping = True
            self.regroup_waits += 1
        return (until - now) / 1e9

    def _loop(self, lane: bool = False, instance: int = 0) -> None:
        """A main instance's compute thread, or (lane=True) the reserved lane's."""
        narrow = bool(self.split_width) and instance > 0
        # SCHED_IDLE for a narrow instance, and for a main one whose executor yields its CPU
        # (looked at again when a hot reload swaps the executor)
        main, priority_of = not (lane or narrow), self.executor
        idle = compute_priority(idle=True) if narrow or (main and _yields_cpu(self.executor)) else False
        while True:
            with self._cond:
                while True:
                    now = time.monotonic_ns()
                    self._expire(now)
                    top = self.settings.reserved_lane_levels if lane else 0
                    serial = not getattr(self.executor, "concurrent_runs", True)   # e.g. a decoder's KV cache
                    if lane and serial:
                        top = 0
                    parked = bool(self.split_width) and not lane and narrow != self.split
                    if (lane and (not top or self._stopping)) or (instance and serial) or parked:
                        if self._stopping:
                            return          # instance 0 (split: the threads of the mode) drains what is left
                        # lane switched off by a policy update, a serial model, or not this thread's mode: idle
                        batch, wait = None, None
                    else:
                        batch, wait = self._form(now, top)
                    if batch and not lane and not self.instance_free():
                        batch, wait = None, None    # an inline run holds the last free instance
                    if batch:
                        if lane:
                            self._take(batch)
                            self._formed()
                        else:
                            self._started(batch)
                        break
                    if self._stopping and not self.total_queued():
                        return
                    if self._next_deadline:
                        until_deadline = max(0.0, (self._next_deadline - now) / 1e9)
                        wait = until_deadline if wait is None else min(wait, until_deadline)
                    (self._lane_cond if lane else self._parked if parked else self._cond).wait(wait)
                executor = self.executor
            if main and executor is not priority_of:
                priority_of = executor
                if _yields_cpu(executor) != idle:
                    idle = compute_priority(idle=not idle)
            try:
                self._run(executor, batch, lane, narrow)
            finally:
                if not lane:
                    with self._cond:
                        self._finished(batch)

    def _run(self, executor: Executor, batch: list[Pending], lane: bool = False, narrow: bool = False) -> None:
        start = time.monotonic_ns()
        try:
            if narrow:
                outputs, params, assemble_s, compute_s = executor.run_batch(batch, narrow=True)
            else:
                outputs, params, assemble_s, compute_s = executor.run_batch(batch)
        except Exception as e:  # the model failed; the server does not
            self._busy(lane, time.monotonic_ns() - start, narrow)
            if len(batch) > 1 and batch[0].key[0] != "sequence":
                # One request's input can fail a whole batch (a shape only the model
                # checks): run each alone, so only the culprit gets the error.
                # (Not for decode steps: those already advanced their KV caches.)
                for p in batch:
                    self._run(executor, [p], lane, narrow)
                return
            error = _classify(e, self.name)
            if isinstance(error, Internal):
                log.error("model %s failed on a batch of %d: %s", self.name, len(batch), e)
            for p in batch:
                _fail(p, error)
            return
        rows = sum(p.rows for p in batch)
        # before its answers go: what arrives from now on may be theirs (regrouping)
        self._busy(lane, time.monotonic_ns() - start, narrow, len(batch), rows)
        version = getattr(getattr(executor, "model", None), "version", "")
        assemble_us, compute_us = int(assemble_s * 1e6), int(compute_s * 1e6)
        for p, out, par in zip(batch, outputs, params):
            queue_us = (start - p.arrival_ns) // 1000
            if not p.future.done():
                try:
                    p.future.set_result(Result(out, queue_us, compute_us, assemble_us, rows, len(batch), p.level, version, par))
                except concurrent.futures.InvalidStateError:  # cancelled meanwhile
                    pass
        with self._cond:                # instances finish concurrently
            self.completed += len(batch)
        if self.observer:
            self.observer.on_batch(batch, (start, assemble_us, compute_us), rows, version)

    def _busy(self, lane: bool, ns: int, narrow: bool = False, requests: int = 0, rows: int = 0) -> None:
        """A batch took `ns`; `requests` > 0: its `rows` were computed, answers go next."""
        with self._cond:
            if requests and not lane:
                self._done_ns, self._done_requests, self._since_done = time.monotonic_ns(), requests, 0
                self._batch_ns, self._row_ns, self._regrouping = ns, ns // max(1, rows), False
            if narrow:                  # one of N threads: 1/N of the capacity the wide run has
                self.busy_ns += ns // self.split_width
                self.narrow_batches += 1
            elif lane:
                self.lane_busy_ns += ns
                self.lane_batches += 1
            else:
                self.busy_ns += ns


def _yields_cpu(executor) -> bool:
    return getattr(executor, "yields_cpu", False)


def compute_priority(idle: bool) -> bool:
    """Put the calling thread in SCHED_IDLE (Linux: it runs when nothing else on its CPU - in a
    container, nothing else in its cgroup - wants to) or, `idle` False, back in SCHED_OTHER;
    whether it is in SCHED_IDLE afterwards. Lowering one's own priority needs no privilege;
    raising it back needs CAP_SYS_NICE or room in RLIMIT_NICE. Refused, the thread stays as
    it was and says so."""
    name = "SCHED_IDLE" if idle else "SCHED_OTHER"
    try:
        os.sched_setscheduler(threading.get_native_id(), getattr(os, name), os.sched_param(0))
        return idle
    except (AttributeError, OSError) as e:
        log.warning("cannot put a compute thread in %s (%s); it keeps its priority", name, e)
        return not idle


def _classify(e: Exception, model: str) -> InferenceError:
    if isinstance(e, InferenceError):
        return e
    # onnxruntime raises its InvalidArgument for inputs the graph rejects at run time.
    if type(e).__name__ in ("InvalidArgument", "InvalidShape"):
        return InvalidArgument(f"model {model!r} rejected the input: {e}")
    return Internal(f"model {model!r} failed: {type(e).__name__}: {e}")


def _fail(p: Pending, error: Exception) -> None:
    if not p.future.done():
        try:
            p.future.set_exception(error)
        except concurrent.futures.InvalidStateError:
            pass
