"""Built-in models, generated deterministically with onnx.helper and cached.

`builtin:mlp`: a dense MLP, FP32 INPUT0 [-1, 64] -> OUTPUT0 [-1, 16], with
three 3072-wide hidden layers (~19 M weights, 77 MB: more than this machine's
32 MB L3). Batch 1 is a matrix-vector product bound by reading the weights
from memory; a batch of 32 reads them once for 32 rows, so per item it is an
order of magnitude cheaper - the regime where dynamic batching pays, as with
a real model on a GPU.

`builtin:resnet50`: torchvision's ResNet-50 layout with random weights (resnet50.py),
FP32 input [-1, 3, 224, 224] -> output [-1, 1000]; 102 MB.

`builtin:relu`: one Relu node on FP32 [-1, 256]: overhead-bound (ORT runs it in
microseconds), so serving it measures the server, not the model.

`builtin:tiny-decoder`: one causal self-attention block over a byte
vocabulary with a KV cache: input_ids INT64 [B, T], past_key/past_value FP32
[B, 2, P, 32] -> logits FP32 [B, 256] (last position), next_token INT64 [B],
present_key/present_value [B, 2, P+T, 32]. Feeding `present_*` back as
`past_*` continues the sequence; the server keeps those per sequence id.

Weights come from numpy's PCG64 with a fixed seed, so every machine builds
the same bytes; files are cached under $MCP_MESH_CACHE or ~/.cache/mcp-mesh/models.
"""
from __future__ import annotations

import hashlib
import os
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from mcp26.inference import resnet50

OPSET = 17
GENERATOR_VERSION = 1           # bump when a graph below changes; it is part of the cache name

MLP_IN, MLP_OUT, MLP_HIDDEN, MLP_LAYERS = 64, 16, 3072, 3

DEC_VOCAB, DEC_MODEL, DEC_HEADS, DEC_HEAD_DIM = 256, 64, 2, 32


def cache_dir() -> str:
    root = os.environ.get("MCP_MESH_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "mcp-mesh")
    return os.path.join(root, "models")


def _weights(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    return (rng.standard_normal((rows, cols)) / np.sqrt(rows)).astype(np.float32)


def build_mlp(seed: int = 20240601) -> onnx.ModelProto:
    """`seed` other than the default gives another "version" of the same graph (tests, demos)."""
    rng = np.random.default_rng(seed)
    dims = [MLP_IN] + [MLP_HIDDEN] * MLP_LAYERS + [MLP_OUT]
    nodes, inits, x = [], [], "INPUT0"
    for i, (a, b) in enumerate(zip(dims, dims[1:])):
        last = i == len(dims) - 2
        inits += [numpy_helper.from_array(_weights(rng, a, b), f"w{i}"),
                  numpy_helper.from_array((0.01 * rng.standard_normal(b)).astype(np.float32), f"b{i}")]
        y = "OUTPUT0" if last else f"h{i}"
        nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [y if last else f"{y}_linear"]))
        if not last:
            nodes.append(helper.make_node("Relu", [f"{y}_linear"], [y]))
        x = y
    graph = helper.make_graph(
        nodes, "mcp_mlp",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", MLP_IN])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", MLP_OUT])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                             producer_name="mcp-mesh", doc_string="builtin:mlp")


def build_tiny_decoder() -> onnx.ModelProto:
    rng = np.random.default_rng(20240602)
    V, Dm, H, D = DEC_VOCAB, DEC_MODEL, DEC_HEADS, DEC_HEAD_DIM
    c = lambda name, arr: numpy_helper.from_array(np.asarray(arr), name)  # noqa: E731
    inits = [
        c("embed", (0.5 * rng.standard_normal((V, Dm))).astype(np.float32)),
        c("wq", _weights(rng, Dm, H * D)), c("wk", _weights(rng, Dm, H * D)), c("wv", _weights(rng, Dm, H * D)),
        c("wo", _weights(rng, H * D, Dm)), c("wlm", _weights(rng, Dm, V)),
        c("heads_shape", np.array([0, 0, H, D], np.int64)), c("merge_shape", np.array([0, 0, H * D], np.int64)),
        c("scale", np.array(1.0 / np.sqrt(D), np.float32)), c("neg", np.array(-1e9, np.float32)),
        c("last", np.array(-1, np.int64)),
    ]
    n = helper.make_node
    nodes = [
        n("Gather", ["embed", "input_ids"], ["x"]),                          # [B, T, Dm]
    ]
    for proj in ("q", "k", "v"):
        nodes += [n("MatMul", ["x", f"w{proj}"], [f"{proj}_flat"]),
                  n("Reshape", [f"{proj}_flat", "heads_shape"], [f"{proj}_bthd"]),
                  n("Transpose", [f"{proj}_bthd"], [f"{proj}_new"], perm=[0, 2, 1, 3])]   # [B, H, T, D]
    nodes += [
        n("Concat", ["past_key", "k_new"], ["present_key"], axis=2),          # [B, H, P+T, D]
        n("Concat", ["past_value", "v_new"], ["present_value"], axis=2),
        n("Transpose", ["present_key"], ["k_t"], perm=[0, 1, 3, 2]),
        n("MatMul", ["q_new", "k_t"], ["scores_raw"]),                       # [B, H, T, P+T]
        n("Mul", ["scores_raw", "scale"], ["scores"]),
        # Causal mask: query i (at position P+i) sees keys 0..P+i.
        n("Shape", ["past_key"], ["past_len_1"], start=2, end=3),
        n("Squeeze", ["past_len_1"], ["past_len"]),
        n("Shape", ["scores"], ["tq_tk"], start=2, end=4),
        n("ConstantOfShape", ["tq_tk"], ["ones"], value=helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])),
        n("Trilu", ["ones", "past_len"], ["allowed_f"], upper=0),
        n("Cast", ["allowed_f"], ["allowed"], to=TensorProto.BOOL),
        n("Where", ["allowed", "scores", "neg"], ["masked"]),
        n("Softmax", ["masked"], ["attn"], axis=-1),
        n("MatMul", ["attn", "present_value"], ["ctx_bhtd"]),
        n("Transpose", ["ctx_bhtd"], ["ctx_bthd"], perm=[0, 2, 1, 3]),
        n("Reshape", ["ctx_bthd", "merge_shape"], ["ctx"]),
        n("MatMul", ["ctx", "wo"], ["attn_out"]),
        n("Add", ["x", "attn_out"], ["h"]),
        n("Gather", ["h", "last"], ["h_last"], axis=1),                        # [B, Dm]
        n("MatMul", ["h_last", "wlm"], ["logits"]),                            # [B, V]
        n("ArgMax", ["logits"], ["next_token"], axis=-1, keepdims=0),          # [B]
    ]
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    graph = helper.make_graph(
        nodes, "mcp_tiny_decoder",
        [helper.make_tensor_value_info("input_ids", i64, ["batch", "tokens"]),
         helper.make_tensor_value_info("past_key", f, ["batch", H, "past", D]),
         helper.make_tensor_value_info("past_value", f, ["batch", H, "past", D])],
        [helper.make_tensor_value_info("logits", f, ["batch", V]),
         helper.make_tensor_value_info("next_token", i64, ["batch"]),
         helper.make_tensor_value_info("present_key", f, ["batch", H, "total", D]),
         helper.make_tensor_value_info("present_value", f, ["batch", H, "total", D])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                             producer_name="mcp-mesh", doc_string="builtin:tiny-decoder")


RELU_WIDTH = 256


def build_relu() -> onnx.ModelProto:
    """`builtin:resnet50`: torchvision's ResNet-50 layout with random weights (resnet50.py),
FP32 input [-1, 3, 224, 224] -> output [-1, 1000]; 102 MB.

`builtin:relu`: one Relu node, FP32 INPUT0 [-1, 256] -> OUTPUT0 [-1, 256]. ORT runs it in
    microseconds, so serving it measures the server's own per-request overhead."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["INPUT0"], ["OUTPUT0"])], "mcp_relu",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", RELU_WIDTH])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", RELU_WIDTH])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                             producer_name="mcp-mesh", doc_string="builtin:relu")


BUILDERS = {"mlp": build_mlp, "tiny-decoder": build_tiny_decoder, "relu": build_relu,
            "resnet50": resnet50.build_resnet50}          # torchvision's ResNet-50, random weights


def builtin_path(name: str) -> str:
    """The cached file of a built-in model, generating it on first use."""
    if name not in BUILDERS:
        raise ValueError(f"unknown built-in model {name!r}; expected one of {', '.join('builtin:' + b for b in BUILDERS)}")
    path = os.path.join(cache_dir(), f"{name}-v{GENERATOR_VERSION}.onnx")
    if os.path.exists(path):
        return path
    model = BUILDERS[name]()
    onnx.checker.check_model(model)
    data = model.SerializeToString()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # Write-then-rename: replicas starting together never read a half-written file.
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)
    return path


def model_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:12]
