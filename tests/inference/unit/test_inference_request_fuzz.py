"""Whatever JSON a client sends, request decoding ends in a tensor or in
InvalidArgument (a 400 with its reason) - never another exception."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from mcp26.mesh.batching_policy import BatcherSettings
from mcp26.inference.builtin_models import builtin_path
from mcp26.inference.errors import InferenceError
from mcp26.inference.model_server import ServedModel
from mcp26.inference.request_meta import priority_param
from mcp26.inference.rest_body import decode_inputs, requested_outputs
from mcp26.inference.runtime import OnnxModel
from mcp26.inference.telemetry import Telemetry


@pytest.fixture(scope="module")
def served():
    model = OnnxModel.load("tiny-decoder", "1", builtin_path("tiny-decoder"), "cpu", intra_op_threads=1)
    model.extra["vocab"] = 256
    s = ServedModel("tiny-decoder", model, BatcherSettings(), Telemetry.get())
    yield s
    s.batcher.stop()


scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=5))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                      max_leaves=12)
tensor = st.fixed_dictionaries({}, optional={
    "name": st.sampled_from(["input_ids", "past_key", "past_value", "x"]) | values,
    "datatype": st.sampled_from(["INT64", "FP32", "BYTES", "BOOL", "FP16", "nope"]) | values,
    "shape": st.lists(st.integers(-2, 3), max_size=5) | values,
    "data": values,
    "parameters": st.fixed_dictionaries({}, optional={"binary_data_size": st.integers(-2, 40) | values}) | values,
})
docs = st.fixed_dictionaries({}, optional={
    "inputs": st.lists(tensor, max_size=4) | values,
    "outputs": st.lists(st.fixed_dictionaries({}, optional={"name": values, "parameters": values}), max_size=3) | values,
    "parameters": st.fixed_dictionaries({}, optional={
        "sequence_id": values, "sequence_start": values, "timeout": values, "priority": values}) | values,
})


@st.composite
def near_valid(draw):
    """A valid decoder request with one thing (or none) changed: most reach prepare()."""
    t = draw(st.integers(1, 4))
    ids = {"name": "input_ids", "datatype": "INT64", "shape": [1, t],
           "data": draw(st.lists(st.integers(-3, 300), min_size=t, max_size=t))}
    params = {"sequence_id": draw(st.integers(-2, 5) | st.text(max_size=3) | st.booleans()),
              "sequence_start": draw(st.booleans())}
    doc = {"inputs": [ids], "parameters": params}
    field = draw(st.sampled_from(["none", "shape", "data", "datatype", "timeout", "priority", "outputs",
                                  "past", "sequence_id", "parameters"]))
    if field == "shape":
        ids["shape"] = draw(st.lists(st.integers(-1, 3), max_size=3))
    elif field == "data":
        ids["data"] = draw(values)
    elif field == "datatype":
        ids["datatype"] = draw(st.sampled_from(["INT32", "FP32", "BYTES", "UINT64"]))
    elif field in ("timeout", "priority"):
        params[field] = draw(values)
    elif field == "outputs":
        doc["outputs"] = [{"name": draw(st.sampled_from(["logits", "next_token", "present_key", "nope"]) | values)}]
    elif field == "past":
        p = draw(st.integers(0, 2))
        doc["inputs"].append({"name": "past_key", "datatype": "FP32", "shape": [1, 2, p, 32], "data": [0.0] * (64 * p)})
    elif field == "sequence_id":
        params.pop("sequence_id")
    elif field == "parameters":
        doc["parameters"] = draw(values)
    return doc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=near_valid())
def test_near_valid_requests_are_prepared_or_refused_with_a_reason(served, doc):
    test_decoding_never_raises_anything_but_an_inference_error.hypothesis.inner_test(served, doc, b"")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=docs, binary=st.binary(max_size=48))
def test_decoding_never_raises_anything_but_an_inference_error(served, doc, binary):
    doc = json.loads(json.dumps(doc, allow_nan=True))      # only what JSON can carry
    try:
        arrays = decode_inputs(doc, binary, served.name, served.model.input_specs)
        params = doc.get("parameters") or {}
        if not isinstance(params, dict):
            return
        names, _ = requested_outputs(doc, params, len(served.model.outputs))
        served.prepare(arrays, names, params)
        priority_param(params)
    except InferenceError as e:
        assert e.http_status == 400 and e.message


@st.composite
def grpc_requests(draw):
    from mcp26.inference.protos import grpc_service_pb2 as pb
    req = pb.ModelInferRequest(model_name="tiny-decoder")
    for _ in range(draw(st.integers(0, 3))):
        t = req.inputs.add(name=draw(st.sampled_from(["input_ids", "past_key", "past_value", "x"])),
                           datatype=draw(st.sampled_from(["INT64", "FP32", "BYTES", "INT8", "?"])),
                           shape=draw(st.lists(st.integers(-1, 4), max_size=4)))
        if draw(st.booleans()):
            t.contents.int64_contents.extend(draw(st.lists(st.integers(-5, 400), max_size=6)))
            t.contents.fp32_contents.extend(draw(st.lists(st.floats(width=32), max_size=4)))
    if draw(st.booleans()):
        for _ in range(draw(st.integers(0, 4))):
            req.raw_input_contents.append(draw(st.binary(max_size=40)))
    for key in draw(st.lists(st.sampled_from(["sequence_id", "sequence_start", "timeout", "priority"]), max_size=3)):
        kind = draw(st.sampled_from(["bool_param", "int64_param", "string_param", "double_param", "uint64_param"]))
        value = {"bool_param": draw(st.booleans()), "int64_param": draw(st.integers(-2**63, 2**63 - 1)),
                 "string_param": draw(st.text(max_size=4)), "double_param": draw(st.floats()),
                 "uint64_param": draw(st.integers(0, 2**64 - 1))}[kind]
        setattr(req.parameters[key], kind, value)
    for name in draw(st.lists(st.sampled_from(["logits", "next_token", "nope"]), max_size=2)):
        req.outputs.add(name=name)
    return req


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=grpc_requests())
def test_grpc_decoding_never_raises_anything_but_an_inference_error(served, request):
    from mcp26.inference.grpc_service import decode_request
    from mcp26.inference.request_meta import priority_param
    try:
        arrays, params, outputs = decode_request(served, request)
        served.prepare(arrays, outputs, params)
        priority_param(params)
    except InferenceError as e:
        assert e.http_status == 400 and e.message
