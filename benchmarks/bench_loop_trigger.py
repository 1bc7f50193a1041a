"""bench_loop_trigger: the decision loop woken by the shared ring (issue #43, the seed's kernel
chapter), from the event to its effect, p50/p99:

1. kernel: the write-burst tracer (tracepoint syscalls/sys_enter_write) watches a real model
   server; bursts of 64 concurrent answers every ~0.4 s. Per burst: its record's time (the
   kernel's clock) -> the loop's cycle starting (woken through the ring's BPF ring buffer bell)
   -> the replica taking the new batcher policy (/admin/status applied_at) -> its first batch
   under it (first_batch_at). The loop's period is 5 s: what happens sooner, the ring caused.
2. eventfd: a user-space producer (the model server's kind: a flow ring file) writes a record
   and rings the loop's eventfd doorbell; record -> cycle start. Beside 1, which of the two
   wake-ups is quicker here (the kernel's ring buffer or the eventfd).

`python -m benchmarks loop_trigger [--bursts N]` (root: the tracer); artifacts/bench/loop_trigger.json.
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import http.client
import json
import os
import pathlib
import sys
import tempfile
import threading
import time
import urllib.request

from mcp26.demo.stack.inference_server import InferenceServer
from mcp26.mesh import flow_ring as R
from mcp26.scheduler.loop.actions import ActionApplier
from mcp26.scheduler.loop.builtin_policy import BuiltinPolicy
from mcp26.scheduler.loop.flows import FlowSource
from mcp26.scheduler.loop.loop import DecisionLoop

PERIOD_S = 5.0
OUT = pathlib.Path(__file__).resolve().parent.parent / "artifacts" / "bench" / "loop_trigger.json"
INFER = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}).encode()


def _pct(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def _infer(port: int) -> int:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("POST", "/v2/models/mlp/infer", body=INFER, headers={"content-type": "application/json"})
        return c.getresponse().status
    finally:
        c.close()


class _Recording(DecisionLoop):
    """Keeps every cycle's record (the loop's own history keeps only changed decisions)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.records: list[dict] = []

    async def cycle(self, trigger: str = "period") -> None:
        await super().cycle(trigger)
        self.records.append(self.latest)


class _LoopThread:
    """The loop on an event loop of its own thread; `mono_at(wall)` converts its records' times."""

    def __init__(self, loop: DecisionLoop):
        self.loop = loop
        self.offset = time.time() - time.monotonic()
        self.aio = asyncio.new_event_loop()
        self.task = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        asyncio.set_event_loop(self.aio)
        self.task = self.aio.create_task(self.loop.run())
        try:
            self.aio.run_until_complete(self.task)
        except asyncio.CancelledError:
            pass
        self.aio.run_until_complete(self.loop.close())

    def stop(self):
        self.aio.call_soon_threadsafe(self.task.cancel)
        self.thread.join(10)


def kernel(bursts: int) -> dict:
    from mcp26.bpf.write_burst import WriteBurstTracer
    ring = f"/sys/fs/bpf/mcp-bench-trigger-{os.getpid()}"
    server = InferenceServer("builtin:mlp").start()
    tracer = WriteBurstTracer(ring)
    rows = []
    try:
        endpoint, admin = f"127.0.0.1:{server.http_port}", f"127.0.0.1:{server.admin_port}"
        tracer.watch(server.proc.pid, gap_us=20_000, min_bytes=8 << 10)
        loop = _Recording(BuiltinPolicy(burst_preset="throughput"), "builtin-python", lambda: [],
                          ActionApplier("127.0.0.1:1", replica_admin={endpoint: admin}), period_s=PERIOD_S,
                          flows_fn=FlowSource.at(ring))
        loop.reader.pids[endpoint] = server.proc.pid
        lt = _LoopThread(loop)
        stop = threading.Event()

        def trickle():                      # a steady request or two, so batches keep forming between bursts
            while not stop.is_set():
                _infer(server.http_port)
                time.sleep(0.005)
        steady = threading.Thread(target=trickle, daemon=True)
        steady.start()
        time.sleep(0.5)
        with concurrent.futures.ThreadPoolExecutor(64) as pool:
            for _ in range(bursts):
                list(pool.map(_infer, [server.http_port] * 64))
                time.sleep(0.4)
        time.sleep(0.5)
        stop.set()
        steady.join(5)
        lt.stop()
        with urllib.request.urlopen(f"http://{admin}/admin/status", timeout=5) as r:
            changes = {c["generation"]: c for c in json.load(r)["policy_changes"]["mlp"]}
        for d in loop.records:
            if d.get("trigger") != "ring" or not d["inputs"]["write_bursts"]:
                continue
            b = d["inputs"]["write_bursts"][0]
            burst_wall = d["at"] - b["age_ms"] / 1e3             # the record's time, on the wall clock
            act = next((a for a in d.get("actions", []) if a["kind"] == "batcher-policy" and a.get("applied")), None)
            gen = act and act.get("generation") and next(iter(act["generation"].values()))
            c = changes.get(gen)
            rows.append({"to_cycle_ms": b["age_ms"],
                         "to_applied_ms": (c["applied_at"] - burst_wall) * 1e3 if c else None,
                         "to_first_batch_ms": (c["first_batch_at"] - burst_wall) * 1e3 if c and c["first_batch_at"] else None})
        return {"rows": rows, "bell_to_cycle_ms": list(loop.wake_ms), "woken": loop.woken, "cycles": loop.cycles}
    finally:
        tracer.close()
        server.stop()


def eventfd(samples: int) -> dict:
    d = tempfile.mkdtemp(prefix="mcp-bench-ring-")
    path = os.path.join(d, "serving.ring")
    source = FlowSource.at(path)
    loop = _Recording(BuiltinPolicy(), "builtin-python", lambda: [], ActionApplier("127.0.0.1:1"),
                      period_s=PERIOD_S, flows_fn=source, min_gap_s=0)
    lt = _LoopThread(loop)
    time.sleep(0.3)
    ring = R.MappedRing(path)
    w, bell = ring.writer(), R.RingBell(R.doorbell_path(path))
    sent = []
    for i in range(samples):
        t = time.monotonic_ns()
        w.write_serving("127.0.0.1", 40000 + i, "127.0.0.1", 8000, 100.0, 0.5, t)
        bell.ring()
        sent.append(t)
        time.sleep(0.02)
    time.sleep(0.3)
    lt.stop()
    woke = [rec["at"] for rec in loop.records if rec.get("trigger") == "ring"]
    # each record's flow appears first in the cycle that read it: its age there is record -> cycle
    ages, seen = [], set()
    for rec in loop.records:
        for f in rec["inputs"]["flows"]:
            if rec.get("trigger") == "ring" and f["flow"] not in seen:
                ages.append(f["age_ms"])
            seen.add(f["flow"])
    return {"to_cycle_ms": ages, "bell_to_cycle_ms": list(loop.wake_ms), "woken": loop.woken, "sent": len(sent),
            "ring_cycles": len(woke)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench_loop_trigger")
    ap.add_argument("--bursts", type=int, default=40)
    args = ap.parse_args(argv)
    doc = {"started": time.time(), "loadavg_start": os.getloadavg()}
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    if os.geteuid() == 0:
        doc["kernel"] = kernel(args.bursts)
    else:
        print("not root: the tracer's section is skipped", file=sys.stderr)
    doc["eventfd"] = eventfd(args.bursts)
    doc["loadavg_end"] = os.getloadavg()
    print(f"\n{'(ms, p50 / p99)':<44} {'p50':>8} {'p99':>8} {'n':>5}")
    if "kernel" in doc:
        rows = doc["kernel"]["rows"]
        for label, key in (("burst record -> loop cycle (kernel bell)", "to_cycle_ms"),
                           ("burst record -> new batch policy applied", "to_applied_ms"),
                           ("burst record -> first batch under it", "to_first_batch_ms")):
            xs = [r[key] for r in rows if r[key] is not None]
            print(f"{label:<44} {_pct(xs, .5):>8.2f} {_pct(xs, .99):>8.2f} {len(xs):>5}")
        xs = doc["kernel"]["bell_to_cycle_ms"]
        print(f"{'  kernel bell readable -> cycle start':<44} {_pct(xs, .5):>8.2f} {_pct(xs, .99):>8.2f} {len(xs):>5}")
    xs = doc["eventfd"]["to_cycle_ms"]
    print(f"{'serving record -> loop cycle (eventfd)':<44} {_pct(xs, .5):>8.2f} {_pct(xs, .99):>8.2f} {len(xs):>5}")
    xs = doc["eventfd"]["bell_to_cycle_ms"]
    print(f"{'  eventfd readable -> cycle start':<44} {_pct(xs, .5):>8.2f} {_pct(xs, .99):>8.2f} {len(xs):>5}")
    print(f"(the loop's period: {PERIOD_S:.0f} s)  load average at end: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, indent=1))
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
