"""Policy plugins without a component: the conversion to and from WIT values, the result checks,
the WASI-NN host over ONNX Runtime, the trap classification and the CLI's JSON input."""
from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import re
import struct

import numpy as np
import pytest

from mcp26.scheduler.decisions import (Action, EndpointInfo, EngineSignals, FlowSignals, LinkSignals, ReplicaSignals,
                                       RequestInfo, ResourceSignals, Signals, WriteBurstSignals)
from mcp26.scheduler.plugins import convert, latency_model
from mcp26.scheduler.plugins.commands import signals_from_json
from mcp26.scheduler.plugins.inference import OnnxInference
from mcp26.scheduler.plugins.sandbox import Limits, _classify


def test_signals_are_encoded_as_wit_ordered_rows_with_wit_types():
    s = Signals(now_s=5, replicas=(ReplicaSignals("10.0.0.1:8000", {"standard": 3, "batch": 1}, running=2,
                                                  kv_utilisation=1, memory_fraction=0.95, memory_source="nvml"),),
                flows=(FlowSignals("a->b", rtt_ms=1, payload_bytes=1_500_000),))
    now_s, replicas, flows, bursts, resources, trigger = json.loads(convert.encode_signals(s))
    assert bursts == [] and trigger == "period"
    assert dict(zip(convert.FIELDS["resource-signals"], resources))["numa-source"] == "absent here"
    assert now_s == 5.0 and isinstance(now_s, float)
    r = dict(zip(convert.FIELDS["replica-signals"], replicas[0]))
    assert r["queue-depth"] == [["batch", 1], ["standard", 3]]
    assert isinstance(r["kv-utilisation"], float) and r["memory-source"] == "nvml" and r["running"] == 2
    f = dict(zip(convert.FIELDS["flow-signals"], flows[0]))
    assert (f["flow"], f["rtt-ms"], f["payload-bytes"]) == ("a->b", 1.0, 1_500_000)
    assert json.loads(convert.encode_request(RequestInfo("standard", 7, "s"))) == ["standard", 7, "s"]
    assert json.loads(convert.encode_endpoints([EndpointInfo("e", 2, 0.5, 9)])) == [["e", 2, 0.5, 9.0]]


def _wit_records() -> dict[str, tuple[str, ...]]:
    """policy.wit's records in the `types` interface: name -> its fields in declared order."""
    wit = (pathlib.Path(convert.__file__).parent / "wit" / "policy.wit").read_text()
    body = wit[wit.index("interface types"):wit.index("interface inference")]
    return {name: tuple(re.findall(r"%?([a-z0-9-]+):", fields))
            for name, fields in re.findall(r"record ([a-z0-9-]+) \{([^}]*)\}", body)}


def test_the_encodings_columns_are_the_wit_records_fields_in_order():
    # The guest builds the bindings' records positionally from these rows: the order is the contract.
    assert convert.FIELDS == _wit_records()


@pytest.mark.parametrize("cls, row, record", [
    (ReplicaSignals, convert.replica_row, "replica-signals"),
    (FlowSignals, convert.flow_row, "flow-signals"),
    (WriteBurstSignals, convert.burst_row, "write-burst-signals"),
    (LinkSignals, convert.link_row, "link-signals"),
    (EngineSignals, convert.engine_row, "engine-signals"),
    (RequestInfo, convert.request_row, "request-info"),
    (EndpointInfo, convert.endpoint_row, "endpoint-info"),
])
def test_every_dataclass_field_lands_in_its_wit_column(cls, row, record):
    # Each field gets a distinct value; the row must carry it in the column its WIT field names.
    values = {}
    for i, f in enumerate(dataclasses.fields(cls)):
        if f.name == "queue_depth" and cls is ReplicaSignals:
            values[f.name] = {f"class{i}": i}
        elif f.type in ("str",):
            values[f.name] = f"v{i}"
        elif f.type in ("int",):
            values[f.name] = i
        else:
            values[f.name] = i + 0.5
    encoded = row(cls(**values))
    assert len(encoded) == len(dataclasses.fields(cls)) == len(convert.FIELDS[record])
    for column, wit_name in zip(encoded, convert.FIELDS[record]):
        expected = values[wit_name.replace("-", "_")]
        if isinstance(expected, dict):                           # a dict is a list of entries
            expected = [[k, v] for k, v in expected.items()]
        assert column == expected, wit_name
    assert {f.name.replace("_", "-") for f in dataclasses.fields(Action)} == set(convert.FIELDS["action"])


def test_out_of_range_integers_are_clamped_not_raised():
    assert convert.endpoint_row(EndpointInfo("e", queue_depth=-4))[1] == 0
    assert convert.flow_row(FlowSignals("f", payload_bytes=1 << 70))[2] == (1 << 64) - 1


def _answer(**kw) -> str:
    base = {"kind": "remap-class", "subject": "standard", "value": "batch", "weight": 0.0, "hold-s": 60.0,
            "reserved-threads": 0, "reason": "r"}
    row = base | kw
    return json.dumps([[row[name] for name in convert.FIELDS["action"]]])


def test_actions_come_back_as_dataclasses():
    assert convert.actions_from_answer(_answer()) == [Action("remap-class", "standard", "batch", 0.0, 60.0, 0, "r")]
    assert convert.actions_from_answer("[]") == []


@pytest.mark.parametrize("bad, message", [
    ({"kind": "reboot"}, "unknown action kind"),
    ({"subject": ""}, "without a subject"),
    ({"weight": math.nan}, "weight is nan"),
    ({"hold-s": math.inf}, "hold-s is inf"),
    ({"weight": -1.0}, "negative"),
    ({"weight": "3"}, "weight is not a number"),
    ({"reserved-threads": -1}, "is not a u32"),
    ({"reserved-threads": 1.5}, "is not a u32"),
    ({"reason": 7}, "reason is not a string"),
])
def test_nonsense_actions_are_refused(bad, message):
    with pytest.raises(convert.BadResult, match=message):
        convert.actions_from_answer(_answer(**bad))


@pytest.mark.parametrize("text, message", [
    ("not json", "not mcp-policy-json/2"),
    ('{"kind": "remap-class"}', "not a list of actions"),
    ('[["remap-class", "standard"]]', "a list of 7 fields"),
    ("[" * 10 + "]" * 10 + " " * convert.MAX_ANSWER_CHARS, "at most"),
])
def test_an_answer_that_is_not_the_encoding_is_refused(text, message):
    with pytest.raises(convert.BadResult, match=message):
        convert.actions_from_answer(text)


def test_scores_must_be_one_finite_number_per_endpoint():
    assert convert.scores_from_answer("[1.5, -2]", 2) == [1.5, -2.0]
    with pytest.raises(convert.BadResult, match="1 scores for 2 endpoints"):
        convert.scores_from_answer("[1.0]", 2)
    with pytest.raises(convert.BadResult, match="nan"):
        convert.scores_from_answer("[NaN]", 1)
    with pytest.raises(convert.BadResult, match="not a number"):
        convert.scores_from_answer('["1"]', 1)


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


def test_the_resource_view_is_encoded_in_wit_order():
    res = ResourceSignals(numa_nodes=(0, 1), numa_cpus=((0, 1), (2, 3)), numa_distance=((10.0, 21.0), (21.0, 10.0)),
                          numa_source="sysfs", pcie_links=(LinkSignals("0000:3b:00.0", 31.5),),
                          pcie_throughput=(LinkSignals("gpu0 tx", 1200.0),), pcie_source="sysfs, nvml",
                          engine=(EngineSignals("e", 1, 2.5, 3, 0),), engine_source="pages")
    s = Signals(now_s=1, write_bursts=(WriteBurstSignals(7, "e", 1 << 20, 9, 1.5, 2.0),), resources=res, trigger="ring")
    *_, bursts, resources, trigger = json.loads(convert.encode_signals(s))
    r = dict(zip(convert.FIELDS["resource-signals"], resources))
    assert r["numa-distance"] == [[10.0, 21.0], [21.0, 10.0]] and r["numa-cpus"] == [[0, 1], [2, 3]]
    assert r["pcie-links"] == [["0000:3b:00.0", 31.5]] and r["pcie-throughput"] == [["gpu0 tx", 1200.0]]
    assert r["engine"] == [["e", 1.0, 2.5, 3.0, 0.0]] and (r["numa-source"], r["engine-source"]) == ("sysfs", "pages")
    assert bursts == [[7, "e", 1 << 20, 9, 1.5, 2.0]] and trigger == "ring"
    assert [f.name.replace("_", "-") for f in dataclasses.fields(ResourceSignals)] == list(convert.FIELDS["resource-signals"])
    assert [f.name.replace("_", "-") for f in dataclasses.fields(Signals)] == list(convert.FIELDS["signals"])
