"""The generation loop of the OpenAI API: prompt ids -> sampled tokens, one batcher step each.

Every step (the prompt's prefill, then one token at a time) is a sequence
request queued in the model's batcher like a Triton sequence step, so the
QoS class's priority level, queue policies and dynamic batching apply to it,
and the KV cache (inference.kv_blocks) supplies its past: a prompt
that starts with cached blocks runs only the rest. Each generation is a
sequence with an id of its own (a tuple, which a client's sequence_id - an
int or a string - can never equal), ended when the generation ends, so its
blocks are released (and stay cached for the next prompt with that prefix).

Sampling: temperature 0 is greedy (argmax of the logits, the model's own
next_token); otherwise softmax(logits / temperature), cut to the nucleus of
`top_p`, drawn with numpy's Generator(PCG64(seed)): the same seed, prompt and
parameters give the same tokens, with or without the cache.
"""
from __future__ import annotations

import asyncio
import itertools
import threading
from dataclasses import dataclass, field

import numpy as np

from mcp26.inference.batch_queue import Pending
from mcp26.inference.tokenizer import BYTE_VOCAB, TextAssembler

_ids = itertools.count(1)
OUTPUTS = ("logits",)


@dataclass
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)


class Sampler:
    def __init__(self, temperature: float, top_p: float, seed: int | None):
        self.temperature, self.top_p = temperature, top_p
        self.rng = np.random.default_rng(seed)

    def __call__(self, logits: np.ndarray) -> int:
        logits = np.asarray(logits, np.float64)[:BYTE_VOCAB]
        if self.temperature <= 0:
            return int(np.argmax(logits))
        z = logits / self.temperature
        p = np.exp(z - z.max())
        p /= p.sum()
        if self.top_p < 1.0:
            order = np.argsort(-p, kind="stable")
            keep = order[:int(np.searchsorted(np.cumsum(p[order]), self.top_p) + 1)]
            q = np.zeros_like(p)
            q[keep] = p[keep]
            p = q / q.sum()
        return int(self.rng.choice(len(p), p=p))


class GenerationLoad:
    """Which generations wait for their first run and which are running, for the
    load report (inference.load_state). Updated from the event loop and
    from the compute thread (a step's on_start), hence the lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.waiting = 0          # admitted, prefill not started
        self.running = 0          # prefill started, not finished
        self.steps_queued = 0     # generation steps (prefill or decode) in the batcher's queue
        self.steps_in_batch = 0   # generation steps started whose result is not yet taken
        self.prompt_tokens = 0
        self.generation_tokens = 0

    def add(self, **deltas: int) -> None:
        with self.lock:
            for k, v in deltas.items():
                setattr(self, k, getattr(self, k) + v)


class Generation:
    """One completion: iterate `stream()` for text deltas; then read finish_reason and the counts."""

    def __init__(self, served, prompt: list[int], sampling: SamplingParams, qos: str | None,
                 priority: int | None, load: GenerationLoad):
        self.served, self.prompt, self.sampling = served, prompt, sampling
        self.qos, self.priority, self.load = qos, priority, load
        self.sid = ("openai", next(_ids))
        self.tokens: list[int] = []
        self.cached_tokens = 0          # prompt tokens taken from the prefix cache
        self.finish_reason: str | None = None
        self.text = ""
        self._started = False           # its prefill began (waiting -> running)
        self._done = False

    async def stream(self):
        sampler = Sampler(self.sampling.temperature, self.sampling.top_p, self.sampling.seed)
        assembler = TextAssembler(self.sampling.stop)
        self.load.add(waiting=1, prompt_tokens=len(self.prompt))
        try:
            ids, first = self.prompt, True
            while True:
                result = await self._step(ids, first)
                if first:
                    self.cached_tokens = int(result.parameters.get("prefix_cached_tokens", 0))
                token = sampler(result.outputs["logits"][0])
                self.tokens.append(token)
                self.load.add(generation_tokens=1)
                delta = assembler.push(token)
                if delta:
                    yield delta
                if assembler.stopped:
                    self.finish_reason = "stop"
                    break
                if len(self.tokens) >= self.sampling.max_tokens:
                    self.finish_reason = "length"
                    break
                ids, first = [token], False
            tail = assembler.flush()
            if tail:
                yield tail
            self.text = assembler.text
        finally:
            with self.load.lock:
                self.load.running -= self._started
                self.load.waiting -= not self._started
                self._done = True
            self.served.kv_cache.end(self.sid)   # a step still running releases at its commit

    async def _step(self, ids: list[int], first: bool):
        state = {"phase": "queued"}
        load = self.load

        def on_start():           # on the compute thread, as the step's batch begins
            with load.lock:
                if state["phase"] != "queued":
                    return        # given up meanwhile
                state["phase"] = "started"
                load.steps_queued -= 1
                load.steps_in_batch += 1
                if first and not self._done:
                    self._started = True
                    load.waiting -= 1
                    load.running += 1

        p = Pending(inputs={"input_ids": np.asarray([ids], np.int64)}, outputs=OUTPUTS, rows=1,
                    key=("sequence", OUTPUTS),
                    context={"sequence_id": self.sid, "start": first, "end": False, "on_start": on_start})
        with load.lock:
            load.steps_queued += 1
        try:
            future = self.served.batcher.submit(p, self.qos, self.priority)
            return await asyncio.wrap_future(future)
        except BaseException:
            if "future" in locals():
                future.cancel()   # the client went away, or the step failed: leave the queue
            raise
        finally:
            with load.lock:       # this step no longer counts as queued or in a batch
                if state["phase"] == "queued":
                    load.steps_queued -= 1
                elif state["phase"] == "started":
                    load.steps_in_batch -= 1
                state["phase"] = "done"
