"""The dynamic batcher's runtime: the threads around the batch formation.

What leaves when, on which instance, is decided by BatchFormation (batch_formation.py;
the queue itself is batch_queue.py), a pure state machine fed the time. This module is
what Triton's DynamicBatchScheduler keeps beside its PriorityQueue: the threads, the lock
and its conditions, the futures, the runs and their answers. Each call into the
formation happens under the one lock, with `now` read here.

Threads. One compute thread per main instance (`instances` N; split under load: the wide
one and N narrow ones), each taking its batches from `BatchFormation.next_batch`; the
reserved lane's threads (`reserved_lane_threads`), started when a policy first asks for
them; and a timeout reaper,
so that a request whose deadline passes while every instance computes a long batch is
refused at once. One lock and four conditions, so that a submit wakes only the thread
that has something to do: the main instances, the lane (levels 1..N only), the reaper
(only for a nearer deadline), and the threads of the split mode not in use (parked).
Everything else - parsing, encoding - happens on the server's threads, which only enqueue.

Deferred submits and inline runs (`submit_deferred` + `flush`). The event loop queues
every request it decodes in one turn without waking a compute thread, then flushes once:
the requests read together leave together (one wake-up, not one per request). For a
model whose batch-1 run is cheaper than a thread hop (`executor.inline_ok`, measured at
warm-up) the flush runs the batches itself, on the loop, while a main instance is idle:
the batches a compute thread would have formed, minus the hand-over. `run_alone` goes one
step further for a lone gRPC request: when a flush would run it alone now, it runs on the
caller's thread without entering the queue, with a Settled future.

Compute priority. A narrow instance, and a main one whose executor `yields_cpu` (a CPU
session on one intra-op thread), computes at SCHED_IDLE: the event loop and the gRPC
threads then have a core whenever they have work, and the batch takes the rest. A hot
reload that swaps in a session of another thread count moves the thread to match (back to
SCHED_OTHER needs CAP_SYS_NICE or room in RLIMIT_NICE; refused, it stays and says so).

A batch the model fails is run again request by request, so that only the request whose
input the model rejects gets the error (not decode steps: their KV caches already moved).
"""
from __future__ import annotations

import collections
import concurrent.futures
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from mcp26.mesh.batching_policy import BatcherSettings
from mcp26.inference.batch_formation import BatchFormation
from mcp26.inference.batch_queue import Pending
from mcp26.inference.errors import InferenceError, Internal, InvalidArgument, Overloaded

log = logging.getLogger("mcp26.inference")


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
    """One model's batcher: the formation (batch_formation.py) and the threads that run its batches."""

    def __init__(self, name: str, executor: Executor, settings: BatcherSettings,
                 observer: Observer | None = None, idle_dispatch: bool = False, instances: int = 1,
                 split: int = 0):
        self.name = name
        self.executor = executor
        self.observer = observer
        self.formation = BatchFormation(name, settings, idle_dispatch, instances, split)
        lock = threading.Lock()
        self._cond = threading.Condition(lock)       # the main instances
        self._lane_cond = threading.Condition(lock)
        self._reap_cond = threading.Condition(lock)
        self._parked = threading.Condition(lock)     # split under load: the threads of the other mode
        self.busy_ns = 0                   # main instances' compute time so far, summed, for utilisation
        self.lane_busy_ns = 0              # the reserved lane's
        self.lane_batches = 0
        self.narrow_batches = 0
        self.completed = 0
        self.inline_runs = 0
        # Policy changes and when the first batch under each was formed (wall clock, so another
        # process - a benchmark, the decision loop - can compare with its own times): /admin/status.
        self.policy_generation = 0
        self.policy_changes: collections.deque = collections.deque(maxlen=64)
        self._batch_generation = 0
        self._lanes: list[threading.Thread] = []
        f = self.formation
        threads = 1 + f.split_width if f.split_width else f.instances
        self._threads = [threading.Thread(target=self._loop, kwargs={"instance": i}, daemon=True,
                                          name=f"batcher-{name}" + (f"-{i}" if i else ""))
                         for i in range(threads)]
        for t in self._threads:
            t.start()
        self._start_lane()
        self._reaper = threading.Thread(target=self._reap, name=f"batcher-{name}-timeouts", daemon=True)
        self._reaper.start()

    # What the model server reports (/admin/status, ModelConfig), as the formation holds it.
    settings = property(lambda self: self.formation.settings)
    idle_dispatch = property(lambda self: self.formation.idle_dispatch)
    instances = property(lambda self: self.formation.instances)
    in_flight = property(lambda self: self.formation.in_flight)
    split_width = property(lambda self: self.formation.split_width)
    split = property(lambda self: self.formation.split)
    split_changes = property(lambda self: self.formation.split_changes)
    seen_load = property(lambda self: self.formation.seen_load)
    regroup_waits = property(lambda self: self.formation.regroup_waits)

    # -- called from request threads ------------------------------------------------
    def submit(self, p: Pending, qos_class: str | None = None, priority: int | None = None) -> concurrent.futures.Future:
        policy = self.formation.admit(p, qos_class, priority, time.monotonic_ns())
        if p.future is None:
            p.future = concurrent.futures.Future()
        with self._cond:
            self._enqueue(p, policy)
        return p.future

    def submit_deferred(self, p: Pending, qos_class: str | None = None, priority: int | None = None) -> None:
        """Queue `p` without waking anyone: the caller (the event loop) calls `flush()` once
        it has taken every request it can read this turn, so they leave as one batch."""
        policy = self.formation.admit(p, qos_class, priority, time.monotonic_ns())
        if p.future is None:
            p.future = concurrent.futures.Future()
        with self._cond:
            self._enqueue(p, policy, wake=False)

    def _enqueue(self, p: Pending, policy, wake: bool = True) -> None:
        """Queue `p` (the lock is held) and wake who must know: the reaper for a nearer
        deadline, every thread when the split switched, and (`wake`) the instances now."""
        f = self.formation
        deadline, changes = f.queue.next_deadline, f.split_changes
        try:
            f.enqueue(p, policy)
        except Overloaded:
            if self.observer:
                self.observer.on_reject(p.level, "queue_full")
            raise
        if f.queue.next_deadline != deadline:
            self._reap_cond.notify()
        if f.split_changes != changes:
            self._cond.notify_all()         # the threads of the old mode park,
            self._parked.notify_all()       # those of the new one take over
        if not wake:
            return
        self._cond.notify()
        if self._lanes and p.level <= f.settings.reserved_lane_levels:
            self._lane_cond.notify()

    def run_alone(self, p: Pending, qos_class: str | None = None, priority: int | None = None) -> bool:
        """Run `p` now, on this thread, as a batch of one, when that is the batch a flush would
        form at once (BatchFormation.take_alone) and the model is cheap (inline runs). It never
        enters a queue, and its future is a Settled one (ServedModel.submit's `run_now`). False:
        nothing was done (beyond the admission checks, which raise as submit's do); queue it."""
        f = self.formation
        if not (f.idle_dispatch and getattr(self.executor, "inline_ok", False)) or f.split_width:
            return False
        f.admit(p, qos_class, priority, time.monotonic_ns())
        with self._cond:
            if not f.take_alone(p):
                return False
            self._formed()
            executor = self.executor
        p.future = Settled()
        self.inline_runs += 1
        try:
            self._run(executor, [p])
        finally:
            with self._cond:
                f.finished([p])
        return True

    def flush(self) -> None:
        """After a turn of deferred submits: run what is queued here, in batches, when the
        model is cheap enough and a main instance idle (inline runs); else wake the compute
        threads once."""
        f = self.formation
        inline = f.idle_dispatch and getattr(self.executor, "inline_ok", False)
        while inline:
            with self._cond:
                if not f.instance_free() or f.stopping:
                    break
                batch, _ = f.form(time.monotonic_ns(), admits=getattr(self.executor, "admits", None))
                if not batch:           # nothing queued, or a batch waiting for a request being decoded
                    break
                f.started(batch)
                self._formed()
                executor = self.executor
            self.inline_runs += 1
            try:
                self._run(executor, batch)
            finally:
                with self._cond:
                    f.finished(batch)
        with self._cond:
            if f.queue.total():
                self._cond.notify()
                if self._lanes:
                    self._lane_cond.notify_all()

    def arrived(self) -> None:
        """A front end read a request it will submit (or refuse): `departed()` follows."""
        self.formation.arriving += 1

    def departed(self, submitting: bool = False) -> None:
        """`submitting`: the request is submitted next (its submit wakes the instance)."""
        f = self.formation
        f.arriving -= 1
        if not submitting and f.arriving == 0 and f.idle_dispatch and f.queue.total():
            with self._cond:            # a batch may have been waiting for this one
                self._cond.notify()

    def update_settings(self, settings: BatcherSettings) -> None:
        """Take new settings for every batch formed from now on; queued requests keep
        their place (a level beyond the new priority_levels is served as the lowest)."""
        with self._cond:
            self.formation.settings = settings
            self.policy_generation += 1
            self.policy_changes.append({"generation": self.policy_generation, "policy": settings.name,
                                        "applied_at": time.time(), "first_batch_at": None})
            self._start_lane()
            self._notify_all()

    def instance_free(self) -> bool:
        """A main instance is idle (read without the lock, it is a hint)."""
        return self.formation.instance_free()

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
        """Start the reserved lane's threads a policy asks for (those beyond a later, smaller
        count stay idle: BatchFormation.next_batch)."""
        s = self.formation.settings
        while s.reserved_lane_levels and len(self._lanes) < s.reserved_lane_threads:
            i = len(self._lanes)
            t = threading.Thread(target=self._loop, args=(True, i), name=f"batcher-{self.name}-lane-{i}", daemon=True)
            self._lanes.append(t)
            t.start()

    def reserved_threads(self) -> int:
        """The reserved lane's threads held now (BatchFormation.reserved_threads)."""
        with self._cond:
            return self.formation.reserved_threads()

    def set_executor(self, executor: Executor) -> None:
        """Swap the model under the queue; the batch being computed finishes on the old one."""
        with self._cond:
            self.executor = executor

    def queue_depth(self) -> dict[int, int]:
        with self._cond:
            return self.formation.queue.depth()

    def total_queued(self) -> int:
        return self.formation.queue.total()

    def stop(self, timeout: float = 10.0) -> None:
        """Serve what is queued, then end the compute threads."""
        with self._cond:
            self.formation.stopping = True
            self._notify_all()
        for t in self._threads:
            t.join(timeout)
        for t in self._lanes:
            t.join(timeout)
        self._reaper.join(timeout)

    # -- the compute threads (and the timeout reaper) --------------------------------
    def _reap(self) -> None:
        f = self.formation
        with self._cond:
            while not f.stopping:
                now = time.monotonic_ns()
                self._expire(now)
                wait = (f.queue.next_deadline - now) / 1e9 if f.queue.next_deadline else None
                self._reap_cond.wait(wait if wait is None else max(wait, 0.0005))

    def _expire(self, now: int) -> None:
        """Fail the requests whose timeout REJECTs them by `now` (the lock is held)."""
        for p in self.formation.expire(now):
            if self.observer:
                self.observer.on_reject(p.level, "timeout")
            _fail(p, Overloaded(f"request timed out after {(now - p.arrival_ns) // 1000} us in the priority "
                                f"level {p.level} queue of model {self.name!r} (timeout_action REJECT)"))

    def _loop(self, lane: bool = False, instance: int = 0) -> None:
        """A main instance's compute thread, or (lane=True) the reserved lane's."""
        f = self.formation
        narrow = bool(f.split_width) and instance > 0 and not lane
        # SCHED_IDLE for a narrow instance, and for a main one whose executor yields its CPU
        # (looked at again when a hot reload swaps the executor)
        main, priority_of = not (lane or narrow), self.executor
        idle = compute_priority(idle=True) if narrow or (main and _yields_cpu(self.executor)) else False
        while True:
            with self._cond:
                while True:
                    now = time.monotonic_ns()
                    self._expire(now)
                    turn = f.next_batch(now, instance, lane, serial=not getattr(self.executor, "concurrent_runs", True),
                                        admits=getattr(self.executor, "admits", None))
                    if turn.batch:
                        self._formed()
                        break
                    if turn.stop:
                        return
                    (self._lane_cond if lane else self._parked if f.parked(instance) else self._cond).wait(turn.wait)
                executor, batch = self.executor, turn.batch
            if main and executor is not priority_of:
                priority_of = executor
                if _yields_cpu(executor) != idle:
                    idle = compute_priority(idle=not idle)
            try:
                self._run(executor, batch, lane, narrow)
            finally:
                with self._cond:
                    if lane:
                        f.lane_finished(batch)
                    else:
                        f.finished(batch)
                    if f.settings.freeze_levels and f.queue.total() and any(
                            p.level in f.settings.freeze_while_levels for p in batch):
                        self._cond.notify_all()     # a frozen level may start now (Freezing)

    def _run(self, executor: Executor, batch: list[Pending], lane: bool = False, narrow: bool = False) -> None:
        start = time.monotonic_ns()
        try:
            if narrow:
                outputs, params, assemble_s, compute_s = executor.run_batch(batch, narrow=True)
            else:
                outputs, params, assemble_s, compute_s = executor.run_batch(batch)
        except Exception as e:  # the model failed; the server does not
            self._busy(lane, start, narrow)
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
        self._busy(lane, start, narrow, len(batch), rows)
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

    def _busy(self, lane: bool, start: int, narrow: bool = False, requests: int = 0, rows: int = 0) -> None:
        """A batch ran from `start` until now; `requests` > 0: its `rows` were computed, answers go next."""
        now = time.monotonic_ns()
        ns = now - start
        with self._cond:
            if requests and not lane:
                self.formation.computed(now, requests, rows, ns)
            if narrow:                  # one of N threads: 1/N of the capacity the wide run has
                self.busy_ns += ns // self.formation.split_width
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
