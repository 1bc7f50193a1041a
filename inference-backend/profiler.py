"""`--enable-profiler`: 17 metrics per served model, sampled per batch, exported live.

Sources, per metric (the README's table says the same):
- hardware counters (`hw_counters`: perf_event_open on the compute thread and ONNX
  Runtime's intra-op threads, read before and after each batch);
- the batcher (rows, queue wait, compute time of each batch);
- ONNX Runtime's own profiler, on a *profiling twin*: a second session of the same
  model file with `enable_profiling`, which now and then runs a copy of the last
  batch and is then ended and read (ONNX Runtime's profile can only be read by
  ending it, and the serving session must not pay for per-node timing). It gives
  the kernel time by operator type, the Memcpy nodes (host<->device copies, the
  design document's "DMA transfer wait") and which fused operators run on which
  provider. Its first sample runs when the model is loaded, before the server
  reports ready, on the warm-up's zero inputs (fusions and copies do not depend on
  the data; kernel times are scaled by rows); after that it runs at nice 19 and
  sleeps 50x as long as each sample took, at least 10 s, so it spends at most 2 %
  of one core (measured first at 20x from the start of the load: a 2 s sample of
  builtin:mlp inside a 6 s run cost a third of its throughput).

Counters are per batch that ran alone: instances and the reserved lane share
ONNX Runtime's pool threads, so a batch run beside another is left out of them.
Every metric is cumulative in `doc()` (the statistics extension's `profiler`
entry), split per priority level by each batch's rows and kept per compute
thread (`thread:TID`: a model instance), so a client (mcp-bench)
takes two readings and derives the window's values with `derive()`. A counter the
kernel does not give is `None` with its reason, never 0.
"""
from __future__ import annotations

import collections
import json
import logging
import os
import shutil
import tempfile
import threading
import time

from mcp26.inference import hw_counters
from mcp26.inference.runtime import OnnxModel
from mcp26.inference import model_format

log = logging.getLogger("mcp26.inference")

# (key, unit, source, meaning): one definition, for the README, /metrics, the statistics
# extension and mcp-bench's CSV columns.
METRICS = (
    ("cycles_per_batch", "cycles", "perf: cycles", "CPU cycles the inference threads spent on a batch"),
    ("instructions_per_batch", "instructions", "perf: instructions", "instructions retired per batch"),
    ("ipc", "ratio", "perf: instructions / cycles", "instructions per cycle"),
    ("l1d_hit_rate", "ratio", "perf: L1-dcache-loads, -load-misses", "L1 data-cache load hit rate"),
    ("llc_hit_rate", "ratio", "perf: cache-references, cache-misses",
     "last-level cache hit rate (the design document's \"L2 hit rate\": the last level perf's generic events reach)"),
    ("dtlb_misses_per_batch", "misses", "perf: dTLB-load-misses", "data-TLB load misses per batch"),
    ("branch_misses_per_batch", "misses", "perf: branch-misses", "mispredicted branches per batch"),
    ("page_faults_per_batch", "faults", "perf: page-faults (software)",
     "page faults per batch (first touch of mapped weights)"),
    ("context_switches_per_batch", "switches", "perf: context-switches (software)",
     "times the inference threads were switched out per batch"),
    ("cpu_ms_per_batch", "ms", "perf: task-clock (software)", "CPU time of the inference threads per batch"),
    ("fused_nodes", "nodes", "ONNX Runtime profile (twin) against the source graph",
     "source nodes ONNX Runtime's fusions merged into others (fusion: which were removed, which fused "
     "types run, on which provider, in effect or not)"),
    ("memcpy_ms_per_batch", "ms", "ONNX Runtime profile: Memcpy nodes (twin)",
     "host<->device copy time per batch (0 on the CPU provider: nothing to copy)"),
    ("memcpy_bytes_per_batch", "bytes", "ONNX Runtime profile: Memcpy nodes (twin)", "host<->device bytes per batch"),
    ("batch_fill_ratio", "ratio", "batcher", "rows per batch / max_batch_size"),
    ("queue_wait_ms", "ms", "batcher", "mean time a request waited in the queue before its batch ran"),
    ("compute_us_per_row", "us", "batcher", "batch compute time / rows"),
    ("kernel_ms_by_op_type", "ms", "ONNX Runtime profile (twin)",
     "kernel time per batch by operator type, scaled to the mean batch (kernel_by_op: {type: ms})"),
)
METRIC_KEYS = tuple(m[0] for m in METRICS)
UNITS = {m[0]: m[1] for m in METRICS}
# metric -> the counters it needs (all of them must be available)
NEEDS = {
    "cycles_per_batch": ("cycles",), "instructions_per_batch": ("instructions",),
    "ipc": ("instructions", "cycles"), "l1d_hit_rate": ("l1d_loads", "l1d_load_misses"),
    "llc_hit_rate": ("cache_references", "cache_misses"), "dtlb_misses_per_batch": ("dtlb_load_misses",),
    "branch_misses_per_batch": ("branch_misses",), "page_faults_per_batch": ("page_faults",),
    "context_switches_per_batch": ("context_switches",), "cpu_ms_per_batch": ("task_clock_ns",),
}
IDLE = "no batch in the window"
TWIN_DUTY = 50                  # the twin sleeps this many times as long as its last sample took
TWIN_MIN_INTERVAL_S = 10.0
TWIN_FIRST_ROWS = 8             # the first sample's batch (zero inputs, when the model is loaded)


def _zero_level() -> dict:
    # counted_batches: the batches whose counters were read (those that ran alone, below)
    return {"batches": 0.0, "rows": 0.0, "requests": 0, "capacity_rows": 0.0, "queue_ns": 0,
            "compute_ns": 0.0, "counted_batches": 0.0, "counters": collections.defaultdict(float)}


class Profiler:
    """The metrics of one served model (all its instances)."""

    def __init__(self, model, max_batch_size):
        self.max_batch_size = max_batch_size            # () -> the batcher's current max_batch_size
        self.events, self.unavailable = hw_counters.probe()
        self.counters = hw_counters.CounterSet(self.events)
        self._lock = threading.Lock()
        self.levels: dict[str, dict] = collections.defaultdict(_zero_level)
        self.twin: dict = {"samples": 0, "kernel_ns_by_op": {}, "rows": 0, "memcpy_ns": 0, "memcpy_bytes": 0,
                           "fusion": {}, "provider": None, "last_error": None, "sample_seconds": None}
        self._model = model
        self._last_feeds = None
        self._stop = threading.Event()
        self._tmp = tempfile.mkdtemp(prefix="mcp26-profile-")
        self._source_ops = None
        self.attach(model)
        t0 = time.perf_counter()
        try:                # before ready: the load is not yet there to pay for it
            self._sample([model.example_inputs(TWIN_FIRST_ROWS if model.batch_dim else 1)])
        except Exception as e:
            self.twin["last_error"] = f"{type(e).__name__}: {e}"
            log.warning("profiler: first twin sample failed: %s", e)
        self._first_took = time.perf_counter() - t0
        self._thread = threading.Thread(target=self._twin_loop, name="profiler-twin", daemon=True)
        self._thread.start()

    # -- wiring --------------------------------------------------------------------------
    def attach(self, model) -> None:
        """A (new) model version: count its ONNX Runtime threads too."""
        self._model = model
        self._source_ops = None
        self.counters.forget_exited()           # a replaced session's threads are gone
        self.pool = frozenset(model.extra.get("ort_threads", ()))
        for tid in self.pool:
            self.counters.watch(tid)

    def wrap(self, executor):
        return ProfilingExecutor(executor, self)

    def stop(self) -> None:
        self._stop.set()
        self.counters.close()
        shutil.rmtree(self._tmp, ignore_errors=True)

    # -- per batch -----------------------------------------------------------------------
    def record(self, batch, start_ns: int, compute_s: float, before, after, inputs: list[dict],
               thread: int) -> None:
        """One batch. `before`/`after`: its counters, None where another batch ran beside it
        (instances, the reserved lane: they share ONNX Runtime's pool threads, so neither
        batch's count would be its own): such a batch is left out of the counter metrics."""
        rows = sum(p.rows for p in batch)
        capacity = max(1, self.max_batch_size())
        counted = before is not None and after is not None
        delta = [max(0, a - b) for a, b in zip(after, before)] if counted else []   # never negative
        by_level = collections.Counter()
        for p in batch:
            by_level[str(p.level)] += p.rows
        with self._lock:
            # per priority level (split by rows), for all, and per compute thread (model instance)
            for key, share in [("all", 1.0), (f"thread:{thread}", 1.0)] + [(lv, n / rows)
                                                                          for lv, n in by_level.items()]:
                acc = self.levels[key]
                acc["batches"] += share
                acc["rows"] += rows * share
                acc["capacity_rows"] += capacity * share
                acc["compute_ns"] += compute_s * 1e9 * share
                if counted:
                    acc["counted_batches"] += share
                    for name, d in zip(self.events, delta):
                        acc["counters"][name] += d * share
            for p in batch:
                for key in ("all", str(p.level)):
                    self.levels[key]["requests"] += 1
                    self.levels[key]["queue_ns"] += max(0, start_ns - p.arrival_ns)
            self._last_feeds = inputs

    # -- the profiling twin ----------------------------------------------------------------
    def _twin_loop(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)   # its ORT threads inherit it
        except OSError:
            pass
        interval = max(TWIN_MIN_INTERVAL_S, TWIN_DUTY * self._first_took)
        while not self._stop.wait(interval):
            feeds = self._last_feeds
            if feeds is None:
                continue
            t0 = time.perf_counter()
            try:
                self._sample(feeds)
            except Exception as e:         # a sample that fails must not touch serving
                self.twin["last_error"] = f"{type(e).__name__}: {e}"
                log.warning("profiler: twin sample failed: %s", e)
            took = time.perf_counter() - t0
            self.twin["sample_seconds"] = round(took, 4)
            interval = max(TWIN_MIN_INTERVAL_S, TWIN_DUTY * took)

    def _sample(self, inputs: list[dict]) -> None:
        import numpy as np
        model = self._model
        feeds = inputs[0] if len(inputs) == 1 else {k: np.concatenate([i[k] for i in inputs]) for k in inputs[0]}
        # the twin is made as the serving session was (a .mcp26bin: mapped, or settled)
        twin = OnnxModel.load(model.name, model.version, model.path, model.requested_device,
                              model.intra_op_threads, warmup=False, profile=os.path.join(self._tmp, "twin"),
                              mapped=model.extra.get("mapped", True))
        twin.session.run(None, feeds)   # the first run allocates and warms: its events are replaced below
        twin.session.run(None, feeds)
        path = twin.session.end_profiling()
        try:
            with open(path) as fh:
                events = json.load(fh)
        finally:
            os.unlink(path)
        rows = len(next(iter(feeds.values())))
        nodes = {}                      # node -> (op type, provider, ns, output bytes) of the second run
        for e in events:
            if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
                args = e.get("args", {})
                nodes[e["name"][:-len("_kernel_time")]] = (args.get("op_name", "?"), args.get("provider"),
                                                           e.get("dur", 0) * 1000, int(args.get("output_size", 0) or 0))
        kernel, memcpy_ns, memcpy_bytes = collections.Counter(), 0, 0
        for op, _, ns, size in nodes.values():
            kernel[op] += ns
            if op.startswith("Memcpy"):
                memcpy_ns += ns
                memcpy_bytes += size
        if self._source_ops is None:
            self._source_ops = source_op_counts(model.path)
        executed = collections.Counter(op for op, *_ in nodes.values() if not op.startswith("Memcpy"))
        fused = collections.defaultdict(lambda: {"count": 0, "providers": set()})
        for name, (op, provider, _, _) in nodes.items():
            if op not in self._source_ops or name.startswith("fused "):
                fused[op]["count"] += 1
                fused[op]["providers"].add(provider)
        fusion = {
            # source nodes ONNX Runtime's optimisations merged into others (at pack time too)
            "merged_nodes": max(0, sum(self._source_ops.values()) - sum(executed.values())),
            "removed": {op: n - executed.get(op, 0) for op, n in sorted(self._source_ops.items())
                        if n > executed.get(op, 0)},
            "fused": {op: {"count": f["count"], "providers": sorted(p for p in f["providers"] if p),
                           "in_effect": model.provider in f["providers"]} for op, f in sorted(fused.items())},
        }
        with self._lock:
            t = self.twin
            t["samples"] += 1
            t["rows"] += rows
            for op, ns in kernel.items():
                t["kernel_ns_by_op"][op] = t["kernel_ns_by_op"].get(op, 0) + ns
            t["memcpy_ns"] += memcpy_ns
            t["memcpy_bytes"] += memcpy_bytes
            t["provider"] = model.provider
            t["fusion"] = fusion
            t["last_error"] = None

    # -- export --------------------------------------------------------------------------
    def doc(self) -> dict:
        """Cumulative figures (the statistics extension's `profiler` entry)."""
        with self._lock:
            levels = {k: {**{n: v for n, v in acc.items() if n != "counters"}, "counters": dict(acc["counters"])}
                      for k, acc in self.levels.items()}
            twin = {**self.twin, "kernel_ns_by_op": dict(self.twin["kernel_ns_by_op"]),
                    "fusion": dict(self.twin["fusion"])}
        return {"metrics": [{"key": k, "unit": u, "source": s, "meaning": m} for k, u, s, m in METRICS],
                "counters": self.events, "unavailable": self.unavailable,
                "threads": sorted(self.counters.threads), "levels": levels, "twin": twin}


def source_op_counts(path: str) -> collections.Counter:
    """Nodes by operator type of the model as its author wrote it (for a .mcp26bin: as
    recorded when it was packed, before ONNX Runtime's offline optimisation)."""
    import onnx
    if model_format.is_container(path):
        return collections.Counter(model_format.open_container(path).toc["optimization"].get("source_op_counts", {}))
    return collections.Counter(n.op_type for n in onnx.load(path, load_external_data=False).graph.node)


class ProfilingExecutor:
    """An executor whose batches are counted: counters read around run_batch."""

    def __init__(self, inner, profiler: Profiler):
        self.inner, self.profiler = inner, profiler
        self._lock = threading.Lock()
        self._running = 0           # batches in run_batch now
        self._overlaps = 0          # bumped when a batch starts beside another

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def run_batch(self, batch, *args, **kwargs):
        prof = self.profiler
        tid = threading.get_native_id()
        prof.counters.watch(tid)
        threads = prof.pool | {tid}
        with self._lock:
            self._running += 1
            if self._running > 1:
                self._overlaps += 1
            alone, seen = self._running == 1, self._overlaps
        start_ns = time.monotonic_ns()
        before = prof.counters.read(threads) if alone else None
        try:
            out = self.inner.run_batch(batch, *args, **kwargs)
        finally:
            with self._lock:
                self._running -= 1
                alone = alone and self._overlaps == seen      # nothing started beside it meanwhile
        after = prof.counters.read(threads) if alone else None
        prof.record(batch, start_ns, out[3], before, after, [p.inputs for p in batch], tid)
        return out


def derive(before: dict | None, after: dict, level: str = "all") -> dict:
    """The 17 metrics over the window between two doc()s (before None: since the start).
    Values are None where unavailable; `reasons` says why."""
    a = after["levels"].get(level) or _plain_zero()
    b = (before or {}).get("levels", {}).get(level) or _plain_zero()
    d = {k: a.get(k, 0) - b.get(k, 0) for k in ("batches", "rows", "requests", "capacity_rows", "queue_ns",
                                                 "compute_ns", "counted_batches")}
    c = {k: a["counters"].get(k, 0) - b["counters"].get(k, 0) for k in a["counters"]}
    batches = d["counted_batches"]
    out, reasons = {}, {}
    have = set(after["counters"])
    for key, needs in NEEDS.items():
        missing = [n for n in needs if n not in have]
        if missing:
            out[key], reasons[key] = None, "; ".join(f"{n}: {after['unavailable'].get(n, 'not counted')}"
                                                     for n in missing)
        elif not batches:
            out[key], reasons[key] = None, IDLE if not d["batches"] else \
                "every batch in the window ran beside another (shared ONNX Runtime threads: not attributable)"
    per = (lambda n: c.get(n, 0) / batches) if batches else (lambda n: None)
    if "cycles_per_batch" not in out:
        out["cycles_per_batch"] = per("cycles")
    if "instructions_per_batch" not in out:
        out["instructions_per_batch"] = per("instructions")
    if "ipc" not in out:
        out["ipc"] = c["instructions"] / c["cycles"] if c.get("cycles") else None
    if "l1d_hit_rate" not in out:
        out["l1d_hit_rate"] = 1 - c["l1d_load_misses"] / c["l1d_loads"] if c.get("l1d_loads") else None
    if "llc_hit_rate" not in out:
        out["llc_hit_rate"] = 1 - c["cache_misses"] / c["cache_references"] if c.get("cache_references") else None
    for key, counter in (("dtlb_misses_per_batch", "dtlb_load_misses"), ("branch_misses_per_batch", "branch_misses"),
                         ("page_faults_per_batch", "page_faults"), ("context_switches_per_batch", "context_switches")):
        if key not in out:
            out[key] = per(counter)
    if "cpu_ms_per_batch" not in out:
        out["cpu_ms_per_batch"] = per("task_clock_ns") / 1e6
    out["batch_fill_ratio"] = d["rows"] / d["capacity_rows"] if d["capacity_rows"] else None
    out["queue_wait_ms"] = d["queue_ns"] / d["requests"] / 1e6 if d["requests"] else None
    out["compute_us_per_row"] = d["compute_ns"] / d["rows"] / 1e3 if d["rows"] else None
    twin = after["twin"]
    if not twin["samples"]:
        why = twin["last_error"] or "no profiling-twin sample yet"
        for key in ("fused_nodes", "memcpy_ms_per_batch", "memcpy_bytes_per_batch", "kernel_ms_by_op_type"):
            out[key], reasons[key] = None, why
        out["kernel_by_op"] = {}
    else:
        # the twin's figures per sampled row, scaled to the window's mean batch
        mean_rows = d["rows"] / d["batches"] if d["batches"] else twin["rows"] / twin["samples"]
        scale = mean_rows / twin["rows"]
        out["kernel_by_op"] = {op: ns * scale / 1e6 for op, ns in sorted(twin["kernel_ns_by_op"].items())}
        out["kernel_ms_by_op_type"] = sum(out["kernel_by_op"].values())
        out["memcpy_ms_per_batch"] = twin["memcpy_ns"] * scale / 1e6
        out["memcpy_bytes_per_batch"] = twin["memcpy_bytes"] * scale
        out["fused_nodes"] = twin["fusion"]["merged_nodes"]
        out["fusion"] = twin["fusion"]
    out["reasons"] = reasons
    return out


def _plain_zero() -> dict:
    z = _zero_level()
    z["counters"] = {}
    return z
