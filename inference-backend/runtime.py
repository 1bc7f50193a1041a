"""ONNX Runtime sessions for serving: execution-provider choice, threads, warm-up.

`--device` is resolved by devices.py: a device list (`cpu`, `gpu:0`, `npu:0,gpu:1`) or
one of ORT's selection policies goes on the session options as ORT's own devices; with
`auto`, `cuda:N` or `tensorrt:N` providers are tried TensorRT > CUDA > CPU, as far as the installed
onnxruntime offers them (the `gpu` extra brings onnxruntime-gpu/tensorrt);
the one the session actually got is reported in model metadata and logs.

GPU providers (never exercised on the machine this was written on; benchmarks/gpu_check.sh
checks them where a GPU is): TensorRT keeps its built engines on disk
(`trt_engine_cache_path`, under the model cache), so a restart or a replica loads
an engine instead of spending minutes building it; with `cuda_graph=True` the CUDA
provider captures the graph on the first run and replays it (ONNX Runtime's
`enable_cuda_graph`: fixed shapes and bound buffers only, so it is for the GPU
check's fixed-batch runs, not the dynamic batcher); runs on a GPU provider use I/O
binding, with the outputs bound to host memory, so ONNX Runtime copies each
output once, device to its final numpy buffer.

Threads, for a server (not a notebook): each model instance has one compute
thread that runs one batch at a time, so inter-op parallelism is 1 and the
graph runs sequentially (the built-ins are chains; parallel branches would
only fight the request-parsing thread for the same cores). Intra-op threads
default to the cores divided by the replicas sharing them, so N replicas on
one machine do not oversubscribe it. Spinning is off: an idle ORT worker that
spins steals the core the event loop needs to parse the next requests.
"""
from __future__ import annotations

import functools
import logging
import os
import time
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from mcp26.inference import devices, hw_counters, model_format
from mcp26.inference.datatypes import DTYPES, ORT_TYPES, check_input, check_shape, element_count

log = logging.getLogger("mcp26.inference")

PROVIDER_ORDER = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
# Input declarations a model remembers as checked (OnnxModel.raw_plan); past it they are checked each time.
RAW_PLANS = 256
DEVICE_SHORT = {"TensorrtExecutionProvider": "tensorrt", "CUDAExecutionProvider": "cuda", "CPUExecutionProvider": "cpu"}


def trt_cache_dir() -> str:
    root = os.environ.get("MCP_MESH_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "mcp-mesh")
    return os.path.join(root, "trt-engines")


def gpu_provider_options(provider: str, dev_id: int, cuda_graph: bool = False) -> dict:
    if provider == "TensorrtExecutionProvider":
        cache = trt_cache_dir()
        os.makedirs(cache, exist_ok=True)
        return {"device_id": dev_id, "trt_engine_cache_enable": True, "trt_engine_cache_path": cache,
                "trt_timing_cache_enable": True, "trt_timing_cache_path": cache}
    options = {"device_id": dev_id}
    if cuda_graph:
        options["enable_cuda_graph"] = "1"
    return options


def provider_plan(device: str, cuda_graph: bool = False) -> list:
    """Providers to offer ORT for `--device auto|cpu|cuda:N|tensorrt:N`, best first (the
    named-provider forms; device lists and policies are devices.py's)."""
    available = set(ort.get_available_providers())
    kind, _, index = device.partition(":")
    dev_id = int(index) if index else 0
    if kind == "cpu":
        wanted = ["CPUExecutionProvider"]
    elif kind == "cuda":
        wanted = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    elif kind in ("tensorrt", "trt"):
        wanted = list(PROVIDER_ORDER)
    elif kind == "auto":
        wanted = list(PROVIDER_ORDER)
    else:
        raise ValueError(f"--device {device!r}: expected auto, cpu, cuda:N or tensorrt:N")
    plan = []
    for p in wanted:
        if p not in available:
            continue
        if p == "CPUExecutionProvider":
            plan.append(p)
        else:
            plan.append((p, gpu_provider_options(p, dev_id, cuda_graph)))
    if "CPUExecutionProvider" not in [x if isinstance(x, str) else x[0] for x in plan]:
        plan.append("CPUExecutionProvider")
    return plan


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    shape: tuple            # ints, -1 for a variable dimension

    def describe(self) -> dict:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


def _spec(arg) -> TensorSpec:
    dt = ORT_TYPES.get(arg.type)
    if dt is None:
        raise ValueError(f"tensor {arg.name!r} has type {arg.type}, which KServe v2 cannot carry")
    shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or []))
    return TensorSpec(arg.name, dt, shape)


@dataclass
class OnnxModel:
    """One loaded model version: an ORT session and what the protocol reports of it."""
    name: str
    version: str
    path: str
    session: ort.InferenceSession
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    provider: str
    requested_device: str
    load_seconds: float
    warmup_seconds: float
    intra_op_threads: int
    placement: "devices.Placement | None" = None     # the resolved --device
    batch_dim: bool = True          # dim 0 of every input/output is the batch
    batch1_us: float = float("inf")  # median batch-1 run after warm-up (model_server.INLINE_MAX_US)
    extra: dict = field(default_factory=dict)
    _raw_plans: dict = field(default_factory=dict, repr=False)     # raw_plan's, per declaration

    @classmethod
    def load(cls, name: str, version: str, path: str, device: str = "auto",
             intra_op_threads: int | None = None, warmup: bool = True, profile: bool | str = False,
             trusted: frozenset | None = None, mapped: bool = True) -> "OnnxModel":
        """`trusted`: for a .mcp26bin, hash its chunks before loading, but those in these files
        (model_format.file_keys; a hot update passes the running version's, so only the new
        chunks are read); None: no hashing (a start; `mcpctl model inspect --verify` checks).
        `mapped` (a .mcp26bin only): ONNX Runtime uses the weights in place, at the packed
        level, no prepacking (ready in milliseconds); False: the session an ONNX file gets
        (all levels, prepacked weights: slower to make, faster to run; model_server settles
        a mapped model into one in the background)."""
        t0 = time.perf_counter()
        opts = ort.SessionOptions()
        threads = intra_op_threads or max(1, (os.cpu_count() or 1))
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.log_severity_level = 3
        if profile:  # ORT's per-operator chrome trace (profiler.py's twin gives the prefix)
            opts.enable_profiling = True
            opts.profile_file_prefix = profile if isinstance(profile, str) else f"ort_profile_{name}"
        placement = devices.resolve(device)         # DeviceError (a ValueError) names what is here
        plan = provider_plan(placement.legacy) if placement.legacy else placement.apply(opts)
        source, containers = path, []
        if model_format.is_container(path):      # .mcp26bin: ORT maps the chunks in place (model_format)
            container = model_format.open_container(path)
            if trusted is not None:
                problems = model_format.verify(container, trusted)
                if problems:
                    raise model_format.FormatError("; ".join(problems))
            containers = model_format.file_keys(container)
            source, folder = model_format.session_source(container)
            if container.toc["optimization"]["provider"] and device.split(":")[0] not in ("cpu", "auto"):
                raise ValueError(f"model file {path}: packed at optimisation level 'extended' for the CPU "
                                 f"execution provider; --device {device} needs a file packed without --optimize")
            opts.add_session_config_entry("session.model_external_initializers_file_folder_path", folder)
            if mapped:
                opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel,
                                                        model_format.LEVELS[container.level])
                opts.add_session_config_entry("session.disable_prepacking", "1")   # a copy of every GEMM weight
        threads_before = hw_counters.thread_ids()
        try:
            session = ort.InferenceSession(source, sess_options=opts, providers=plan)
        except Exception as e:   # onnxruntime's InvalidProtobuf, InvalidGraph, NoSuchFile ... derive from Exception
            raise ValueError(f"model file {path}: onnxruntime cannot load it: {e}") from None
        provider = session.get_providers()[0]
        # the intra-op pool's threads, started by the session (profiler.py counts them)
        ort_threads = sorted(hw_counters.thread_ids() - threads_before)
        if placement.legacy and device != "auto" and device.split(":")[0] not in ("cpu", DEVICE_SHORT.get(provider)):
            log.warning("--device %s: %s is not available in this onnxruntime (%s); running on %s",
                        device, device.split(":")[0], ", ".join(ort.get_available_providers()), provider)
        try:
            inputs = {a.name: _spec(a) for a in session.get_inputs()}
            outputs = {a.name: _spec(a) for a in session.get_outputs()}
        except ValueError as e:
            raise ValueError(f"model file {path}: {e}") from None
        batch_dim = all(s.shape and s.shape[0] == -1 for s in [*inputs.values(), *outputs.values()])
        model = cls(name=name, version=version, path=path, session=session, inputs=inputs, outputs=outputs,
                    provider=provider, requested_device=device, placement=placement,
                    load_seconds=time.perf_counter() - t0, warmup_seconds=0.0, intra_op_threads=threads,
                    batch_dim=batch_dim, extra={"ort_threads": ort_threads, "container_files": containers,
                                                "mapped": bool(containers) and mapped})
        if warmup:
            try:
                # a mapped .mcp26bin warms batch 1 only (its batch1_us): the full session that
                # replaces it (model_server._maybe_settle) warms every size, off the ready path
                model.warm_up((1,) if model.extra["mapped"] else (1, 8, 32))
            except Exception as e:
                raise ValueError(f"model file {path}: loaded, but its warm-up run on zero inputs "
                                 f"failed: {e}") from None
        log.info("model %s v%s loaded from %s on %s (asked %s; offered %s) in %.3fs, warm-up %.3fs, "
                 "intra-op threads %d", name, version, path, provider, device,
                 [p if isinstance(p, str) else p[0] for p in plan] if plan else placement.describe(), model.load_seconds,
                 model.warmup_seconds, threads)
        return model

    @property
    def device(self) -> str:
        """cpu, cuda, tensorrt, or the type (gpu, npu) of the listed device the session got."""
        if self.provider in DEVICE_SHORT:
            return DEVICE_SHORT[self.provider]
        placed = [d for d in (self.placement.devices if self.placement else ()) if d.ep == self.provider]
        return placed[0].kind if placed else self.provider

    def where(self) -> list[dict]:
        """Where this session runs: the listed devices whose EP the session got, or the
        provider (the named-provider and policy forms)."""
        got = set(self.session.get_providers())
        placed = [d.describe() for d in (self.placement.devices if self.placement else ()) if d.ep in got]
        if not placed and self.placement is not None and self.placement.policy:   # what ORT's policy chose
            placed = [{**d.describe(), "policy": self.requested_device} for d in devices.devices()
                      if d.ep == self.provider][:1]
        return placed or [{"device": self.device, "execution_provider": self.provider,
                           "requested": self.requested_device}]

    def example_inputs(self, batch: int = 1) -> dict[str, np.ndarray]:
        """Zero inputs of a valid shape: variable dims become `batch` at dim 0, 1 elsewhere
        (0 for a KV-cache `past` dimension, so decoders warm up on an empty cache)."""
        out = {}
        for spec in self.inputs.values():
            shape = []
            for i, d in enumerate(spec.shape):
                if d >= 0:
                    shape.append(d)
                elif i == 0:
                    shape.append(batch)
                else:
                    shape.append(0 if spec.name.startswith("past") else 1)
            out[spec.name] = np.zeros(shape, dtype=DTYPES[spec.datatype] if spec.datatype != "BYTES" else object)
        return out

    def warm_up(self, batches=(1, 8, 32)) -> None:
        """Run each batch size once before ready: first runs allocate arenas and
        pick kernels, which must not land on the first real request."""
        t0 = time.perf_counter()
        for b in (batches if self.batch_dim else (1,)):
            self.session.run(None, self.example_inputs(b))
        self.warmup_seconds = time.perf_counter() - t0
        feeds, runs = self.example_inputs(1), []
        for _ in range(7):
            t = time.perf_counter()
            self.session.run(None, feeds)
            runs.append(time.perf_counter() - t)
        self.batch1_us = sorted(runs)[len(runs) // 2] * 1e6

    def run(self, feeds: dict[str, np.ndarray], output_names: list[str] | None = None) -> dict[str, np.ndarray]:
        names = output_names or list(self.outputs)
        if self.provider != "CPUExecutionProvider":
            return self.run_bound(feeds, names)
        values = self._cpu_run(names, feeds, None)
        return dict(zip(names, values))

    @functools.cached_property
    def _cpu_run(self):
        """The session's C++ run: InferenceSession.run's Python checks (input names, OrtValue
        ownership, graph capture) cost a cheap model's request a few us, and every feed here is
        already checked against the model (datatypes.check_input; prepare's required inputs).
        The wrapper's run where this onnxruntime has no `_sess`."""
        inner = getattr(self.session, "_sess", None)
        return inner.run if inner is not None and hasattr(inner, "run") else self.session.run

    def run_bound(self, feeds: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        """A run with I/O binding: inputs copied to the device once, outputs bound to host
        memory, so each comes back in one device-to-host copy into its numpy buffer."""
        binding = self.session.io_binding()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name in names:
            binding.bind_output(name, "cpu")
        self.session.run_with_iobinding(binding)
        return dict(zip(names, (v.numpy() for v in binding.get_outputs())))

    @functools.cached_property        # per request on the REST path; a version's inputs never change
    def input_specs(self) -> dict[str, tuple[str, tuple]]:
        """name -> (datatype, shape): what datatypes.check_input takes (plain, so it pickles
        to the REST body parser process without onnxruntime)."""
        return {n: (s.datatype, s.shape) for n, s in self.inputs.items()}

    def check_input(self, name: str, datatype: str, shape: tuple[int, ...]) -> TensorSpec:
        check_input(self.name, self.input_specs, name, datatype, shape)
        return self.inputs[name]

    def raw_plan(self, name: str, datatype: str, dims) -> tuple[tuple[int, ...], int]:
        """(shape, byte size) of a raw input declared as (name, datatype, dims), checked against
        the model once per declaration seen: requests repeat a handful (a gRPC call decodes each
        of its inputs through here). InvalidArgument as check_shape and check_input raise it."""
        key = (name, datatype, tuple(dims))
        plan = self._raw_plans.get(key)
        if plan is None:
            shape = check_shape(name, key[2])
            self.check_input(name, datatype, shape)
            plan = (shape, element_count(shape) * DTYPES[datatype].itemsize if datatype != "BYTES" else -1)
            if len(self._raw_plans) < RAW_PLANS:
                self._raw_plans[key] = plan
        return plan

    def metadata(self) -> dict:
        return {
            "name": self.name, "versions": [self.version], "platform": "onnxruntime_onnx",
            "inputs": [s.describe() for s in self.inputs.values()],
            "outputs": [s.describe() for s in self.outputs.values()],
        }
