"""Policy plugins without a component: the conversion to and from WIT values, the result checks,
the WASI-NN host over ONNX Runtime, the trap classification and the CLI's JSON input."""
from __future__ import annotations

import math
import struct
from types import SimpleNamespace

import numpy as np
import pytest

from scheduler.decisions import Action, EndpointInfo, FlowSignals, ReplicaSignals, RequestInfo, Signals
from scheduler.plugins import convert, latency_model
from scheduler.plugins.commands import signals_from_json
from scheduler.plugins.inference import OnnxInference
from scheduler.plugins.sandbox import Limits, _classify


def test_signals_become_records_with_kebab_case_fields_and_wit_types():
    s = Signals(now_s=5, replicas=(ReplicaSignals("10.0.0.1:8000", {"standard": 3, "batch": 1}, running=2,
                                                  kv_utilisation=1, memory_fraction=0.95, memory_source="nvml"),),
                flows=(FlowSignals("a->b", rtt_ms=1, payload_bytes=1_500_000),))
    w = convert.signals_to_wit(s)
    assert getattr(w, "now-s") == 5.0 and isinstance(getattr(w, "now-s"), float)
    r = w.replicas[0]
    assert [(getattr(q, "qos-class"), q.depth) for q in getattr(r, "queue-depth")] == [("batch", 1), ("standard", 3)]
    assert isinstance(getattr(r, "kv-utilisation"), float) and getattr(r, "memory-source") == "nvml"
    f = w.flows[0]
    assert (f.flow, getattr(f, "rtt-ms"), getattr(f, "payload-bytes")) == ("a->b", 1.0, 1_500_000)


def test_every_dataclass_field_has_its_wit_field():
    # The records mirror decisions.py one to one: a field added there must be added here and in the WIT.
    import dataclasses
    import pathlib
    wit = (pathlib.Path(convert.__file__).parent / "wit" / "policy.wit").read_text()
    for cls, value in [(ReplicaSignals, convert.replica_to_wit(ReplicaSignals("e"))),
                       (FlowSignals, convert.flow_to_wit(FlowSignals("f"))),
                       (RequestInfo, convert.request_to_wit(RequestInfo())),
                       (EndpointInfo, convert.endpoint_to_wit(EndpointInfo("e")))]:
        names = {f.name.replace("_", "-") for f in dataclasses.fields(cls)}
        assert set(vars(value)) == names
        for name in names:
            assert f"{name}:" in wit, f"{cls.__name__}.{name} missing from policy.wit"
    for f in dataclasses.fields(Action):
        assert f"{f.name.replace('_', '-')}:" in wit


def test_out_of_range_integers_are_clamped_not_raised():
    e = convert.endpoint_to_wit(EndpointInfo("e", queue_depth=-4))
    assert getattr(e, "queue-depth") == 0
    f = convert.flow_to_wit(FlowSignals("f", payload_bytes=1 << 70))
    assert getattr(f, "payload-bytes") == (1 << 64) - 1


def _wit_action(**kw):
    base = {"kind": "remap-class", "subject": "standard", "value": "batch", "weight": 0.0, "hold-s": 60.0,
            "reserved-threads": 0, "reason": "r"}
    return SimpleNamespace(**(base | kw))


def test_actions_come_back_as_dataclasses():
    a = convert.action_from_wit(_wit_action())
    assert a == Action("remap-class", "standard", "batch", 0.0, 60.0, 0, "r")


@pytest.mark.parametrize("bad, message", [
    ({"kind": "reboot"}, "unknown action kind"),
    ({"subject": ""}, "without a subject"),
    ({"weight": math.nan}, "weight is nan"),
    ({"hold-s": math.inf}, "hold-s is inf"),
    ({"weight": -1.0}, "negative"),
])
def test_nonsense_actions_are_refused(bad, message):
    with pytest.raises(convert.BadResult, match=message):
        convert.action_from_wit(_wit_action(**bad))


def test_scores_must_be_one_finite_number_per_endpoint():
    assert convert.scores_from_wit([1.5, -2.0], 2) == [1.5, -2.0]
    with pytest.raises(convert.BadResult, match="1 scores for 2 endpoints"):
        convert.scores_from_wit([1.0], 2)
    with pytest.raises(convert.BadResult, match="nan"):
        convert.scores_from_wit([math.nan], 1)


def _tensor(rows):
    flat = [float(v) for r in rows for v in r]
    return [len(rows), 2], "fp32", struct.pack(f"<{len(flat)}f", *flat)


def test_wasi_nn_host_runs_the_model_as_onnxruntime_does():
    nn = OnnxInference()
    g = nn.load([latency_model.model_bytes()], "onnx", "cpu")
    assert isinstance(g, int)
    assert nn.load([latency_model.model_bytes()], "onnx", "cpu") == g          # same bytes, same graph
    ctx = nn.init_execution_context(g)
    rows = [(0, 0.0), (4, 0.5), (10, 1.0)]
    assert nn.set_input(ctx, 0, *_tensor(rows)) is None
    assert nn.compute(ctx) is None
    out = np.frombuffer(nn.get_output(ctx, 0), dtype="<f4")
    w1, w2 = latency_model.WEIGHTS
    assert out.tolist() == [latency_model.BIAS_MS + w1 * q + w2 * k for q, k in rows]


def test_wasi_nn_host_answers_errors_as_the_wit_enum():
    nn = OnnxInference(max_graphs=1)
    assert nn.load([b"not a model"], "onnx", "cpu") == "invalid-argument"
    assert nn.load([latency_model.model_bytes()], "tensorflow", "cpu") == "invalid-encoding"
    assert nn.load([b"a", b"b"], "onnx", "cpu") == "invalid-argument"
    g = nn.load([latency_model.model_bytes()], "onnx", "cpu")
    ctx = nn.init_execution_context(g)
    assert nn.init_execution_context(999) == "invalid-argument"
    dims, ty, data = _tensor([(1, 0.5)])
    assert nn.set_input(ctx, 0, dims, ty, data[:-1]) == "invalid-argument"       # 7 bytes for 2 f32
    assert nn.set_input(ctx, 0, dims, "ip32", data) == "invalid-argument"        # the model wants f32
    assert nn.set_input(ctx, 1, dims, ty, data) == "invalid-argument"            # one input only
    assert nn.compute(ctx) == "invalid-argument"                                 # no input set
    assert nn.get_output(ctx, 0) == "invalid-argument"                           # nothing computed
    big = OnnxInference(max_model_bytes=10)
    assert big.load([latency_model.model_bytes()], "onnx", "cpu") == "model-too-large"


def test_traps_are_classified_by_their_cause():
    lim = Limits(fuel=1000, deadline_ms=50, memory_bytes=64 << 20)
    fuel = Exception("error while executing at wasm backtrace:\n 0: f\n\nCaused by:\n    wasm trap: all fuel consumed by WebAssembly")
    assert _classify(fuel, lim, None).reason == "fuel"
    epoch = Exception("error while executing\n\nCaused by:\n    wasm trap: interrupt")
    assert _classify(epoch, lim, None).reason == "deadline"
    unreachable = Exception("backtrace\n\nCaused by:\n    wasm trap: wasm `unreachable` instruction executed")
    assert _classify(unreachable, lim, "MemoryError: ").reason == "memory"
    e = _classify(unreachable, lim, "KeyError: 'x'")
    assert (e.reason, e.detail) == ("exception", "KeyError: 'x'")
    e = _classify(unreachable, lim, None)
    assert (e.reason, e.detail) == ("trap", "wasm trap: wasm `unreachable` instruction executed")


def test_engine_key_names_what_changes_compiled_code():
    assert Limits().engine_key() == Limits(fuel=5, deadline_ms=1, memory_bytes=1).engine_key()
    assert Limits(fuel=None).engine_key() != Limits().engine_key()
    assert Limits(deadline_ms=None).engine_key() != Limits().engine_key()


def test_cli_signals_json_uses_the_dataclass_names():
    s = signals_from_json({"now_s": 3, "replicas": [{"endpoint": "e", "memory_fraction": 0.95,
                                                     "queue_depth": {"standard": 2}}],
                           "flows": [{"flow": "a->b", "rtt_ms": 1.0, "payload_bytes": 2}]})
    assert s == Signals(3.0, (ReplicaSignals("e", {"standard": 2}, memory_fraction=0.95),), (FlowSignals("a->b", 1.0, 2),))
    with pytest.raises(TypeError):
        signals_from_json({"replicas": [{"endpoint": "e", "memory": 1}]})
