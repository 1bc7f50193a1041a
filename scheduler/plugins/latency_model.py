"""The example plugin's latency predictor: a linear ONNX model of an endpoint's queue depth and
KV-cache utilisation, built with onnx.helper.

    latency_ms = 12 * queue_depth + 80 * kv_utilisation + 20       (input [N, 2] float32 -> [N, 1])

A plugin has no filesystem, so the model travels inside the component:
`python -m scheduler.plugins.latency_model` prints the base64 that
policies/latency_score.py embeds (tests/e2e/test_policy_plugins.py checks the embedded model
computes these weights).
"""
from __future__ import annotations

import base64
import textwrap

WEIGHTS = (12.0, 80.0)          # ms per waiting request, ms at a full KV cache
BIAS_MS = 20.0
INPUT, OUTPUT = "features", "latency_ms"


def model_bytes() -> bytes:
    import onnx
    from onnx import TensorProto, helper

    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 1], list(WEIGHTS))
    b = helper.make_tensor("b", TensorProto.FLOAT, [1], [BIAS_MS])
    graph = helper.make_graph(
        [helper.make_node("MatMul", [INPUT, "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], [OUTPUT])],
        "latency", [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, ["n", 2])],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["n", 1])], initializer=[w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="mcp-mesh")
    model.ir_version = 8                          # readable by any ONNX Runtime >= 1.10
    onnx.checker.check_model(model)
    return model.SerializeToString()


def main() -> None:
    text = base64.b64encode(model_bytes()).decode()
    print("MODEL_ONNX_B64 = (\n" + "\n".join(f'    "{line}"' for line in textwrap.wrap(text, 88)) + "\n)")


if __name__ == "__main__":
    main()
