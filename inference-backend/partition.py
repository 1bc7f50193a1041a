"""One ONNX graph split across devices (`mcpctl serve --partition SPEC`, or the model's
`parameters { key: "partition" }` in config.pbtxt): stages, each an ONNX Runtime session on
its device, pipelined over micro-batches, with the cut moved while serving.

SPEC is `key=value` pairs joined by `;`:
- `cut=T1,T2`: cut after these tensors (explicit), or `stages=N` (default 2): cuts chosen
  from per-node cost (ONNX Runtime's own profiler, one profiled run at load) so the stages'
  costs are even, among the tensors that alone carry everything later nodes need (a
  valid single-tensor cut) and where the EP assignment ORT reports
  (`session.record_ep_graph_assignment_info`) changes, when any does;
- `devices=D1,D2`: each stage's device list (devices.py's names; the same device may
  hold several stages: pipelining on one CPU overlaps stages on its cores); default: the
  --device entries, else cpu for every stage;
- `micro=M`: rows per micro-batch (default 4);
- `dynamic=1`: measure each stage's time; when the slowest takes more than 1.5x the
  fastest over a window of batches, move the cut towards the fast stage (by the cost
  model scaled by the measured times), build the new stage sessions beside the old ones
  and swap them in between batches: a batch runs start to end on the stages it started
  on, so no request fails and none is reordered.

Hand-off: stages pass numpy arrays (one process, shared host memory: no copy between CPU
stages); a GPU stage runs with runtime's I/O binding, so a tensor crosses to the device
once. Results equal the unsplit graph's (the same kernels on the same data; the tests
check max abs diff <= 1e-5 on FP32).
"""
from __future__ import annotations

import json
import logging
import os
import queue
import tempfile
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from mcp26.inference import devices
from mcp26.inference.runtime import OnnxModel, provider_plan

log = logging.getLogger("mcp26.inference")
IMBALANCE = 1.5          # slowest / fastest stage time that moves the cut
WINDOW = 32              # batches measured before a decision
MAX_STAGES = 8


class PartitionError(ValueError):
    pass


@dataclass
class Spec:
    cuts: list[str] = field(default_factory=list)
    stages: int = 2
    devices: list[str] = field(default_factory=list)
    micro: int = 4
    dynamic: bool = False

    @classmethod
    def parse(cls, text: str, default_devices: str = "auto", where: str = "--partition") -> "Spec":
        spec = cls()
        for part in filter(None, (p.strip() for p in text.split(";"))):
            key, sep, value = part.partition("=")
            if not sep:
                raise PartitionError(f"{where} {text!r}: {part!r} is not key=value (cut=, stages=, devices=, micro=, dynamic=)")
            if key == "cut":
                spec.cuts = [t.strip() for t in value.split(",") if t.strip()]
                spec.stages = len(spec.cuts) + 1
            elif key in ("stages", "micro"):
                if not value.isdigit() or not 1 <= int(value) <= (MAX_STAGES if key == "stages" else 4096):
                    raise PartitionError(f"{where}: {key}={value!r}: expected a number"
                                         f"{f' 2..{MAX_STAGES}' if key == 'stages' else ''}")
                setattr(spec, key, int(value))
            elif key == "devices":
                spec.devices = [d.strip() for d in value.split(",")]
            elif key == "dynamic":
                spec.dynamic = value in ("1", "true", "on")
            else:
                raise PartitionError(f"{where}: unknown key {key!r} (cut, stages, devices, micro, dynamic)")
        if spec.stages < 2:
            raise PartitionError(f"{where}: a partition has at least 2 stages")
        if not spec.devices:
            listed = [d for d in default_devices.split(",") if d and d not in devices.LEGACY_KINDS]
            spec.devices = listed if len(listed) == spec.stages else ["cpu"] * spec.stages
        if len(spec.devices) != spec.stages:
            raise PartitionError(f"{where}: {spec.stages} stages but {len(spec.devices)} devices ({','.join(spec.devices)})")
        for d in spec.devices:
            devices.resolve(d, flag=f"{where} devices")
        return spec


# -- the graph ------------------------------------------------------------------------
def _order(graph) -> list:
    return list(graph.node)          # ONNX requires nodes in topological order


def valid_cuts(model: onnx.ModelProto) -> list[str]:
    """Tensors T such that everything after T's producer needs, of what came before, only T
    (and initializers / graph inputs): where a graph can be cut into two with one hand-off."""
    g = model.graph
    nodes = _order(g)
    consts = {i.name for i in g.initializer}
    graph_in = {i.name for i in g.input}
    out = []
    produced_before: set[str] = set()
    for k, n in enumerate(nodes[:-1]):
        produced_before.update(n.output)
        later_need = {t for m in nodes[k + 1:] for t in m.input if t}
        crossing = (later_need & produced_before) - consts - graph_in
        graph_outs_before = {o.name for o in g.output} & produced_before
        if len(crossing) == 1 and not graph_outs_before:
            out.append(next(iter(crossing)))
    seen, uniq = set(), []
    for t in out:
        if t not in seen:
            seen.add(t)
            uniq.append(t)
    return uniq


def split(model: onnx.ModelProto, cuts: list[str]) -> list[onnx.ModelProto]:
    """The stage models, cut after each tensor of `cuts` (in graph order)."""
    g = model.graph
    nodes = _order(g)
    producer = {t: i for i, n in enumerate(nodes) for t in n.output}
    for t in cuts:
        if t not in producer:
            raise PartitionError(f"cut {t!r}: no node of {g.name or 'the graph'} produces it")
    ok = set(valid_cuts(model))
    for t in cuts:
        if t not in ok:
            raise PartitionError(f"cut {t!r}: later nodes need more than it from before it; valid cuts: "
                                 f"{', '.join(valid_cuts(model)[:12])}")
    bounds = sorted(producer[t] for t in cuts)
    if len(set(bounds)) != len(bounds):
        raise PartitionError(f"cuts {cuts}: two cut at the same place")
    ranges, start = [], 0
    for b in bounds:
        ranges.append((start, b + 1))
        start = b + 1
    ranges.append((start, len(nodes)))
    types = {v.name: v for v in list(g.input) + list(g.output) + list(g.value_info)}
    shaped = onnx.shape_inference.infer_shapes(model)
    types.update({v.name: v for v in shaped.graph.value_info})
    inits = {i.name: i for i in g.initializer}
    stages = []
    cut_sorted = [t for _, t in sorted((producer[t], t) for t in cuts)]
    for k, (a, b) in enumerate(ranges):
        part = nodes[a:b]
        used = {t for n in part for t in n.input if t}
        made = {t for n in part for t in n.output}
        ins = [t for t in ([cut_sorted[k - 1]] if k else []) + [i.name for i in g.input] if t in used and t not in made]
        outs = [cut_sorted[k]] if k < len(cut_sorted) else [o.name for o in g.output]
        def vi(name):
            if name in types:
                return types[name]
            raise PartitionError(f"cut {name!r}: ONNX shape inference gives it no type")
        sg = helper.make_graph(part, f"{g.name}_stage{k}", [vi(t) for t in ins], [vi(t) for t in outs],
                               [inits[t] for t in sorted(used & inits.keys())])
        m = helper.make_model(sg, opset_imports=model.opset_import, ir_version=model.ir_version)
        stages.append(m)
    return stages


def node_costs(path: str, feeds: dict, runs: int = 3) -> tuple[dict[str, float], dict[str, str]]:
    """(node name -> microseconds, node name -> EP) from ONNX Runtime's profiler and its
    graph-assignment record, over `runs` runs of `feeds` on the CPU."""
    opts = ort.SessionOptions()
    opts.enable_profiling = True
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL   # keep node names
    opts.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    opts.profile_file_prefix = os.path.join(tempfile.gettempdir(), f"mcp-partition-{os.getpid()}")
    s = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    for _ in range(runs):
        s.run(None, feeds)
    trace = s.end_profiling()
    with open(trace) as fh:
        events = json.load(fh)
    os.unlink(trace)
    costs: dict[str, float] = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            node = e["name"][:-len("_kernel_time")]
            costs[node] = costs.get(node, 0.0) + e["dur"] / runs
    eps = {n.name: sub.ep_name for sub in s.get_provider_graph_assignment_info() for n in sub.get_nodes()}
    return costs, eps


def choose_cuts(model: onnx.ModelProto, costs: dict[str, float], stages: int, weights=None,
                eps: dict[str, str] | None = None) -> list[str]:
    """Cuts that split the per-node cost into `stages` parts in proportion to `weights`
    (relative speeds; even by default); a cut where the EP changes is taken when one lies
    within 10% of the target."""
    nodes = _order(model.graph)
    cum, total = {}, 0.0
    for n in nodes:
        total += costs.get(n.name, 1.0)
        for t in n.output:
            cum[t] = total
    cand = valid_cuts(model)
    if len(cand) < stages - 1:
        raise PartitionError(f"the graph has {len(cand)} single-tensor cut point(s); {stages} stages need {stages - 1}")
    boundary = set()
    if eps:
        for i, n in enumerate(nodes[:-1]):
            if eps.get(n.name) != eps.get(nodes[i + 1].name):
                boundary.update(n.output)
    weights = weights or [1.0] * stages
    share = np.cumsum(weights)[:-1] / sum(weights)
    out = []
    for target in share * total:
        options = [t for t in cand if t not in out and (not out or cum[t] > cum[out[-1]])]
        near = [t for t in options if t in boundary and abs(cum[t] - target) <= 0.1 * total]
        best = min(near or options, key=lambda t: abs(cum[t] - target))
        out.append(best)
    return out


# -- the pipeline -----------------------------------------------------------------------
class Stage:
    """One stage's session on its device; a thread that runs the micro-batches handed to it."""

    def __init__(self, index: int, model: onnx.ModelProto, device: str, threads: int):
        self.index, self.device = index, device
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.log_severity_level = 3
        placement = devices.resolve(device)
        plan = provider_plan(placement.legacy) if placement.legacy else placement.apply(opts)
        self.session = ort.InferenceSession(model.SerializeToString(), opts, providers=plan)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.provider = self.session.get_providers()[0]
        self.where = [d.describe() for d in placement.devices] or [{"device": device, "execution_provider": self.provider}]
        self.busy_s = 0.0
        self.runs = 0
        self.inbox: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name=f"partition-stage-{index}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            item = self.inbox.get()
            if item is None:
                return
            feeds, done = item
            t0 = time.perf_counter()
            try:
                out = self.session.run(self.output_names, {n: feeds[n] for n in self.input_names})
                result = dict(zip(self.output_names, out))
                error = None
            except Exception as e:       # handed to the waiting run, never lost
                result, error = None, e
            self.busy_s += time.perf_counter() - t0
            self.runs += 1
            done(result, error)

    def stop(self) -> None:
        self.inbox.put(None)


class Retired(Exception):
    """The pipeline was swapped out before the run began on it."""


class Pipeline:
    """Stages chained: micro-batch i runs on stage k+1 while i+1 runs on stage k."""

    def __init__(self, stage_models: list, spec_devices: list[str], threads: int, cuts: list[str]):
        self.cuts = cuts
        self.stages = [Stage(i, m, d, threads) for i, (m, d) in enumerate(zip(stage_models, spec_devices))]
        self._active = 0              # runs on these stages now
        self._retired = False         # swapped out: stop once the last run on it ends
        self._lock = threading.Lock()

    def run(self, feeds: dict[str, np.ndarray], micro: int) -> dict[str, np.ndarray]:
        """Raises Retired when swapped out before this run began (run on the new stages)."""
        with self._lock:
            if self._retired:
                raise Retired()
            self._active += 1
        try:
            return self._run(feeds, micro)
        finally:
            with self._lock:
                self._active -= 1
                done = self._retired and self._active == 0
            if done:
                self.stop()

    def retire(self) -> None:
        """Stop the stages once no run is on them (at once if none is)."""
        with self._lock:
            self._retired = True
            idle = self._active == 0
        if idle:
            self.stop()

    def _run(self, feeds: dict[str, np.ndarray], micro: int) -> dict[str, np.ndarray]:
        n = next(iter(feeds.values())).shape[0]
        chunks = [{k: v[i:i + micro] for k, v in feeds.items()} for i in range(0, n, micro)] or [feeds]
        results: list = [None] * len(chunks)
        left = threading.Semaphore(0)
        errors: list = []

        def hand(k: int, i: int, carry: dict):
            def done(out, error):
                if error is not None:
                    errors.append((k, error))
                    left.release()
                    return
                nxt = {**carry, **out}
                if k + 1 < len(self.stages):
                    self.stages[k + 1].inbox.put((nxt, hand(k + 1, i, {n: v for n, v in carry.items()
                                                                           if n not in out})))
                else:
                    results[i] = out
                    left.release()
            return done
        for i, c in enumerate(chunks):
            self.stages[0].inbox.put((c, hand(0, i, c)))
        for _ in chunks:
            left.acquire()
        if errors:
            k, e = errors[0]
            raise RuntimeError(f"partition stage {k} ({self.stages[k].device}): {e}")
        names = list(results[0])
        return {name: np.concatenate([r[name] for r in results]) if len(results) > 1 else results[0][name]
                for name in names}

    def stage_times(self) -> list[float]:
        return [s.busy_s / max(1, s.runs) for s in self.stages]

    def stop(self) -> None:
        for s in self.stages:
            s.stop()


@dataclass
class Swap:
    at: float
    seconds: float          # decision to swapped: split + build + warm the new stages, then the swap
    swap_seconds: float     # the swap alone (between two batches)
    cuts_from: list
    cuts_to: list


class PartitionedModel(OnnxModel):
    """An OnnxModel (specs, checks, metadata of the whole graph) whose runs go through the
    pipeline of its stages."""

    @classmethod
    def load_partitioned(cls, name: str, version: str, path: str, spec: Spec, device: str = "auto",
                         intra_op_threads: int | None = None) -> "PartitionedModel":
        whole = OnnxModel.load(name, version, path, "cpu", intra_op_threads, warmup=False)
        model = cls(**{f: getattr(whole, f) for f in OnnxModel.__dataclass_fields__ if not f.startswith("_")})
        model.spec = spec
        model.graph = onnx.load(path)
        model.swaps = []
        model._lock = threading.Lock()
        model._batches = 0
        model._feeds = model.example_inputs(max(spec.micro, 8))
        threads = max(1, (intra_op_threads or os.cpu_count() or 1) // spec.stages)
        model.stage_threads = threads
        model.costs, model.eps = node_costs(path, model._feeds)
        cuts = spec.cuts or choose_cuts(model.graph, model.costs, spec.stages, eps=model.eps)
        try:
            model.pipeline = Pipeline(split(model.graph, cuts), spec.devices, threads, cuts)
        except PartitionError as e:
            raise PartitionError(f"model file {path}: {e}") from None
        model.provider = model.pipeline.stages[0].provider
        model.requested_device = device
        model.warm_up()
        log.info("model %s partitioned at %s into %d stages on %s", name, cuts, spec.stages, spec.devices)
        return model

    def where(self) -> list[dict]:
        return [{"stage": s.index, "cut_after": (self.pipeline.cuts[s.index] if s.index < len(self.pipeline.cuts)
                                                else None), "where": s.where} for s in self.pipeline.stages]

    def warm_up(self, batches=(1, 8, 32)) -> None:
        t0 = time.perf_counter()
        for b in batches:
            self.run(self.example_inputs(b))
        self.warmup_seconds = time.perf_counter() - t0
        self.batch1_us = float("inf")          # never inline on the event loop: stages run on their threads

    def run(self, feeds, output_names=None):
        while True:
            pipeline = self.pipeline              # the stages this batch runs on, start to end
            try:
                out = pipeline.run(feeds, self.spec.micro)
                break
            except Retired:                       # swapped between the read and the run: the new one
                continue
        if self.spec.dynamic:
            self._batches += 1
            if self._batches % WINDOW == 0:
                self.maybe_move(pipeline)
        names = output_names or list(self.outputs)
        return {n: out[n] for n in names}

    def maybe_move(self, pipeline) -> Swap | None:
        times = pipeline.stage_times()
        if min(times) <= 0 or max(times) / min(times) < IMBALANCE or not self._lock.acquire(blocking=False):
            return None
        try:
            # a stage's speed, as the cost model's estimate of its share over its measured time
            est = self._stage_costs(pipeline.cuts)
            speed = [e / t for e, t in zip(est, times)]
            cuts = choose_cuts(self.graph, self.costs, self.spec.stages, weights=speed)
            if cuts == pipeline.cuts:
                return None
            return self.move_to(cuts)
        finally:
            self._lock.release()

    def _stage_costs(self, cuts: list[str]) -> list[float]:
        out, acc = [], 0.0
        nodes = _order(self.graph.graph)
        bounds = set(cuts)
        for n in nodes:
            acc += self.costs.get(n.name, 1.0)
            if bounds & set(n.output):
                out.append(acc)
                acc = 0.0
        out.append(acc)
        return [max(x, 1e-3) for x in out]

    def move_to(self, cuts: list[str]) -> Swap:
        """New stages for `cuts`, built and warmed beside the running ones, then swapped in
        between batches; the old stages finish the batches they hold, then stop."""
        t0 = time.perf_counter()
        new = Pipeline(split(self.graph, cuts), self.spec.devices, self.stage_threads, cuts)
        new.run(self._feeds, self.spec.micro)            # first runs allocate: not on a request
        t1 = time.perf_counter()
        old, self.pipeline = self.pipeline, new
        t2 = time.perf_counter()
        swap = Swap(time.time(), t2 - t0, t2 - t1, old.cuts, cuts)
        self.swaps.append(swap)
        del self.swaps[:-100]
        old.retire()                                      # batches still on it finish first
        log.info("model %s: cut moved %s -> %s in %.1f ms (swap %.3f ms)", self.name, old.cuts, cuts,
                 swap.seconds * 1e3, swap.swap_seconds * 1e3)
        return swap
