"""Triton's `reshape` (model_config.proto's ModelTensorReshape) as edges of the served graph.

In a config.pbtxt, an input's `dims` are what a client sends and its `reshape { shape }` what
the model takes; an output's `reshape` is what the model makes and its `dims` what a client
gets (with max_batch_size > 0 both leave the batch dimension out). Triton reshapes the
tensors in its backends. Here the ONNX graph gets the reshapes instead, once, at load: each
reshaped input becomes a graph input of the config's dims feeding a Reshape node, each
reshaped output a Reshape node after the model's own. Every path a tensor takes (REST, gRPC,
the batcher, ensembles, metadata, the configuration check) then sees the config's shapes with
no code of its own, and ONNX Runtime's Reshape on a contiguous tensor is a view, not a copy.

The rewritten model is written once into a cache folder, named by the hash of the source
file and the reshapes, and every later load (a twin session, a poll pass) reuses it; the
weights travel inside it, so models over protobuf's 2 GB limit are refused, saying so.
"""
from __future__ import annotations

import hashlib
import math
import os
import tempfile

import numpy as np
import onnx
from onnx import helper, numpy_helper

CACHE = os.path.join(tempfile.gettempdir(), f"mcp26-reshape-{os.getuid()}")
SUFFIX = "__mcp_reshape"
REWRITE = 1          # in the cache key: a change to rewrite() must not reuse files the old one wrote


class ReshapeError(ValueError):
    """A reshape that cannot be applied to the model; `field` is the config field it concerns."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def reshapes(config) -> dict[str, dict[str, tuple[tuple[int, ...], tuple[int, ...]]]]:
    """{"input"|"output": {name: (dims, reshape.shape)}} of a ModelConfig (empty when none)."""
    return {kind: {t.name: (tuple(t.dims), tuple(t.reshape.shape))
                   for t in getattr(config, kind) if t.HasField("reshape")}
            for kind in ("input", "output")}


def check(config) -> None:
    """ReshapeError for a reshape Triton would refuse: a dimension below -1 or 0, more than one
    -1 in a shape a Reshape node is given, element counts that cannot agree."""
    for kind in ("input", "output"):
        for i, t in enumerate(getattr(config, kind)):
            if not t.HasField("reshape"):
                continue
            where = f"{kind}[{i}].reshape.shape"
            shape, dims = list(t.reshape.shape), list(t.dims)
            if any(d < -1 or d == 0 for d in shape):
                raise ReshapeError(where, f"{shape}: each must be positive or -1")
            target = shape if kind == "input" else dims
            if target.count(-1) > 1:
                raise ReshapeError(where if kind == "input" else f"{kind}[{i}].dims",
                                   f"{target}: at most one -1 (a Reshape infers one dimension)")
            if -1 not in shape and -1 not in dims and math.prod(shape) != math.prod(dims):   # exact: no int64 wrap
                raise ReshapeError(where, f"{shape} holds {math.prod(shape)} elements, dims {dims} {math.prod(dims)}")


def _rename_uses(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Every node input named `old` reads `new`, in subgraphs too (If / Loop bodies read outer names)."""
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                _rename_uses(sub, old, new)


def _shape_const(graph: onnx.GraphProto, name: str, shape: tuple[int, ...]) -> None:
    graph.initializer.append(numpy_helper.from_array(np.asarray(shape, dtype=np.int64), name))


def _client_type(value: onnx.ValueInfoProto, dims: tuple[int, ...], batched: bool) -> onnx.ValueInfoProto:
    """`value` with the config's shape: the batch dimension kept as the model has it, -1 symbolic."""
    out = onnx.ValueInfoProto()
    out.CopyFrom(value)
    shape = out.type.tensor_type.shape
    first = shape.dim[0] if batched and len(shape.dim) else None
    del shape.dim[:]
    if first is not None:
        shape.dim.add().CopyFrom(first)
    for i, d in enumerate(dims):
        if d == -1:
            shape.dim.add().dim_param = f"{value.name}_d{i}"
        else:
            shape.dim.add().dim_value = d
    return out


def _model_dims(value: onnx.ValueInfoProto, batched: bool) -> list[int] | None:
    """The model's own shape of a graph input or output past the batch dimension, -1 where
    symbolic; None where the graph does not say."""
    t = value.type.tensor_type
    if not t.HasField("shape"):
        return None
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
    return dims[1:] if batched else dims


def _agrees(model: list[int] | None, shape: tuple[int, ...], where: str, name: str, batched: bool) -> None:
    if model is None:
        return
    if len(model) != len(shape) or any(m != -1 and s != -1 and m != s for m, s in zip(model, shape)):
        raise ReshapeError(where, f"{list(shape)}, but the model's {name!r} is {model}"
                           f"{' past the batch dimension' if batched else ''}")


def rewrite(model: onnx.ModelProto, config) -> onnx.ModelProto:
    """The model with the config's reshapes as Reshape nodes at its inputs and outputs."""
    batched = config.max_batch_size > 0
    graph = model.graph
    todo = reshapes(config)
    initializers = {t.name for t in graph.initializer}
    inputs = {v.name: i for i, v in enumerate(graph.input)}
    for i, t in enumerate(config.input):
        if t.name not in todo["input"]:
            continue
        if t.name not in inputs or t.name in initializers:
            raise ReshapeError(f"input[{i}].name", f"{t.name!r} is not an input of the model")
        dims, shape = todo["input"][t.name]
        _agrees(_model_dims(graph.input[inputs[t.name]], batched), shape, f"input[{i}].reshape.shape", t.name, batched)
        inner = t.name + SUFFIX
        _rename_uses(graph, t.name, inner)
        const = inner + "_shape"
        _shape_const(graph, const, ((0,) if batched else ()) + shape)
        graph.node.insert(0, helper.make_node("Reshape", [t.name, const], [inner], name=inner))
        k = inputs[t.name]
        graph.input[k].CopyFrom(_client_type(graph.input[k], dims, batched))
    outputs = {v.name: i for i, v in enumerate(graph.output)}
    for i, t in enumerate(config.output):
        if t.name not in todo["output"]:
            continue
        if t.name not in outputs:
            raise ReshapeError(f"output[{i}].name", f"{t.name!r} is not an output of the model")
        dims, shape = todo["output"][t.name]
        _agrees(_model_dims(graph.output[outputs[t.name]], batched), shape, f"output[{i}].reshape.shape", t.name,
                batched)
        inner = t.name + SUFFIX
        for node in graph.node:
            for j, name in enumerate(node.output):
                if name == t.name:
                    node.output[j] = inner
        if t.name in inputs or t.name in initializers:
            raise ReshapeError(f"output[{i}].name", f"{t.name!r} is a graph input too; reshape it as an input")
        _rename_uses(graph, t.name, inner)
        const = inner + "_shape"
        _shape_const(graph, const, ((0,) if batched else ()) + dims)
        graph.node.append(helper.make_node("Reshape", [inner, const], [t.name], name=inner))
        k = outputs[t.name]
        graph.output[k].CopyFrom(_client_type(graph.output[k], dims, batched))
    reshaped = {name for kind in todo.values() for name in kind}     # their old types no longer hold
    kept = [v for v in graph.value_info if v.name not in reshaped]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    return model


def served_path(model_path: str, config, cache: str = CACHE) -> str:
    """The file to serve for `model_path` under `config`: itself without reshapes, else the
    rewritten model in `cache` (written once per source file and reshapes)."""
    todo = reshapes(config)
    if not todo["input"] and not todo["output"]:
        return model_path
    st = os.stat(model_path)
    key = hashlib.sha256(repr((REWRITE, os.path.realpath(model_path), st.st_size, st.st_mtime_ns,
                               config.max_batch_size, sorted(todo["input"].items()),
                               sorted(todo["output"].items()))).encode()).hexdigest()[:24]
    out = os.path.join(cache, f"{key}.onnx")
    if os.path.exists(out):
        return out
    try:
        model = onnx.load(model_path)
    except Exception as e:      # onnx's DecodeError, a missing external data file ...
        raise ReshapeError("reshape", f"{model_path}: not an ONNX model onnx can read: {e}") from None
    if model.ByteSize() >= (2 << 30) - (1 << 20):
        raise ReshapeError("reshape", f"{model_path}: over 2 GB with its weights; reshape rewrites the "
                           f"graph with them inside, which protobuf cannot hold")
    model = rewrite(model, config)
    os.makedirs(cache, mode=0o700, exist_ok=True)
    tmp = f"{out}.{os.getpid()}.tmp"
    onnx.save(model, tmp)
    os.replace(tmp, out)       # another process writing the same key writes the same bytes
    return out
