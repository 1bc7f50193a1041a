"""Example policy plugin: endpoints scored by their predicted latency, from a small ONNX model run
through the host's WASI-NN-shaped inference import (ONNX Runtime on the host).

score():  one row [queue_depth, kv_utilisation] per endpoint -> predicted latency (ms);
          the score is its negation (lower latency scores higher).
decide(): an endpoint-weight per replica, inversely proportional to its predicted latency.

The model is embedded (a plugin has no filesystem); regenerate it with
`python -m scheduler.plugins.latency_model` (the linear model it documents).
"""
import base64
import struct

import wit_world
from wit_world.imports import host, inference
from wit_world.imports.inference import ExecutionTarget, GraphEncoding, Tensor, TensorType
from wit_world.imports.types import Action

MODEL_ONNX_B64 = (
    "CAgSCG1jcC1tZXNoOp4BChkKCGZlYXR1cmVzCgF3EgJ4dyIGTWF0TXVsChgKAnh3CgFiEgpsYXRlbmN5X21zIgNB"
    "ZGQSB2xhdGVuY3kqEwgCCAEQASIIAABAQQAAoEJCAXcqDQgBEAEiBAAAoEFCAWJaGwoIZmVhdHVyZXMSDwoNCAES"
    "CQoDEgFuCgIIAmIdCgpsYXRlbmN5X21zEg8KDQgBEgkKAxIBbgoCCAFCBAoAEA0="
)
MODEL = base64.b64decode(MODEL_ONNX_B64)

_context = None          # one execution context per instance, made on first use


def _ctx():
    global _context
    if _context is None:
        graph = inference.load([MODEL], GraphEncoding.ONNX, ExecutionTarget.CPU)
        _context = inference.init_execution_context(graph)
        host.log(host.Level.INFO, f"latency model loaded ({len(MODEL)} bytes)")
    return _context


def predict_ms(rows):
    """rows: [(queue_depth, kv_utilisation)] -> predicted latency per row, in ms."""
    if not rows:
        return []
    ctx = _ctx()
    flat = [float(v) for row in rows for v in row]
    data = struct.pack(f"<{len(flat)}f", *flat)
    inference.set_input(ctx, 0, Tensor([len(rows), 2], TensorType.FP32, data))
    inference.compute(ctx)
    out = inference.get_output(ctx, 0)
    return list(struct.unpack(f"<{len(rows)}f", out))


class WitWorld(wit_world.WitWorld):
    def decide(self, signals):
        replicas = list(signals.replicas)
        latency = predict_ms([(sum(q.depth for q in r.queue_depth) + r.running, r.kv_utilisation)
                              for r in replicas])
        return [Action("endpoint-weight", r.endpoint, "", round(1000.0 / max(ms, 1.0), 3), 0.0, 0,
                       f"predicted latency {ms:.1f} ms")
                for r, ms in zip(replicas, latency)]

    def score(self, request, endpoints):
        return [-ms for ms in predict_ms([(e.queue_depth, e.kv_utilisation) for e in endpoints])]
