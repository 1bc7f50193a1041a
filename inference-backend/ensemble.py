"""Triton ensembles (`platform: "ensemble"`): a DAG of the repository's models run server-side.

A request's tensors flow through `ensemble_scheduling.step`s as Triton's do: a step
starts as soon as every ensemble tensor its `input_map` reads is ready, so independent
steps run at the same time (each an asyncio task awaiting its own model); each step is
submitted to its model's own batcher (so concurrent ensemble requests batch per step,
with the step model's config: batch sizes, queue delay, device) with the request's QoS
class and priority; tensors pass between steps as the numpy arrays the step produced (no
serialisation; on a GPU step runtime's I/O binding does the one device copy). A failing
step fails the request with the step's index and model named; its siblings' results are
dropped.

`EnsembleModel` answers what the front ends ask of a served model (ServedModel's
prepare / infer / submit / arrival, `model` with the tensor specs, `stats`), so REST,
gRPC and the repository index serve it like any other.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import time
from dataclasses import dataclass

import numpy as np

from mcp26.inference.batch_queue import Pending
from mcp26.inference.batcher import Result
from mcp26.inference.errors import InferenceError, InvalidArgument, NotFound
from mcp26.inference.runtime import OnnxModel, TensorSpec
from mcp26.inference.statistics import ModelStatistics
from mcp26.inference.model_repository import DATA_TYPES

MAX_STEPS = 64


@dataclass(frozen=True)
class Step:
    index: int
    model: str
    version: str               # "" : the served one (-1 in config.pbtxt)
    inputs: dict               # step model's input name -> ensemble tensor
    outputs: dict              # step model's output name -> ensemble tensor

    @property
    def label(self) -> str:
        return f"step {self.index} ({self.model})"


class EnsembleSpecs:
    """What the front ends read of a model (OnnxModel's names), for an ensemble."""
    platform = "ensemble"
    provider = "ensemble"
    device = "ensemble"
    batch_dim = True
    load_seconds = 0.0
    warmup_seconds = 0.0
    placement = None
    raw_plan = OnnxModel.raw_plan
    check_input = OnnxModel.check_input
    input_specs = OnnxModel.input_specs

    def __init__(self, name: str, version: str, inputs: dict, outputs: dict, batch_dim: bool, steps):
        self.name, self.version, self.inputs, self.outputs = name, version, inputs, outputs
        self.batch_dim = batch_dim
        self.extra = {}
        self._raw_plans = {}
        self._steps = steps

    def metadata(self) -> dict:
        return {"name": self.name, "versions": [self.version], "platform": "ensemble",
                "inputs": [s.describe() for s in self.inputs.values()],
                "outputs": [s.describe() for s in self.outputs.values()]}

    def where(self) -> list[dict]:
        return [{"step": s.index, "model": s.model, "where": served.model.where()} for s, served in self._steps()]


class _NoQueue:
    """The batcher fields the front ends and load reports read; an ensemble queues in its steps."""

    def __init__(self, settings):
        self.settings = settings
        self.instances = 1
        self.in_flight = 0
        self.idle_dispatch = False
        self.policy_changes = ()      # /admin/status: an ensemble's steps carry the policies
        self.policy_generation = 0

    def total_queued(self) -> int:
        return 0

    def queue_depth(self) -> dict:
        return {}

    def stop(self, timeout: float = 10.0) -> None:
        pass


class EnsembleModel:
    decoder = False
    kv_cache = None
    tokens = None
    split_width = 0

    def __init__(self, entry, server, settings):
        """`entry`: model_repository.ModelEntry; `server`: the ModelServer holding the step models."""
        self.name = entry.name
        self.entry = entry
        self.server = server
        self.loaded = True
        c = entry.config
        if len(c.ensemble_scheduling.step) > MAX_STEPS:
            raise entry.fail("ensemble_scheduling.step", f"{len(c.ensemble_scheduling.step)} steps; at most {MAX_STEPS}")
        self.steps = [Step(i, s.model_name, "" if s.model_version < 0 else str(s.model_version),
                           dict(s.input_map), dict(s.output_map)) for i, s in enumerate(c.ensemble_scheduling.step)]
        batched = c.max_batch_size > 0
        self.model = EnsembleSpecs(self.name, entry.version, self._specs(c.input, batched),
                                   self._specs(c.output, batched), batched, self._step_models)
        self.batcher = _NoQueue(settings)
        self.stats = ModelStatistics(self.name)
        self.stats.add_version(entry.version)
        self.load = self
        self.in_flight = 0
        self.completed = 0
        self._check()

    @staticmethod
    def _specs(tensors, batched: bool) -> dict:
        from tritonclient.grpc import model_config_pb2 as mc
        return {t.name: TensorSpec(t.name, DATA_TYPES[mc.DataType.Name(t.data_type)],
                                   ((-1,) if batched else ()) + tuple(int(d) for d in t.dims)) for t in tensors}

    def _step_models(self):
        return [(s, self.server.models[s.model].at(s.version)) for s in self.steps]

    def _check(self) -> None:
        """The DAG is whole: each step's model is served and every input mapped; every tensor
        read is an ensemble input or one step's output; the outputs are produced; no cycle."""
        e = self.entry
        produced = {name: "ensemble input" for name in self.model.inputs}
        for s in self.steps:
            where = f"ensemble_scheduling.step[{s.index}]"
            served = self.server.models.get(s.model)
            if served is None:
                raise e.fail(f"{where}.model_name", f"{s.model!r} is not in the repository")
            if s.model == self.name:
                raise e.fail(f"{where}.model_name", "an ensemble cannot run itself")
            try:
                served = served.at(s.version)
            except NotFound:
                raise e.fail(f"{where}.model_version", f"{s.version}, but {s.model!r} serves version(s) "
                             f"{', '.join(served.versions())}") from None
            for name in s.inputs:
                if name not in served.model.inputs:
                    raise e.fail(f"{where}.input_map", f"{name!r} is not an input of {s.model!r} "
                                 f"({', '.join(served.model.inputs)})")
            missing = [n for n in served.model.inputs if n not in s.inputs]
            if missing:
                raise e.fail(f"{where}.input_map", f"{s.model!r} input(s) {', '.join(missing)} not mapped")
            for name, tensor in s.outputs.items():
                if name not in served.model.outputs:
                    raise e.fail(f"{where}.output_map", f"{name!r} is not an output of {s.model!r} "
                                 f"({', '.join(served.model.outputs)})")
                if tensor in produced:
                    raise e.fail(f"{where}.output_map", f"tensor {tensor!r} is already produced by "
                                 f"{produced[tensor]}")
                produced[tensor] = f"step {s.index}"
        for s in self.steps:
            for name, tensor in s.inputs.items():
                if tensor not in produced:
                    raise e.fail(f"ensemble_scheduling.step[{s.index}].input_map",
                                 f"tensor {tensor!r} is neither an ensemble input nor a step's output")
        # a cycle: a step whose inputs can never all be ready
        ready, left = set(self.model.inputs), list(self.steps)
        while left:
            runnable = [s for s in left if set(s.inputs.values()) <= ready]
            if not runnable:
                raise e.fail("ensemble_scheduling.step", "the steps form a cycle: "
                             + ", ".join(s.label for s in left) + " wait on each other")
            for s in runnable:
                ready.update(s.outputs.values())
                left.remove(s)
        for name in self.model.outputs:
            if name not in produced:
                raise e.fail("output", f"{name!r} is produced by no step")

    # -- what the front ends call ------------------------------------------------------
    def versions(self) -> list[str]:
        return [self.model.version]

    def at(self, version: str) -> "EnsembleModel":
        if version and version != self.model.version:
            raise NotFound(f"model {self.name!r} has no version {version!r}; serving version {self.model.version}")
        return self

    def arrival(self):
        return contextlib.nullcontext()

    def header_value(self) -> str:       # served.load.header_value(): the first step's ORCA report
        return self.server.models[self.steps[0].model].load.header_value()

    def prepare(self, inputs: dict, outputs: list, params: dict) -> Pending:
        for o in outputs:
            if o not in self.model.outputs:
                raise InvalidArgument(f"model {self.name!r} has no output {o!r}; outputs are "
                                      f"{', '.join(self.model.outputs)}")
        missing = [n for n in self.model.inputs if n not in inputs]
        if missing:
            raise InvalidArgument(f"model {self.name!r} needs input(s) {', '.join(missing)}")
        rows = 1
        if self.model.batch_dim:
            sizes = {a.shape[0] for a in inputs.values()}
            if len(sizes) > 1:
                raise InvalidArgument(f"inputs disagree on the batch dimension: {sorted(sizes)}")
            rows = sizes.pop()
            if rows < 1:
                raise InvalidArgument("batch dimension is 0: nothing to infer")
        p = Pending(inputs=inputs, outputs=tuple(outputs), rows=rows, key=("ensemble",),
                    context={"params": {k: v for k, v in params.items() if k in ("timeout", "priority")}})
        p.arrival_ns = time.monotonic_ns()
        return p

    def submit(self, pending: Pending, qos_class, priority, run_now: bool = False):
        """The DAG as a task on this loop; its result as a concurrent future (what the REST
        fast lane waits on with model_server.when_done)."""
        future = concurrent.futures.Future()
        task = asyncio.get_running_loop().create_task(self.infer(pending, qos_class, priority))
        task.add_done_callback(functools.partial(_settle, future))
        future.add_done_callback(lambda f: task.cancel() if f.cancelled() else None)
        return future

    async def infer(self, pending: Pending, qos_class, priority, run_now: bool = False) -> Result:
        self.in_flight += 1
        self.batcher.in_flight = self.in_flight
        try:
            return await self._run(pending, qos_class, priority)
        finally:
            self.in_flight -= 1
            self.batcher.in_flight = self.in_flight
            self.completed += 1

    async def _run(self, pending: Pending, qos_class, priority) -> Result:
        tensors: dict[str, np.ndarray] = dict(pending.inputs)
        events = {name: asyncio.Event() for s in self.steps for name in s.outputs.values()}
        totals = {"queue": 0, "compute": 0, "assemble": 0, "level": 0, "batch": 0}
        params = pending.context.get("params", {})

        async def run_step(s: Step) -> None:
            for tensor in s.inputs.values():
                if tensor in events:
                    await events[tensor].wait()
            newest = self.server.models[s.model]
            feeds = {name: tensors[tensor] for name, tensor in s.inputs.items()}
            try:
                if not newest.loaded:
                    raise InvalidArgument(f"model {s.model!r} is unloaded")
                served = newest.at(s.version)
                step_pending = served.prepare(feeds, list(s.outputs), params)
                result = await served.infer(step_pending, qos_class, priority)
            except InferenceError as e:
                raise type(e)(f"ensemble {self.name!r} {s.label}: {e.message}") from None
            except asyncio.CancelledError:
                raise
            except Exception as e:
                raise InvalidArgument(f"ensemble {self.name!r} {s.label}: {type(e).__name__}: {e}") from None
            for name, tensor in s.outputs.items():
                tensors[tensor] = result.outputs[name]
                events[tensor].set()
            totals["queue"] += result.queue_us
            totals["compute"] += result.compute_us
            totals["assemble"] += result.assemble_us
            totals["level"] = result.level
            totals["batch"] = max(totals["batch"], result.batch_size)

        tasks = [asyncio.ensure_future(run_step(s)) for s in self.steps]
        try:
            # the first failure fails the request (gather would wait for the siblings)
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in done:
                if t.exception() is not None:
                    raise t.exception()
        finally:
            for t in tasks:
                t.cancel()
        wanted = pending.outputs or tuple(self.model.outputs)
        return Result(outputs={n: tensors[n] for n in wanted}, queue_us=totals["queue"],
                      compute_us=totals["compute"], assemble_us=totals["assemble"],
                      batch_size=totals["batch"] or pending.rows, batch_requests=1, level=totals["level"],
                      version=self.model.version)

    # -- what the server's admin path calls (a policy change leaves repository models alone) --
    def status(self) -> dict:
        return {"name": self.name, "version": self.model.version, "platform": "ensemble",
                "steps": self.model.where(), "in_flight": self.in_flight, "completed": self.completed}


def _settle(future: concurrent.futures.Future, task: asyncio.Task) -> None:
    if future.done():
        return
    if task.cancelled():
        future.cancel()
    elif task.exception() is not None:
        future.set_exception(task.exception())
    else:
        future.set_result(task.result())
