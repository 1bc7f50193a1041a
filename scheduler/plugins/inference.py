"""The plugins' WASI-NN-shaped `mcp:scheduler/inference` import, implemented with ONNX Runtime.

Graphs and execution contexts are u32 handles, as wasi-nn's WIT (before resources) has them.
Errors are returned as the WIT `error` enum's case names, never raised into the guest: a bad
model or tensor is the plugin's problem to handle, not a trap. Handles live as long as the
plugin instance; limits keep a plugin from hoarding host memory through them.
"""
from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger("mcp26.scheduler.plugins.inference")

# WIT tensor-type -> numpy dtype (little-endian, as wasi-nn's tensor data is laid out).
DTYPES = {"fp16": np.dtype("<f2"), "fp32": np.dtype("<f4"), "up8": np.dtype("u1"), "ip32": np.dtype("<i4")}
# ONNX Runtime's input type names -> the dtype a tensor must arrive in.
ORT_TYPES = {"tensor(float)": DTYPES["fp32"], "tensor(float16)": DTYPES["fp16"],
             "tensor(uint8)": DTYPES["up8"], "tensor(int32)": DTYPES["ip32"]}

MAX_GRAPHS = 8
MAX_CONTEXTS = 64
MAX_MODEL_BYTES = 64 << 20


class OnnxInference:
    """One plugin instance's graphs and execution contexts."""

    def __init__(self, max_graphs: int = MAX_GRAPHS, max_contexts: int = MAX_CONTEXTS,
                 max_model_bytes: int = MAX_MODEL_BYTES):
        self.max_graphs, self.max_contexts, self.max_model_bytes = max_graphs, max_contexts, max_model_bytes
        self._graphs: dict[int, object] = {}            # handle -> onnxruntime.InferenceSession
        self._contexts: dict[int, dict] = {}             # handle -> {"graph", "inputs", "outputs"}
        self._next = 1
        self._by_model: dict[bytes, int] = {}           # sha of the model bytes -> graph (a reload is free)

    def _handle(self) -> int:
        h, self._next = self._next, self._next + 1
        return h

    # load(builder: list<list<u8>>, encoding, target) -> result<graph, error>
    def load(self, builder: list[bytes], encoding: str, target: str):
        if encoding not in ("onnx", "autodetect"):
            return "invalid-encoding"
        if target != "cpu" and target not in ("gpu", "tpu"):
            return "invalid-argument"
        if len(builder) != 1:
            return "invalid-argument"                    # ONNX is one buffer
        model = bytes(builder[0])
        if len(model) > self.max_model_bytes:
            return "model-too-large"
        import hashlib
        key = hashlib.sha256(model).digest()
        if key in self._by_model:
            return self._by_model[key]
        if len(self._graphs) >= self.max_graphs:
            return "busy"
        import onnxruntime as ort
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1                    # the loop's thread; no pool per plugin
        opts.inter_op_num_threads = 1
        try:
            # CPU always: the accelerator serves the model servers, not the policy.
            session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - any ONNX Runtime failure is the plugin's error
            log.warning("plugin model rejected: %s", e)
            return "invalid-argument"
        h = self._handle()
        self._graphs[h] = session
        self._by_model[key] = h
        return h

    # init-execution-context(graph) -> result<graph-execution-context, error>
    def init_execution_context(self, graph: int):
        session = self._graphs.get(graph)
        if session is None:
            return "invalid-argument"
        if len(self._contexts) >= self.max_contexts:
            return "busy"
        h = self._handle()
        self._contexts[h] = {"graph": session, "inputs": {}, "outputs": None}
        return h

    # set-input(ctx, index, tensor) -> result<_, error>
    def set_input(self, ctx: int, index: int, dimensions: list[int], tensor_type: str, data: bytes):
        c = self._contexts.get(ctx)
        if c is None:
            return "invalid-argument"
        inputs = c["graph"].get_inputs()
        if not 0 <= index < len(inputs):
            return "invalid-argument"
        dtype = DTYPES.get(tensor_type)
        if dtype is None or ORT_TYPES.get(inputs[index].type) != dtype:
            return "invalid-argument"
        count = int(np.prod(dimensions)) if dimensions else 1
        if count * dtype.itemsize != len(data):
            return "invalid-argument"
        c["inputs"][inputs[index].name] = np.frombuffer(data, dtype=dtype).reshape(dimensions)
        return None

    # compute(ctx) -> result<_, error>
    def compute(self, ctx: int):
        c = self._contexts.get(ctx)
        if c is None:
            return "invalid-argument"
        session = c["graph"]
        if len(c["inputs"]) != len(session.get_inputs()):
            return "invalid-argument"
        try:
            c["outputs"] = session.run(None, c["inputs"])
        except Exception as e:  # noqa: BLE001
            log.warning("plugin inference failed: %s", e)
            return "runtime-error"
        return None

    # get-output(ctx, index) -> result<list<u8>, error>
    def get_output(self, ctx: int, index: int):
        c = self._contexts.get(ctx)
        if c is None or c["outputs"] is None or not 0 <= index < len(c["outputs"]):
            return "invalid-argument"
        out = np.ascontiguousarray(c["outputs"][index])
        return out.astype(out.dtype.newbyteorder("<"), copy=False).tobytes()
