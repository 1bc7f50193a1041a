"""Build the example model repository (`python -m mcp26.inference.examples.build_repository
[DEST]`): the config.pbtxt files beside this script, and each model's ONNX graph, made here
with onnx.helper and random weights (a fixed seed: the same bytes each time; nothing is
downloaded). The default DEST is a cache ($MCP_MESH_CACHE or ~/.cache/mcp-mesh), rebuilt
when this generator's version changes. Under a second on two cores.

- vision: a ResNet-style network: a 3x3 stem, two basic residual blocks (conv-BN-ReLU-
  conv-BN, identity skip, ReLU), global average pooling, a 64-wide projection;
- audio: two strided 1-D convolutions over a 1600-sample clip, pooled and projected;
- text: a 1000-token embedding table, mean over the 16 tokens, projected;
- fusion: the three 64-wide embeddings concatenated, Gemm-ReLU-Gemm, softmax over 10.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mcp26.inference.builtin_models import cache_dir

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "multimodal")
GENERATOR_VERSION = 1
OPSET = 17
EMBED = 64


class _Graph:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.n = [], [], 0

    def weight(self, *shape, scale: float | None = None) -> str:
        self.n += 1
        name = f"w{self.n}"
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        w = self.rng.standard_normal(shape).astype(np.float32) * (scale or (2.0 / fan_in) ** 0.5)
        self.inits.append(numpy_helper.from_array(w, name))
        return name

    def const(self, array: np.ndarray) -> str:
        self.n += 1
        name = f"c{self.n}"
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def op(self, op: str, inputs: list[str], **attrs) -> str:
        self.n += 1
        out = f"{op.lower()}{self.n}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def conv_bn(self, x: str, cin: int, cout: int, k: int, stride: int = 1, dims: int = 2) -> str:
        kernel = (cout, cin) + (k,) * dims
        y = self.op("Conv", [x, self.weight(*kernel)], pads=[k // 2] * (2 * dims), strides=[stride] * dims)
        ones, zeros = np.ones(cout, np.float32), np.zeros(cout, np.float32)
        scale = self.const(ones + 0.1 * self.rng.standard_normal(cout).astype(np.float32))
        return self.op("BatchNormalization", [y, scale, self.const(zeros), self.const(zeros), self.const(ones)])

    def dense(self, x: str, cin: int, cout: int) -> str:
        return self.op("Gemm", [x, self.weight(cin, cout, scale=cin ** -0.5), self.const(np.zeros(cout, np.float32))])

    def model(self, name: str, inputs, output: str, out_name: str, out_dims: list) -> onnx.ModelProto:
        self.nodes.append(helper.make_node("Identity", [output], [out_name], name="out"))
        g = helper.make_graph(self.nodes, name, inputs,
                              [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, ["batch", *out_dims])],
                              self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="mcp26-examples")
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m


def vision() -> onnx.ModelProto:
    g = _Graph(1)
    x = g.op("Relu", [g.conv_bn("IMAGE", 3, 16, 3)])
    for _ in range(2):                         # basic residual blocks, identity skip
        y = g.op("Relu", [g.conv_bn(x, 16, 16, 3)])
        x = g.op("Relu", [g.op("Add", [g.conv_bn(y, 16, 16, 3), x])])
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])])
    return g.model("vision", [helper.make_tensor_value_info("IMAGE", TensorProto.FLOAT, ["batch", 3, 32, 32])],
                   g.dense(x, 16, EMBED), "EMBEDDING", [EMBED])


def audio() -> onnx.ModelProto:
    g = _Graph(2)
    x = g.op("Relu", [g.conv_bn("AUDIO", 1, 16, 9, stride=4, dims=1)])
    x = g.op("Relu", [g.conv_bn(x, 16, 32, 9, stride=4, dims=1)])
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])])
    return g.model("audio", [helper.make_tensor_value_info("AUDIO", TensorProto.FLOAT, ["batch", 1, 1600])],
                   g.dense(x, 32, EMBED), "EMBEDDING", [EMBED])


def text() -> onnx.ModelProto:
    g = _Graph(3)
    table = g.weight(1000, 32, scale=0.1)
    x = g.op("Gather", [table, "TOKENS"])                     # [batch, 16, 32]
    x = g.op("ReduceMean", [x], axes=[1], keepdims=0)
    return g.model("text", [helper.make_tensor_value_info("TOKENS", TensorProto.INT64, ["batch", 16])],
                   g.op("Tanh", [g.dense(x, 32, EMBED)]), "EMBEDDING", [EMBED])


def fusion() -> onnx.ModelProto:
    g = _Graph(4)
    x = g.op("Concat", ["VISION", "AUDIO", "TEXT"], axis=1)
    x = g.op("Relu", [g.dense(x, 3 * EMBED, 128)])
    x = g.op("Softmax", [g.dense(x, 128, 10)], axis=1)
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", EMBED]) for n in ("VISION", "AUDIO", "TEXT")]
    return g.model("fusion", inputs, x, "PROBS", [10])


BUILDERS = {"vision": vision, "audio": audio, "text": text, "fusion": fusion}


def build(dest: str | None = None) -> str:
    """The example repository at `dest` (default: the cache), built if absent; its path."""
    dest = dest or os.path.join(cache_dir(), f"multimodal-repository-v{GENERATOR_VERSION}")
    if os.path.isfile(os.path.join(dest, ".complete")):
        return dest
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(os.path.abspath(dest)), prefix=".repo-")
    for name in sorted(os.listdir(SOURCE)):
        os.makedirs(os.path.join(tmp, name, "1"))
        shutil.copy(os.path.join(SOURCE, name, "config.pbtxt"), os.path.join(tmp, name, "config.pbtxt"))
        if name in BUILDERS:
            onnx.save(BUILDERS[name](), os.path.join(tmp, name, "1", "model.onnx"))
    open(os.path.join(tmp, ".complete"), "w").close()
    if os.path.isdir(dest):
        shutil.rmtree(dest)
    try:
        os.replace(tmp, dest)          # all or nothing: a server starting beside us never sees half
    except OSError:                    # another builder won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def example_request(batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for the `multimodal` ensemble."""
    rng = np.random.default_rng(seed)
    return {"IMAGE": rng.standard_normal((batch, 3, 32, 32)).astype(np.float32),
            "AUDIO": rng.standard_normal((batch, 1, 1600)).astype(np.float32),
            "TOKENS": rng.integers(0, 1000, (batch, 16)).astype(np.int64)}


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else None))
