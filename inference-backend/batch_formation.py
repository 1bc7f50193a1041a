"""Which batch leaves when, and on which instance: Triton's dynamic-batching rules and
the model server's additions to them, as a state machine over the queue (batch_queue.py).

Triton's rules (core src/dynamic_batch_scheduler.cc, GetDynamicBatch): a batch is taken
in (level, arrival) order from requests that can share one run (equal `key`: inputs,
non-batch shape, outputs). It leaves when it reaches max_batch_size, when it reaches
the largest preferred_batch_size it can, or when its oldest request has waited
max_queue_delay_microseconds.

Pure: no threads, no lock, no clock. The batcher (batcher.py) holds its lock around
every call and passes `now` (time.monotonic_ns()); `form` and `next_batch` answer a
batch to run or how long to wait before asking again, and the batcher's threads only
wait, run and answer. The measurements behind the choices below are in
docs/benchmarks/batcher.md.

Instances (`instances` N, Triton's instance_group count). N compute threads take
batches from the one queue, each on its share of the cores: two one-thread batches
never wait for each other as the halves of one two-thread GEMM do. A model that cannot
run concurrently (`serial`: the decoder's KV cache) uses instance 0 only.

Reserved lane (`reserved_lane_levels` N > 0). A batch cannot be pre-empted, so with one
instance a top-level request waits for the low batch computing when it came. Triton's
answer, a second instance, is taken by low work as soon as it is free. The lane is
`reserved_lane_threads` compute threads of its own (the seed's "2 threads reserved" for a
request upgraded to Critical) that form batches from levels 1..N only: idle until such a
request waits, then one starts it at once, and its batches are never back-filled with
lower levels. The reservation lasts as long as such a request is in the server (queued
or computing), not for a fixed hold: `reserved_threads()` is the lane's thread count
then and 0 once the last one has been answered. The main instances keep the rules below.

Weighted share (`level_weights`; None: Triton's strict level order). Levels 1..
`strict_levels` (latency-critical) go first, in level order. The other levels take batch
slots in proportion to their weight while they all wait (stride scheduling): each level
has a pass, the next slot goes to the waiting level whose pass is least (ties: the
higher priority), and a slot advances its level's pass by 1 / weight. A level that had
nothing waiting comes back at the current virtual time (the start pass of the last slot
given), so idling banks no credit. Under saturation High (weight 3) takes three slots to
the default class's one. A level without a weight (Low, unless `classWeights` gives it one)
is not shared: it takes the slots the weighted levels leave, in level order, as in Triton -
so the seed's downgrade of Medium to Low still puts Medium's work behind everyone's. Requests of another `key` than the batch's head, or held back by
the admission hook, advance the walk's passes without a slot: with mixed keys the share is
approximate within a batch, exact over the slots actually given.

Freezing (`freeze_levels`, `freeze_while_levels`: the seed's "`high` freezes
low-priority inference"). While a request of a freezing level (Critical, High) is queued
or computing, no batch of a frozen level (Low) starts and none rides along in another
level's batch; a Low batch already computing finishes (batches are not pre-empted).
Low's queue policy (timeouts, DELAY) still applies while it waits.

Idle dispatch (`idle_dispatch`). max_queue_delay bounds a batch's wait for company.
When every main instance is idle and no request is on its way in (`arriving`: read by a
front end, not yet submitted), waiting can only catch requests not yet received, so the
batch leaves at once. While an instance computes, requests gather by Triton's rules.
Every batch formed is one Triton's rules allow; only a lone request on an idle server
does not pay the delay.

Regrouping (with idle dispatch, one main instance). Closed-loop clients split into
groups once a batch leaves without some of them; each group then returns while the
other computes and leaves alone, for good. So an idle lone instance that just finished
a batch of n requests waits for n arrivals since its end, when such returns have been
taking (averaged over batches of two or more) less than that batch's compute time: two
groups pay a batch's fixed part twice a round, and overlapping one group's return with
the other's batch gains little where both use the same cores. The wait ends once n have
come, at 1.25x the average return time (extended by a row's compute time after each
arrival while they keep coming), and at the latest a batch's compute time or the queue
delay after the batch ended. Requests already queued when it ended wait with it. Nothing
waits when returns are slower than the model, after a lone request's return, with more
than one instance, or in the lane.

Split under load (`split` N >= 2). One batch on all N intra-op threads finishes soonest
while the load fits one batch; beyond that, N one-thread batches side by side do more
per second. Instance 0 (wide) runs the batches while the requests that arrivals find in
the server (queued + computing, averaged: SPLIT_EWMA) stay under N - 0.75 max batches;
above that, instances 1..N (narrow) run them, until the average has stayed under N - 1
batches for SPLIT_SETTLE_NS. The threads of the mode not in use are parked. While a
narrow instance computes another forms only full batches (or waits the delay): smaller
preferred sizes would read all the weights for fewer rows.

Admission hook (`admits(p, taking, head)`, the executor's, optional). It may hold a
request back from the batch being formed (None: it keeps its place and others pass it;
the queue is looked at again after GATED_RECHECK_S, since room is made outside it) or
say what it will take. The decoder uses it to start batch-class sequences only while its
KV budget has room (decoder.py).
"""
from __future__ import annotations

from typing import Callable, NamedTuple
import collections

from mcp26.mesh.batching_policy import BatcherSettings, QueuePolicy
from mcp26.inference.batch_queue import Pending, PriorityQueue
from mcp26.inference.errors import InvalidArgument, Unavailable

GATED_RECHECK_S = 0.005
SPLIT_EWMA = 1 / 64         # weight of one arrival in the split decision's load average
# How long the load average must stay under N - 1 batches before the wide instance takes the
# batches back: a closed-loop client that stalls for a moment sends its requests back in a
# burst that finds the server nearly empty, a dip of a few ms; a real fall of the load stays.
SPLIT_SETTLE_NS = 100_000_000
BACK_EWMA = 1 / 8           # weight of one batch in the regrouping's average time until its requests are back

Admits = Callable[[Pending, int, "Pending | None"], "int | None"]


class Turn(NamedTuple):
    """What a compute thread does next (BatchFormation.next_batch)."""
    batch: list[Pending] | None       # run this, now taken from the queue
    wait: float | None = None         # else ask again after this many seconds (None: when woken)
    stop: bool = False                # the batcher is stopping and nothing is left for this thread


STOP = Turn(None, None, True)


class BatchFormation:
    """The queue of one model and the state its batches are formed from (module docstring)."""

    def __init__(self, name: str, settings: BatcherSettings, idle_dispatch: bool = False,
                 instances: int = 1, split: int = 0):
        self.name = name
        self.settings = settings
        self.queue = PriorityQueue(name)
        self.idle_dispatch = idle_dispatch
        self.instances = max(1, instances)
        self.stopping = False
        self.arriving = 0                  # requests read by a front end, not yet submitted (idle dispatch)
        self.busy_instances = 0            # main instances running a batch (their thread, or an inline run)
        self.in_flight = 0                 # requests of the batches those run
        # Split under load: 0 off, else N narrow instances beside the wide one.
        self.split_width = split if split >= 2 else 0
        self.split = False                 # the narrow instances take the batches now
        self.split_changes = 0
        self.seen_load = 0.0               # requests in the server as arrivals find it, averaged
        self._light_since_ns: int | None = None    # split, and the average under N - 1 batches since
        # Regrouping: the last batch of a lone main instance, and what came since.
        self._done_ns = 0                  # when it finished
        self._done_requests = 0            # its requests
        self._batch_ns = 0                 # its compute time
        self._row_ns = 0                   # ... per row
        self._last_arrival_ns = 0
        self._regrouping = False           # waiting for them now
        self._since_done = 0               # requests queued since it finished
        self._back_ns = 0.0                # from a batch's end until as many requests came, averaged
        self.regroup_waits = 0             # batches that waited so
        # Weighted share: each shared level's pass, and the virtual time (the last slot's start pass).
        self._pass: dict[int, float] = {}
        self._vtime = 0.0
        self.slots: collections.Counter = collections.Counter()       # batch slots given, per level
        self.running: collections.Counter = collections.Counter()     # requests computing, per level
        self.freezes = 0                   # times a frozen level began to wait for a freezing one
        self._freezing = False

    # -- arrivals --------------------------------------------------------------------
    def admit(self, p: Pending, qos_class: str | None, priority: int | None, now: int) -> QueuePolicy:
        """`p`'s level, checks, arrival (`now`) and deadline; its level's policy."""
        s = self.settings
        try:
            p.level = s.level_for(qos_class, priority)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
        if p.rows > s.max_batch_size:
            raise InvalidArgument(f"batch size {p.rows} exceeds max_batch_size {s.max_batch_size} of model {self.name!r}")
        policy = s.policy_for(p.level)
        p.arrival_ns = now
        timeout = policy.timeout_us(p.timeout_us)
        p.deadline_ns = now + timeout * 1000 if timeout else 0
        return policy

    def enqueue(self, p: Pending, policy: QueuePolicy) -> None:
        """Queue an admitted `p` (it arrived at p.arrival_ns): Unavailable while stopping,
        Overloaded when its level is full. The split may switch (`split_changes`)."""
        if self.stopping:
            raise Unavailable(f"model {self.name!r} is shutting down")
        self.queue.enqueue(p, policy)
        self._arrival(p)
        if self.split_width:
            self._observe_load(p.arrival_ns)

    def _arrival(self, p: Pending) -> None:
        """What regrouping learns from an arrival."""
        self._since_done += 1
        self._last_arrival_ns = p.arrival_ns
        if self._since_done == self._done_requests > 1:     # as many as the last batch had: "back"
            back = p.arrival_ns - self._done_ns             # (a lone request's return says nothing of a group's)
            self._back_ns += (back - self._back_ns) * BACK_EWMA if self._back_ns else back

    def _observe_load(self, now: int) -> None:
        """An arrival: update the load average and switch wide / narrow."""
        seen = self.in_flight + self.queue.total()
        self.seen_load += (seen - self.seen_load) * SPLIT_EWMA
        batches = self.seen_load / max(1, self.settings.max_batch_size)
        if not self.split:
            if batches >= self.split_width - 0.75:
                self._switch_split()
        elif batches >= self.split_width - 1:
            self._light_since_ns = None
        elif self._light_since_ns is None:
            self._light_since_ns = now
        elif now - self._light_since_ns >= SPLIT_SETTLE_NS:
            self._switch_split()

    def _switch_split(self) -> None:
        self.split = not self.split
        self.split_changes += 1
        self._light_since_ns = None

    def expire(self, now: int) -> list[Pending]:
        """Timeouts due by `now` (batch_queue.PriorityQueue.expire); the REJECTed, to be failed."""
        return self.queue.expire(now, self.settings)

    # -- forming ---------------------------------------------------------------------
    def instance_free(self) -> bool:
        """A main instance is idle."""
        return self.busy_instances < self._capacity()

    def _capacity(self) -> int:
        if self.split_width:
            return self.split_width if self.split else 1
        return self.instances

    def parked(self, instance: int, lane: bool = False) -> bool:
        """Split under load: is main instance `instance` of the mode not in use?"""
        return bool(self.split_width) and not lane and (instance > 0) != self.split

    def form(self, now: int, top: int = 0, admits: Admits | None = None) -> tuple[list[Pending] | None, float | None]:
        """-> (a batch to run now, or None and how long to wait in seconds; None: until
        something changes). `top` > 0: only from levels 1..top (the reserved lane). The batch
        stays queued until `started` (or the lane's `queue.take`); cancelled requests leave."""
        s = self.settings
        head, batch, rows, overflow, oldest = None, [], 0, False, 0
        cancelled = []
        taking, gated = 0, False
        if top or s.level_weights is None:
            order = self.queue.ordered(top)
        else:
            order = self.queue.ordered_shared(s.strict_levels, s.weight_of, self._passes(), self._frozen())
        for p in order:
            f = p.future
            if f is not None and f.cancelled():
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
            self.queue.take(cancelled)
        if not batch:
            # a gated request is looked at again shortly: room is made by sequences ending,
            # which does not go through the queue
            return None, (GATED_RECHECK_S if gated else None)
        if overflow or rows >= s.max_batch_size or s.max_queue_delay_us == 0 or self.stopping:
            return batch, None
        if self.idle_dispatch and (top or not self.busy_instances):
            wait = 0 if top else self._regroup_wait(now)
            if wait:                    # the last batch's requests are coming back: they join this one
                return None, wait
            if self.arriving <= 0:
                # nothing can join in time and every main instance is idle (while another computes,
                # its answers bring more requests, so Triton's rules below apply); the reserved
                # lane's top-level requests never wait for company
                return batch, None
        if s.preferred_batch_sizes and not (self.split and self.busy_instances):
            # Triton: the largest preferred size a prefix of the queue reaches goes now
            # (split: full batches only while a narrow instance computes)
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

    def _passes(self) -> dict[int, float]:
        """Each shared level's pass as the next slot sees it (no credit for time spent idle)."""
        return {level: max(p, self._vtime) for level, p in self._pass.items()}

    def _frozen(self) -> tuple[int, ...]:
        """The levels no batch may start from now (Freezing)."""
        s = self.settings
        frozen = bool(s.freeze_levels) and any(self.queue.waiting(lv) or self.running[lv]
                                                for lv in s.freeze_while_levels)
        holding = frozen and any(self.queue.waiting(lv) for lv in s.freeze_levels)
        if holding and not self._freezing:
            self.freezes += 1
        self._freezing = holding
        return s.freeze_levels if frozen else ()

    def _charge(self, batch: list[Pending]) -> None:
        """`batch` takes its slots: the passes move (Weighted share), its levels count as computing."""
        s = self.settings
        for p in batch:
            self.slots[p.level] += 1
            self.running[p.level] += 1
            if s.level_weights is None or p.level <= s.strict_levels or not s.weight_of(p.level):
                continue
            start = max(self._pass.get(p.level, 0.0), self._vtime)
            self._pass[p.level] = start + 1.0 / s.weight_of(p.level)
            self._vtime = start

    def _answered(self, batch: list[Pending]) -> None:
        for p in batch:
            self.running[p.level] -= 1

    def reserved_threads(self) -> int:
        """The lane's threads held now: all of them while a request of its levels is in the
        server (queued or computing), else none (Reserved lane)."""
        s = self.settings
        top = s.reserved_lane_levels
        if not top:
            return 0
        held = any(self.queue.waiting(lv) or self.running[lv] for lv in range(1, top + 1))
        return s.reserved_lane_threads if held else 0

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

    def next_batch(self, now: int, instance: int = 0, lane: bool = False, serial: bool = False,
                   admits: Admits | None = None) -> Turn:
        """The next turn of a compute thread: main instance `instance` or the reserved lane;
        `serial`: the executor cannot run two batches at once. A batch returned is taken."""
        top = self.settings.reserved_lane_levels if lane and not serial else 0
        lane_off = lane and (not top or self.stopping or instance >= self.settings.reserved_lane_threads)
        if lane_off or (instance and serial and not lane) or self.parked(instance, lane):
            if self.stopping:
                return STOP             # instance 0 (split: the threads of the mode) drains what is left
            # lane switched off by a policy update, a serial model, or not this thread's mode: idle
            batch, wait = None, None
        else:
            batch, wait = self.form(now, top, admits)
        if batch and not lane and not self.instance_free():
            batch, wait = None, None    # an inline run holds the last free instance
        if batch:
            if lane:
                self.queue.take(batch)
                self._charge(batch)
            else:
                self.started(batch)
            return Turn(batch)
        if self.stopping and not self.queue.total():
            return STOP
        if self.queue.next_deadline:    # timeouts are due then
            until_deadline = max(0.0, (self.queue.next_deadline - now) / 1e9)
            wait = until_deadline if wait is None else min(wait, until_deadline)
        return Turn(None, wait)

    def take_alone(self, p: Pending) -> bool:
        """Take an admitted `p` as a batch of one that never queues, when that is the batch a
        flush would form now: an idle main instance, nothing queued or being decoded, no
        regrouping wait. False: nothing changed."""
        if (self.stopping or self.arriving > 0 or not self.instance_free()
                or self.queue.total() or self._regroups(self._since_done + 1)):
            return False
        self._arrival(p)
        self.busy_instances += 1
        self.in_flight += 1
        self._charge([p])
        return True

    # -- a main instance's batch ------------------------------------------------------
    def started(self, batch: list[Pending]) -> None:
        """A main instance takes `batch` from the queue."""
        self.queue.take(batch)
        self._charge(batch)
        self.busy_instances += 1
        self.in_flight += len(batch)

    def finished(self, batch: list[Pending]) -> None:
        """...and is free again."""
        self.busy_instances -= 1
        self.in_flight -= len(batch)
        self._answered(batch)

    def lane_finished(self, batch: list[Pending]) -> None:
        """A lane thread's batch was answered."""
        self._answered(batch)

    def computed(self, now: int, requests: int, rows: int, compute_ns: int) -> None:
        """A main instance's batch of `requests` (`rows`) took `compute_ns` and ended at `now`:
        what arrives from now on may be its requests coming back (regrouping)."""
        self._done_ns, self._done_requests, self._since_done = now, requests, 0
        self._batch_ns, self._row_ns, self._regrouping = compute_ns, compute_ns // max(1, rows), False
