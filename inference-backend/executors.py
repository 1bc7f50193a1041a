"""Running a batch on a model: stack the requests' inputs, run once, split.

Assembly is numpy concatenation along the batch dimension; each request gets
back exactly its own rows (offsets by the running sum of rows), so a batch
can never hand one request another's answer.
"""
from __future__ import annotations

import time

import numpy as np

from mcp26.inference.batch_queue import Pending
from mcp26.inference.runtime import OnnxModel


def stack_inputs(batch: list[Pending]) -> dict[str, np.ndarray]:
    if len(batch) == 1:
        return batch[0].inputs
    return {name: np.concatenate([p.inputs[name] for p in batch], axis=0) for name in batch[0].inputs}


def wanted_outputs(model: OnnxModel, p: Pending) -> list[str]:
    return list(p.outputs) if p.outputs else list(model.outputs)


def split_rows(values: dict[str, np.ndarray], batch: list[Pending], model: OnnxModel) -> list[dict]:
    out, offset = [], 0
    for p in batch:
        end = offset + p.rows
        out.append({n: values[n][offset:end] for n in wanted_outputs(model, p)})
        offset = end
    return out


class BatchExecutor:
    """The executor for any model whose every input and output is batched on dim 0."""

    # ORT's InferenceSession.run is thread-safe: the batcher's reserved lane may run
    # a batch on the same session while the main instance computes another.
    concurrent_runs = True

    def __init__(self, model: OnnxModel, inline_ok: bool = False, narrow: OnnxModel | None = None):
        self.model = model
        self.inline_ok = inline_ok      # cheap enough to run on the event loop (batcher.py: inline runs)
        self.narrow = narrow            # the same file on one intra-op thread (batch_formation.py: split under load)
        # A one-thread CPU session computes at SCHED_IDLE, as a narrow instance does (batcher):
        # the front end then always has its core first, and the batch takes what is left.
        self.yields_cpu = model.intra_op_threads == 1 and model.device == "cpu"

    def run_batch(self, batch: list[Pending], narrow: bool = False):
        t0 = time.perf_counter()
        feeds = stack_inputs(batch)
        names = wanted_outputs(self.model, batch[0])   # equal within a batch (part of the key)
        t1 = time.perf_counter()
        values = (self.narrow if narrow and self.narrow is not None else self.model).run(feeds, names)
        t2 = time.perf_counter()
        if len(batch) == 1:
            outputs = [values]
        else:
            outputs = split_rows(values, batch, self.model)
        return outputs, [{} for _ in batch], t1 - t0, t2 - t1
