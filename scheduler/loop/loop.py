"""The decision loop: every period (by absolute deadlines, so it does not drift),
gather signals, call the policy within a time budget, apply its actions, and keep
the last decisions with their inputs, expiry and the call's cost for status.

It also wakes on the shared ring (scheduler/loop/flows.py `bells`): a producer that
published rings, and a cycle runs at once (`trigger` "ring") instead of at the next
deadline - at most one such cycle every `min_gap_s` (10 ms), so a storm of records is read in
batches; the periodic schedule is not moved by it.

A policy that raises, or does not answer within its budget, keeps the last
decision in force (its remaps keep their expiry); the reason is counted and
shown. The policy runs in a worker thread: a slow one is abandoned, not awaited
(a Wasm plugin's own fuel/epoch budget is what actually stops it).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import resource
import time
from collections import deque

from mcp26.scheduler.decisions import ResourceSignals, Signals
from mcp26.scheduler.loop.actions import ActionApplier
from mcp26.scheduler.loop.policy import PolicyFailed
from mcp26.scheduler.loop.signals import ReplicaReader

log = logging.getLogger("mcp26.scheduler.loop")


def _percentile(values, q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class DecisionLoop:
    def __init__(self, policy, policy_name: str, endpoints_fn, applier: ActionApplier,
                 period_s: float = 0.2, budget_s: float | None = None, flows_fn=None, keep: int = 20,
                 resources=None, min_gap_s: float | None = None):
        self.policy, self.policy_name = policy, policy_name
        self.endpoints_fn = endpoints_fn        # () -> endpoints (ip:port) of the pool now
        self.flows_fn = flows_fn or (lambda: ())
        self.applier = applier
        self.period_s = period_s
        self.budget_s = budget_s if budget_s is not None else period_s / 4
        self.reader = ReplicaReader(timeout_s=period_s * 0.6)
        self.cycles = 0
        self.failures = {"raised": 0, "over_budget": 0}
        self.last_failure: dict | None = None
        self.in_force: dict | None = None       # the last decision the policy made (kept on failure)
        self.history: deque = deque(maxlen=keep)
        self.lateness_ms: deque = deque(maxlen=3000)     # wake-up time minus deadline
        self.cycle_cpu_ms: deque = deque(maxlen=3000)
        self.call_ms: deque = deque(maxlen=3000)
        self.started_at = time.time()
        self.resources = resources              # scheduler.loop.resources.ResourceSampler, or None
        self.min_gap_s = min(period_s / 20, 0.01) if min_gap_s is None else min_gap_s
        self.woken = 0                          # cycles a ring's bell started
        self.wake_ms: deque = deque(maxlen=3000)     # bell readable -> its cycle started
        self._rung_at: float | None = None
        self._wake: asyncio.Event | None = None

    def _watch_bells(self, loop) -> list:
        """Register the rings' bells with the event loop; -> the fds to remove."""
        fds = []
        for bell in getattr(self.flows_fn, "bells", ()):
            def rung(bell=bell):
                if bell.drain() and self._rung_at is None:
                    self._rung_at = loop.time()
                    self._wake.set()
            loop.add_reader(bell.fd, rung)
            fds.append(bell.fd)
            sock = getattr(bell, "sock", None)
            if sock is not None:                # a file ring's doorbell: producers ask for its eventfd here
                loop.add_reader(sock.fileno(), bell.serve)
                fds.append(sock.fileno())
        return fds

    async def run(self, cycles: int | None = None) -> None:
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        bells = self._watch_bells(loop)
        if self.resources is not None:
            self.resources.start()
        try:
            await self._run(loop, cycles)
        finally:
            for fd in bells:
                loop.remove_reader(fd)
            if self.resources is not None:
                await self.resources.stop()

    async def _run(self, loop, cycles: int | None) -> None:
        start = loop.time()
        k = 0
        last_woken = -1e9
        while cycles is None or k < cycles:
            deadline = start + k * self.period_s
            delay = deadline - loop.time()
            if delay > 0:
                try:
                    await asyncio.wait_for(self._wake.wait(), delay)
                except asyncio.TimeoutError:
                    pass
            if self._wake.is_set() and loop.time() < deadline:
                if loop.time() - last_woken < self.min_gap_s:      # read storms in batches
                    await asyncio.sleep(self.min_gap_s - (loop.time() - last_woken))
                self._wake.clear()
                rung, self._rung_at = self._rung_at, None
                last_woken = loop.time()
                self.woken += 1
                if rung is not None:
                    self.wake_ms.append((last_woken - rung) * 1e3)
                try:
                    await self.cycle(trigger="ring")
                except Exception:
                    log.exception("cycle failed")
                continue                                           # the periodic deadline stays
            self._wake.clear()
            self._rung_at = None
            woke = loop.time()
            if woke - deadline > self.period_s:          # fell behind by whole periods: skip them, count it
                skipped = int((woke - deadline) // self.period_s)
                k += skipped
                deadline += skipped * self.period_s
            self.lateness_ms.append((woke - deadline) * 1e3)
            cpu = _cpu_s()
            try:
                await self.cycle()
            except Exception:                      # the loop outlives any one cycle
                log.exception("cycle failed")
            self.cycle_cpu_ms.append((_cpu_s() - cpu) * 1e3)
            k += 1

    async def cycle(self, trigger: str = "period") -> None:
        now = time.time()
        self.cycles += 1
        replicas = await self.reader.read(self.endpoints_fn())
        flows = tuple(self.flows_fn())
        take = getattr(self.flows_fn, "take_bursts", None)
        bursts = take({pid: e for e, pid in self.reader.pids.items()}) if take else ()
        signals = Signals(now_s=now, replicas=replicas, flows=flows, write_bursts=bursts,
                          resources=self.resources.view() if self.resources is not None else ResourceSignals(),
                          trigger=trigger)
        started = time.perf_counter()
        try:
            actions = await asyncio.wait_for(asyncio.to_thread(self.policy.decide, signals), self.budget_s)
            call_ms = (time.perf_counter() - started) * 1e3
            failure = None
        except PolicyFailed as e:             # a Wasm plugin cut off (fuel, deadline, trap, memory, ...)
            call_ms, actions = (time.perf_counter() - started) * 1e3, None
            failure = {"reason": f"plugin:{e.reason}", "detail": e.detail}
        except asyncio.TimeoutError:
            call_ms, actions = (time.perf_counter() - started) * 1e3, None
            failure = {"reason": "over_budget", "detail": f"no answer within {self.budget_s * 1e3:.0f} ms"}
        except Exception as e:
            call_ms, actions = (time.perf_counter() - started) * 1e3, None
            failure = {"reason": "raised", "detail": f"{type(e).__name__}: {e}"}
        self.call_ms.append(call_ms)
        self.applier.expire(now)
        record = {"cycle": self.cycles, "at": now, "call_ms": round(call_ms, 3), "trigger": trigger,
                  "inputs": {"replicas": [dataclasses.asdict(r) for r in replicas],
                             "flows": [dataclasses.asdict(f) for f in signals.flows],
                             "write_bursts": [dataclasses.asdict(b) for b in bursts],
                             "read_errors": dict(self.reader.errors)}}
        if failure is not None:
            self.failures[failure["reason"]] = self.failures.get(failure["reason"], 0) + 1
            self.last_failure = {**failure, "at": now, "cycle": self.cycles}
            log.warning("policy %s: %s (%s); the last decision stands", self.policy_name,
                        failure["reason"], failure["detail"])
            record.update(failure=failure, kept=self.in_force["cycle"] if self.in_force else None)
        else:
            outcomes = await self.applier.apply(list(actions), now, flow_hold_s=2 * self.period_s)
            record["actions"] = [{**dataclasses.asdict(a), **o} for a, o in zip(actions, outcomes)]
            self.in_force = record
        if failure is not None or self._changed(record):
            self.history.append(record)
        self.latest = record

    def _changed(self, record) -> bool:
        """Keep a decision in the history when what it did differs from the last kept one."""
        if not self.history:
            return True
        key = lambda r: [(a["kind"], a["subject"], a["value"], a.get("unchanged", False))
                         for a in r.get("actions", [])]
        return key(self.history[-1]) != key(record) or any(not a.get("unchanged", True) and a["kind"] == "remap-class"
                                                           for a in record.get("actions", []))

    def status(self) -> dict:
        now = time.time()
        lat = list(self.lateness_ms)
        return {
            "policy": self.policy_name, "period_ms": self.period_s * 1e3, "budget_ms": self.budget_s * 1e3,
            "cycles": self.cycles, "failures": dict(self.failures), "last_failure": self.last_failure,
            "jitter_ms": {"p50": round(_percentile(lat, 0.5), 3), "p99": round(_percentile(lat, 0.99), 3),
                          "max": round(max(lat, default=0.0), 3)},
            "policy_call_ms": {"p50": round(_percentile(list(self.call_ms), 0.5), 3),
                               "p99": round(_percentile(list(self.call_ms), 0.99), 3)},
            "cycle_cpu_ms": {"mean": round(sum(self.cycle_cpu_ms) / max(1, len(self.cycle_cpu_ms)), 3),
                             "p99": round(_percentile(list(self.cycle_cpu_ms), 0.99), 3)},
            "in_force": {
                "class_remaps": [{"from": k, **v, "expires_in_s": round(v["expires_at"] - now, 3)}
                                 for k, v in self.applier.remaps.items()],
                "flows": [{"flow": k, **v, "expires_in_s": round(v["expires_at"] - now, 3)}
                          for k, v in self.applier.flows.items()],
                "endpoint_weights": self.applier.in_force_weights(now),
                "decided_in_cycle": self.in_force["cycle"] if self.in_force else None,
            },
            "flow_ring": self.flows_fn.stats() if callable(getattr(self.flows_fn, "stats", None)) else None,
            "woken_by_ring": {"cycles": self.woken,
                              "bell_to_cycle_ms": {"p50": round(_percentile(list(self.wake_ms), 0.5), 3),
                                                   "p99": round(_percentile(list(self.wake_ms), 0.99), 3)}},
            "resources": self.resources.describe() if self.resources is not None else None,
            "plugin": self.policy.stats() if callable(getattr(self.policy, "stats", None)) else None,
            "latest": getattr(self, "latest", None),
            "decisions": list(self.history),
        }

    async def close(self) -> None:
        if callable(getattr(self.flows_fn, "close", None)):
            self.flows_fn.close()
        await self.reader.close()
        await self.applier.close()
        if callable(getattr(self.policy, "close", None)):
            self.policy.close()
