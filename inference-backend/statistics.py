"""Per-model statistics with Triton's semantics (ModelStatistics RPC, GET /v2/models/NAME/stats).

Triton's terms (grpc_service.proto, docs/protocol/extension_statistics.md), as kept here,
per model version:

- inference_count: inferences performed, a request of N rows counting N;
- execution_count: model runs (batches); inference_count / execution_count is the
  average batch the dynamic batcher formed;
- success: requests answered, and their total time in the server (from the front end
  reading the request to its answer being encoded), count and ns;
- fail: requests refused or failed after the model was found (bad input, full queue,
  timeout, model error), count and time until the refusal;
- queue: time successful requests waited in their priority queue;
- compute_input / compute_infer / compute_output: per successful request, the time its
  batch took to assemble inputs, to run the model, and to hand back and encode its
  outputs (every request of a batch counts its batch's input and infer time, as in
  Triton);
- batch_stats: per batch size executed, the number of runs of that size and their
  compute_input / compute_infer / compute_output durations (compute_output here: the
  answers' encoding, summed over the batch's requests);
- last_inference: milliseconds since the epoch of the last answered request.

Updated under one lock from the compute thread (batches) and the front ends (answers):
a few additions per request.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def doc(self) -> dict:
        return {"count": self.count, "ns": self.ns}


@dataclass
class BatchStats:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    output_ns: int = 0              # its requests' output time; counted per run, as the others


@dataclass
class VersionStats:
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)     # lookup time of requests the response cache answered
    cache_miss: Duration = field(default_factory=Duration)    # lookup + insertion time of those it did not
    batches: dict[int, BatchStats] = field(default_factory=dict)


class ModelStatistics:
    """One served model's statistics, per version."""

    def __init__(self, name: str):
        self.profiler = None        # --enable-profiler: its doc() goes in each entry as `profiler`
        self.name = name
        self._lock = threading.Lock()
        self._versions: dict[str, VersionStats] = {}

    def _v(self, version: str) -> VersionStats:
        v = self._versions.get(version)
        if v is None:
            v = self._versions[version] = VersionStats()
        return v

    def add_version(self, version: str) -> None:
        """A version now served: listed (with zeros) before its first request, as in Triton."""
        with self._lock:
            self._v(version)

    def on_batch(self, version: str, rows: int, assemble_ns: int, compute_ns: int) -> None:
        """A batch ran (the compute thread)."""
        with self._lock:
            v = self._v(version)
            v.execution_count += 1
            b = v.batches.get(rows)
            if b is None:
                b = v.batches[rows] = BatchStats()
            b.compute_input.add(assemble_ns)
            b.compute_infer.add(compute_ns)

    def on_success(self, version: str, rows: int, batch_rows: int, total_ns: int, queue_ns: int,
                   input_ns: int, infer_ns: int, output_ns: int) -> None:
        """A request was answered (the front end, once its answer is encoded)."""
        with self._lock:
            v = self._v(version)
            v.inference_count += rows
            v.last_inference_ms = time.time_ns() // 1_000_000
            v.success.add(total_ns)
            v.queue.add(queue_ns)
            v.compute_input.add(input_ns)
            v.compute_infer.add(infer_ns)
            v.compute_output.add(output_ns)
            b = v.batches.get(batch_rows)
            if b is not None:
                b.output_ns += output_ns

    def on_cache(self, version: str, hit: bool, ns: int) -> None:
        """The response cache answered a request (hit), or looked it up and kept its answer (miss)."""
        with self._lock:
            (self._v(version).cache_hit if hit else self._v(version).cache_miss).add(ns)

    def on_failure(self, version: str, total_ns: int) -> None:
        with self._lock:
            self._v(version).fail.add(total_ns)

    def docs(self, version: str = "") -> list[dict]:
        """Triton's JSON form (the HTTP answer's model_stats entries), versions in order."""
        with self._lock:
            items = sorted(self._versions.items()) if not version else [(version, self._v(version))]
            return [self._doc(ver, v) for ver, v in items]

    def _doc(self, version: str, v: VersionStats) -> dict:
        return {
            "name": self.name, "version": version, "last_inference": v.last_inference_ms,
            "inference_count": v.inference_count, "execution_count": v.execution_count,
            "inference_stats": {
                "success": v.success.doc(), "fail": v.fail.doc(), "queue": v.queue.doc(),
                "compute_input": v.compute_input.doc(), "compute_infer": v.compute_infer.doc(),
                "compute_output": v.compute_output.doc(),
                "cache_hit": v.cache_hit.doc(), "cache_miss": v.cache_miss.doc()},
            "batch_stats": [{"batch_size": size, "compute_input": b.compute_input.doc(),
                             "compute_infer": b.compute_infer.doc(),
                             "compute_output": {"count": b.compute_infer.count, "ns": b.output_ns}}
                            for size, b in sorted(v.batches.items())],
            **({"profiler": self.profiler.doc()} if self.profiler is not None else {}),
        }


def merge_docs(groups: list[list[dict]]) -> list[dict]:
    """The model_stats entries of several worker processes (`--workers`), summed per
    (name, version): each process counts only the requests it answered, and a client
    asks whichever worker the kernel hands its connection to. Counts and durations add,
    batch_stats add per batch size, last_inference is the latest."""
    out: dict[tuple, dict] = {}
    for docs in groups:
        for doc in docs:
            key = (doc["name"], doc["version"])
            if key not in out:
                out[key] = _copy_doc(doc)
                continue
            acc = out[key]
            acc["last_inference"] = max(acc["last_inference"], doc["last_inference"])
            acc["inference_count"] += doc["inference_count"]
            acc["execution_count"] += doc["execution_count"]
            for k, d in doc["inference_stats"].items():
                _add(acc["inference_stats"].setdefault(k, {"count": 0, "ns": 0}), d)
            sizes = {b["batch_size"]: b for b in acc["batch_stats"]}
            for b in doc["batch_stats"]:
                if b["batch_size"] not in sizes:
                    sizes[b["batch_size"]] = _copy_doc(b)
                    continue
                for k in ("compute_input", "compute_infer", "compute_output"):
                    _add(sizes[b["batch_size"]][k], b[k])
            acc["batch_stats"] = [sizes[s] for s in sorted(sizes)]
    return [out[k] for k in out]


def _copy_doc(doc: dict) -> dict:
    return {k: (_copy_doc(v) if isinstance(v, dict) else [_copy_doc(x) for x in v] if isinstance(v, list) else v)
            for k, v in doc.items()}


def _add(acc: dict, d: dict) -> None:
    acc["count"] += d["count"]
    acc["ns"] += d["ns"]
