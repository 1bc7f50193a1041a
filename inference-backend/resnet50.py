"""ResNet-50 in torchvision's layout, random weights, built here with onnx.helper.

torchvision's `resnet50` (v1.5: the stride on each bottleneck's 3x3 conv):
conv1 7x7/2 + BatchNorm + Relu + MaxPool 3x3/2, four stages of bottleneck
blocks [3, 4, 6, 3] (1x1, 3x3, 1x1 convs, 64/128/256/512 wide, expansion 4,
a 1x1 projection where shape changes), global average pool, fc 2048 -> 1000.
Initializers are named as torchvision's state dict (`layer3.2.conv2.weight`),
BatchNormalization nodes are kept as an eval-mode export without folding has
them (ONNX Runtime's basic level folds them into the convs). 25.6 M weights,
102 MB; seeded, so every machine builds the same bytes. No download: the
architecture is what matters for load and serving costs, not the trained values.

  python -m mcp26.inference.resnet50 -o DIR     # DIR/resnet50.onnx and DIR/resnet50.mcp26bin
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from mcp26.inference import model_format

STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))    # width, blocks, stride
EXPANSION = 4
CLASSES = 1000
OPSET = 17


class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits = [], []

    def conv(self, name: str, x: str, cin: int, cout: int, k: int, stride: int = 1) -> str:
        w = (self.rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))).astype(np.float32)
        self.inits.append(numpy_helper.from_array(w, f"{name}.weight"))
        self.nodes.append(helper.make_node("Conv", [x, f"{name}.weight"], [f"{name}.out"], kernel_shape=[k, k],
                                           strides=[stride, stride], pads=[k // 2] * 4, name=name))
        return f"{name}.out"

    def bn(self, name: str, x: str, c: int, gamma: float = 1.0) -> str:
        r = self.rng
        params = {"weight": gamma * (1 + 0.1 * r.standard_normal(c)), "bias": 0.05 * r.standard_normal(c),
                  "running_mean": 0.05 * r.standard_normal(c), "running_var": 1 + 0.1 * r.random(c)}
        for key, v in params.items():
            self.inits.append(numpy_helper.from_array(v.astype(np.float32), f"{name}.{key}"))
        self.nodes.append(helper.make_node("BatchNormalization", [x] + [f"{name}.{k}" for k in params],
                                           [f"{name}.out"], epsilon=1e-5, name=name))
        return f"{name}.out"

    def relu(self, x: str) -> str:
        self.nodes.append(helper.make_node("Relu", [x], [x + ".relu"]))
        return x + ".relu"

    def bottleneck(self, name: str, x: str, cin: int, width: int, stride: int) -> str:
        out = width * EXPANSION
        y = self.relu(self.bn(f"{name}.bn1", self.conv(f"{name}.conv1", x, cin, width, 1), width))
        y = self.relu(self.bn(f"{name}.bn2", self.conv(f"{name}.conv2", y, width, width, 3, stride), width))
        # the last BatchNorm of a block starts small, so 16 random blocks keep activations bounded
        y = self.bn(f"{name}.bn3", self.conv(f"{name}.conv3", y, width, out, 1), out, gamma=0.2)
        if stride != 1 or cin != out:
            x = self.bn(f"{name}.downsample.1", self.conv(f"{name}.downsample.0", x, cin, out, 1, stride), out)
        self.nodes.append(helper.make_node("Add", [y, x], [f"{name}.sum"]))
        return self.relu(f"{name}.sum")


def build_resnet50(seed: int = 20260601) -> onnx.ModelProto:
    b = _Builder(seed)
    x = b.relu(b.bn("bn1", b.conv("conv1", "input", 3, 64, 7, 2), 64))
    b.nodes.append(helper.make_node("MaxPool", [x], ["maxpool.out"], kernel_shape=[3, 3], strides=[2, 2],
                                    pads=[1, 1, 1, 1]))
    x, cin = "maxpool.out", 64
    for stage, (width, blocks, stride) in enumerate(STAGES, start=1):
        for i in range(blocks):
            x = b.bottleneck(f"layer{stage}.{i}", x, cin, width, stride if i == 0 else 1)
            cin = width * EXPANSION
    b.nodes += [helper.make_node("GlobalAveragePool", [x], ["avgpool.out"]),
                helper.make_node("Flatten", ["avgpool.out"], ["flatten.out"], axis=1),
                helper.make_node("Gemm", ["flatten.out", "fc.weight", "fc.bias"], ["output"], transB=1)]
    b.inits += [numpy_helper.from_array((b.rng.standard_normal((CLASSES, cin)) / np.sqrt(cin)).astype(np.float32),
                                        "fc.weight"),
                numpy_helper.from_array(np.zeros(CLASSES, np.float32), "fc.bias")]
    graph = helper.make_graph(
        b.nodes, "resnet50",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 224, 224])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", CLASSES])], b.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="mcp-mesh",
                             doc_string="ResNet-50, torchvision layout, random weights")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mcp26.inference.resnet50", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-o", "--output-dir", default=".", help="where resnet50.onnx and resnet50.mcp26bin go")
    args = p.parse_args(argv)
    os.makedirs(args.output_dir, exist_ok=True)
    onnx_path = os.path.join(args.output_dir, "resnet50.onnx")
    onnx.save(build_resnet50(), onnx_path)
    out = os.path.join(args.output_dir, "resnet50.mcp26bin")
    toc = model_format.pack(onnx_path, out)
    print(f"{onnx_path}: {os.path.getsize(onnx_path)} bytes; {out}: {os.path.getsize(out)} bytes, "
          f"{len(toc['chunks'])} chunks, optimisation {toc['optimization']['level']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
