"""Triton model repositories (inference.model_repository) and ensembles (inference.ensemble),
in-process: config.pbtxt files in the shapes of Triton's documentation (tests/data/triton_configs)
load with Triton's meaning; hostile and wrong files are refused naming file, line and field,
and nothing is served from them; an ensemble's DAG runs through the step models' batchers."""
from __future__ import annotations

import asyncio
import os
import shutil

import numpy as np
import pytest
from prometheus_client import REGISTRY, generate_latest
from onnx import TensorProto, helper

from mcp26.mesh.batching_policy import preset
from mcp26.inference import model_repository as mr, repository, triton_config
from mcp26.inference.errors import InferenceError
from mcp26.inference.model_server import ModelServer
from mcp26.inference.telemetry import Telemetry

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data", "triton_configs")


def add_model(path: str, op: str = "Add") -> None:
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", 16]) for n in ("input0", "input1")]
    out = helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["b", 16])
    g = helper.make_graph([helper.make_node(op, ["input0", "input1"], ["output0"])], "m", ins, [out])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())


def repo_with(tmp_path, name: str, config: str, versions=(1,), filename="model.onnx", op="Add") -> str:
    root = tmp_path / "repo"
    (root / name).mkdir(parents=True, exist_ok=True)
    shutil.copy(os.path.join(DATA, config), root / name / "config.pbtxt")
    for v in versions:
        add_model(str(root / name / str(v) / filename), op)
    return str(root)


def test_the_minimal_onnx_config_takes_its_name_from_the_directory(tmp_path):
    root = repo_with(tmp_path, "simple", "minimal_onnx.pbtxt")
    e = mr.scan(root)["simple"]
    assert e.config.name == "simple" and e.versions == ["1"] and e.device == "auto" and e.instances == 1
    s = mr.batcher_settings(e, preset("balanced"))
    # no dynamic_batching: Triton's default scheduler, each request as it comes
    assert (s.max_batch_size, s.max_queue_delay_us, s.preferred_batch_sizes) == (8, 0, ())


def test_instance_groups_batching_and_a_specific_version_policy(tmp_path):
    root = repo_with(tmp_path, "densenet", "instance_and_batching.pbtxt", versions=(1, 2, 3))
    e = mr.scan(root)["densenet"]
    assert (e.device, e.instances, e.versions, e.skipped, e.version) == ("gpu:0", 2, ["1", "3"], ["2"], "3")
    s = mr.batcher_settings(e, preset("balanced"))
    assert (s.max_batch_size, s.preferred_batch_sizes, s.max_queue_delay_us) == (8, (4, 8), 100)
    assert (s.priority_levels, s.default_priority_level, s.default_queue_policy.max_queue_size) == (2, 2, 64)
    p1 = s.queue_policies[1]
    assert (p1.timeout_action, p1.default_timeout_us, p1.allow_timeout_override) == ("DELAY", 5000, True)


def test_two_cpu_groups_are_their_counts_on_one_queue(tmp_path):
    root = repo_with(tmp_path, "m", "minimal_onnx.pbtxt")
    with open(os.path.join(root, "m", "config.pbtxt"), "a") as fh:
        fh.write("instance_group [ { count: 1 kind: KIND_CPU }, { count: 2 kind: KIND_CPU } ]\n")
    e = mr.scan(root)["m"]
    assert (e.device, e.instances) == ("cpu", 3)


def test_a_cpu_group_a_default_filename_and_the_latest_two_versions(tmp_path):
    root = repo_with(tmp_path, "densenet", "cpu_latest.pbtxt", versions=(1, 2, 7), filename="net.onnx")
    os.makedirs(os.path.join(root, "densenet", "notaversion"))
    e = mr.scan(root)["densenet"]
    assert (e.device, e.instances, e.versions, e.skipped) == ("cpu", 2, ["2", "7"], ["1"])
    assert e.model_path.endswith(os.path.join("densenet", "7", "net.onnx"))


def add_square_model(path: str, shape=("b", 4, 4)) -> None:
    """input0 + input1 -> output0, each of `shape` (the model side of a reshape)."""
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape)) for n in ("input0", "input1")]
    out = helper.make_tensor_value_info("output0", TensorProto.FLOAT, list(shape))
    g = helper.make_graph([helper.make_node("Add", ["input0", "input1"], ["output0"])], "sq", ins, [out])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())


def _infer(served, inputs: dict) -> dict:
    async def go():
        return await served.infer(served.prepare(inputs, [], {}), "standard", None)
    return asyncio.run(go()).outputs


def test_reshape_gives_clients_the_configs_dims_and_the_model_its_own(tmp_path):
    """Triton's reshape: clients send and get [16], the model adds [4, 4] tensors; the batch
    dimension stays the client's; the repository's file is not touched."""
    root = tmp_path / "repo"
    (root / "sq").mkdir(parents=True)
    shutil.copy(os.path.join(DATA, "reshape.pbtxt"), root / "sq" / "config.pbtxt")
    add_square_model(str(root / "sq" / "1" / "model.onnx"))
    before = (root / "sq" / "1" / "model.onnx").read_bytes()
    server = _served(str(root))
    try:
        sq = server.get("sq")
        shapes = {d["name"]: d["shape"] for d in sq.model.metadata()["inputs"] + sq.model.metadata()["outputs"]}
        assert shapes == {"input0": [-1, 16], "input1": [-1, 4, 4], "output0": [-1, 16]}
        x0 = np.arange(48, dtype=np.float32).reshape(3, 16)
        x1 = np.full((3, 4, 4), 0.5, dtype=np.float32)
        out = _infer(sq, {"input0": x0, "input1": x1})["output0"]
        assert out.shape == (3, 16)
        np.testing.assert_array_equal(out, (x0.reshape(3, 4, 4) + x1).reshape(3, 16))
        with pytest.raises(InferenceError, match="input0"):
            _infer(sq, {"input0": x0.reshape(3, 4, 4), "input1": x1})    # the model's shape is not the client's
        grpc_config = triton_config.config_message(sq)      # what ModelConfig over gRPC answers
        assert list(grpc_config.input[0].reshape.shape) == [4, 4] and not grpc_config.input[1].HasField("reshape")
        assert list(grpc_config.output[0].reshape.shape) == [4, 4]
    finally:
        server.stop()
    assert (root / "sq" / "1" / "model.onnx").read_bytes() == before


def test_an_unbatched_reshape_as_in_tritons_documentation(tmp_path):
    """max_batch_size 0, dims [3, 4, 4] and reshape { shape: [1, 3, 4, 4] } (the documentation's
    [3, 224, 224] -> [1, 3, 224, 224], smaller)."""
    root = tmp_path / "repo"
    add_square_model(str(root / "img" / "1" / "model.onnx"), shape=(1, 3, 4, 4))
    (root / "img" / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
        'input [ { name: "input0" data_type: TYPE_FP32 dims: [ 3, 4, 4 ] reshape: { shape: [ 1, 3, 4, 4 ] } },\n'
        '        { name: "input1" data_type: TYPE_FP32 dims: [ 3, 4, 4 ] reshape: { shape: [ 1, 3, 4, 4 ] } } ]\n'
        'output [ { name: "output0" data_type: TYPE_FP32 dims: [ 3, 4, 4 ] reshape: { shape: [ 1, 3, 4, 4 ] } } ]\n')
    server = _served(str(root))
    try:
        img = server.get("img")
        x = np.linspace(0, 1, 48, dtype=np.float32).reshape(3, 4, 4)
        out = _infer(img, {"input0": x, "input1": x})["output0"]
        assert out.shape == (3, 4, 4)
        np.testing.assert_allclose(out, 2 * x)
    finally:
        server.stop()


def test_a_reshape_the_model_cannot_take_serves_nothing_and_names_the_model(tmp_path):
    root = tmp_path / "repo"
    add_square_model(str(root / "sq" / "1" / "model.onnx"))
    (root / "sq" / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "input0" data_type: TYPE_FP32 dims: [ 16 ] reshape: { shape: [ 8, 2 ] } } ]\n')
    server = ModelServer(Telemetry.get(None))
    repo = mr.Repository(str(root), "cpu", preset("balanced"), intra_op_threads=1)
    with pytest.raises(mr.RepositoryError) as e:
        repo.load_all(server)
    assert str(e.value) == (f"{root / 'sq' / 'config.pbtxt'}: model 'sq': field input[0].reshape.shape: "
                            f"[8, 2], but the model's 'input0' is [4, 4] past the batch dimension"), str(e.value)
    assert server.models == {}


def test_every_version_the_policy_selects_is_served_and_poll_follows_the_directory(tmp_path):
    """Triton serves each selected version: latest { num_versions: 2 } over versions 1-3 serves
    2 and 3 (each its own graph here: Mul, Sub), a request naming none gets the newest; a new
    version directory moves the pair to 3 and 4 and stops 2."""
    root = tmp_path / "repo"
    for v, op in ((1, "Add"), (2, "Mul"), (3, "Sub")):
        add_model(str(root / "mv" / str(v) / "model.onnx"), op)
    (root / "mv" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
                                             'version_policy { latest { num_versions: 2 } }\n')
    server = _served(str(root))
    try:
        a = np.full((1, 16), 3.0, dtype=np.float32)
        b = np.full((1, 16), 2.0, dtype=np.float32)

        def run(version: str) -> float:
            return float(_infer(server.get("mv", version), {"input0": a, "input1": b})["output0"][0, 0])
        assert (run("2"), run("3"), run("")) == (6.0, 1.0, 1.0)
        with pytest.raises(InferenceError, match=r"no version '1'; serving version\(s\) 2, 3"):
            server.get("mv", "1")
        assert server.get("mv").versions() == ["2", "3"] and server.get("mv", "2").versions() == ["2", "3"]
        assert [(e["version"], e["state"]) for e in repository.index(server)] == [("2", "READY"), ("3", "READY")]
        assert [d["version"] for d in server.lookup("mv").stats.docs()] == ["2", "3"]
        assert [d["execution_count"] for d in server.lookup("mv").stats.docs()] == [1, 2]   # 2 ran once, 3 twice
        scrape = generate_latest(REGISTRY).decode()      # each version's series once, from one source
        assert [line.split()[-1] for line in scrape.splitlines()
                if line.startswith('nv_inference_exec_count{model="mv",version="2"}')] == ["1.0"], scrape

        add_model(str(root / "mv" / "4" / "model.onnx"), "Add")
        changes = server.repository.poll(server)
        assert "mv: version 3 -> 4" in changes and "mv: version 2 no longer served" in changes, changes
        assert (run("3"), run("4")) == (1.0, 5.0) and server.get("mv").versions() == ["3", "4"]
        with pytest.raises(InferenceError, match="no version '2'"):
            server.get("mv", "2")
    finally:
        server.stop()


def _served(root: str) -> ModelServer:
    server = ModelServer(Telemetry.get(None))
    server.repository = mr.Repository(root, "cpu", preset("balanced"), intra_op_threads=1)
    server.repository.load_all(server)
    server.ready = True
    return server


def test_the_documentation_ensemble_runs_its_steps_in_order(tmp_path):
    root = repo_with(tmp_path, "image_preprocess_model", "minimal_onnx.pbtxt")
    repo_with(tmp_path, "classification_model", "minimal_onnx.pbtxt", op="Mul")
    os.makedirs(os.path.join(root, "ensemble_model", "1"))
    shutil.copy(os.path.join(DATA, "ensemble.pbtxt"), os.path.join(root, "ensemble_model", "config.pbtxt"))
    server = _served(root)
    try:
        ens = server.get("ensemble_model")
        x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)

        async def go():
            return await ens.infer(ens.prepare({"IMAGE": x}, [], {}), "latency-critical", None)
        result = asyncio.run(go())
        np.testing.assert_allclose(result.outputs["CLASSIFICATION"], (x + x) * x, rtol=1e-6)
        assert result.level == 1            # the mesh's class reached the steps' batchers
        assert [s.model for s in ens.steps] == ["image_preprocess_model", "classification_model"]
    finally:
        server.stop()


BAD = {
    # (file text, what the message must say)
    "syntax": ('platform: "onnxruntime_onnx"\nmax_batch_size: 8\ninput [ { name: "x" \n', 'config.pbtxt:3:17: Expected "}"'),
    "unknown field": ('platform: "onnxruntime_onnx"\nmax_batch_sise: 8\n', ':2:1: Message type "inference.ModelConfig" '
                      'has no field named "max_batch_sise"'),
    "wrong type": ('platform: "onnxruntime_onnx"\nmax_batch_size: "eight"\n', ":2:17:"),
    "enum": ('platform: "onnxruntime_onnx"\ninstance_group [ { kind: KIND_QUANTUM } ]\n', "KIND_QUANTUM"),
    "nested": ("parameters { key: \"a\" value { " * 200 + "}" * 400, "config.pbtxt"),
    "huge": ("# " + "x" * (2 << 20) + "\n", "larger than"),
    "not utf-8": (b"platform: \"\xff\xfe\"\n", "not UTF-8"),
    "name": ('name: "other"\nplatform: "onnxruntime_onnx"\n', "field name: 'other' differs from its directory"),
    "platform": ('platform: "tensorrt_plan"\n', "field platform: 'tensorrt_plan'"),
    "reshape counts": ('platform: "onnxruntime_onnx"\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] '
                       'reshape { shape: [ 4, 5 ] } } ]\n',
                       "field input[0].reshape.shape: [4, 5] holds 20 elements, dims [16] 16"),
    "reshape overflow": ('platform: "onnxruntime_onnx"\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] '
                         'reshape { shape: [ 9223372036854775807, 2 ] } } ]\n',
                         "field input[0].reshape.shape: [9223372036854775807, 2] holds 18446744073709551614 elements"),
    "reshape dims": ('platform: "onnxruntime_onnx"\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] '
                     'reshape { shape: [ -1, -1 ] } } ]\n', "field input[0].reshape.shape: [-1, -1]: at most one -1"),
    "dims": ('platform: "onnxruntime_onnx"\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 0 ] } ]\n',
             "field input[0].dims"),
    "version": ('platform: "onnxruntime_onnx"\nversion_policy { specific { versions: [ 4 ] } }\n',
                "field version_policy.specific.versions: version(s) 4 not in"),
    "two devices": ('platform: "onnxruntime_onnx"\ninstance_group [ { kind: KIND_CPU }, { kind: KIND_GPU } ]\n',
                    "field instance_group: groups on cpu, gpu:0: this server runs a model's instances on one device"),
    "count": ('platform: "onnxruntime_onnx"\ninstance_group [ { count: 40 kind: KIND_CPU }, { count: 40 kind: KIND_CPU } ]\n',
              "field instance_group: 80 instances in all; at most 64"),
    "second group's count": ('platform: "onnxruntime_onnx"\ninstance_group [ { kind: KIND_CPU }, { count: -2 } ]\n',
                             "field instance_group[1].count: must be 1..64, got -2"),
    "model kind": ('platform: "onnxruntime_onnx"\ninstance_group [ { kind: KIND_MODEL } ]\n',
                   "KIND_MODEL needs parameters"),
    "device": ('platform: "onnxruntime_onnx"\nparameters { key: "device" value { string_value: "tpu:0" } }\n',
               "unknown device 'tpu:0'"),
    "sequence": ('platform: "onnxruntime_onnx"\nsequence_batching { }\n', "field sequence_batching"),
    "empty ensemble": ('platform: "ensemble"\n', "field ensemble_scheduling"),
}


@pytest.mark.adversarial
@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_config_names_file_line_and_field(tmp_path, case):
    text, says = BAD[case]
    root = tmp_path / "repo"
    add_model(str(root / "m" / "1" / "model.onnx"))
    (root / "m" / "config.pbtxt").write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(mr.RepositoryError) as e:
        mr.scan(str(root))
    msg = str(e.value)
    assert str(root / "m" / "config.pbtxt") in msg and says in msg, msg
    assert "Traceback" not in msg


MISMATCH = {
    "input name": ('input [ { name: "inputX" data_type: TYPE_FP32 dims: [ 16 ] } ]', "field input[0].name: 'inputX'"),
    "data type": ('input [ { name: "input0" data_type: TYPE_INT32 dims: [ 16 ] } ]', "field input[0].data_type"),
    "dims": ('output [ { name: "output0" data_type: TYPE_FP32 dims: [ 15 ] } ]', "field output[0].dims: [15]"),
    "batch": ('max_batch_size: 4\ninput [ { name: "input0" data_type: TYPE_FP32 dims: [ 2, 16 ] } ]',
              "field input[0].dims: [2, 16]"),
}


@pytest.mark.adversarial
@pytest.mark.parametrize("case", list(MISMATCH))
def test_a_config_that_disagrees_with_its_model_serves_nothing(tmp_path, case):
    text, says = MISMATCH[case]
    root = tmp_path / "repo"
    add_model(str(root / "m" / "1" / "model.onnx"))
    if "max_batch_size" not in text:
        text = "max_batch_size: 8\n" + text
    (root / "m" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\n' + text)
    server = ModelServer(Telemetry.get(None))
    repo = mr.Repository(str(root), "cpu", preset("balanced"), intra_op_threads=1)
    with pytest.raises(mr.RepositoryError) as e:
        repo.load_all(server)
    assert says in str(e.value), str(e.value)
    assert server.models == {}


ENSEMBLE_BAD = {
    "missing model": ('{ model_name: "nope" model_version: -1 input_map { key: "input0" value: "IN" } '
                      'input_map { key: "input1" value: "IN" } output_map { key: "output0" value: "OUT" } }',
                      "step[0].model_name: 'nope' is not in the repository"),
    "unmapped input": ('{ model_name: "m" model_version: -1 input_map { key: "input0" value: "IN" } '
                       'output_map { key: "output0" value: "OUT" } }', "input(s) input1 not mapped"),
    "dangling tensor": ('{ model_name: "m" model_version: -1 input_map { key: "input0" value: "IN" } '
                        'input_map { key: "input1" value: "ghost" } output_map { key: "output0" value: "OUT" } }',
                        "tensor 'ghost' is neither an ensemble input nor a step's output"),
    "cycle": ('{ model_name: "m" model_version: -1 input_map { key: "input0" value: "IN" } '
              'input_map { key: "input1" value: "b" } output_map { key: "output0" value: "a" } }, '
              '{ model_name: "m" model_version: -1 input_map { key: "input0" value: "a" } '
              'input_map { key: "input1" value: "IN" } output_map { key: "output0" value: "b" } }',
              "the steps form a cycle"),
    "no output": ('{ model_name: "m" model_version: -1 input_map { key: "input0" value: "IN" } '
                  'input_map { key: "input1" value: "IN" } output_map { key: "output0" value: "x" } }',
                  "field output: 'OUT' is produced by no step"),
    "version": ('{ model_name: "m" model_version: 9 input_map { key: "input0" value: "IN" } '
                'input_map { key: "input1" value: "IN" } output_map { key: "output0" value: "OUT" } }',
                "step[0].model_version: 9, but 'm' serves version(s) 1"),
}


@pytest.mark.adversarial
@pytest.mark.parametrize("case", list(ENSEMBLE_BAD))
def test_a_broken_ensemble_is_refused_naming_the_step(tmp_path, case):
    steps, says = ENSEMBLE_BAD[case]
    root = repo_with(tmp_path, "m", "minimal_onnx.pbtxt")
    os.makedirs(os.path.join(root, "e", "1"))
    with open(os.path.join(root, "e", "config.pbtxt"), "w") as fh:
        fh.write('platform: "ensemble"\nmax_batch_size: 8\n'
                 'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
                 'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
                 f'ensemble_scheduling {{ step [ {steps} ] }}\n')
    server = ModelServer(Telemetry.get(None))
    repo = mr.Repository(root, "cpu", preset("balanced"), intra_op_threads=1)
    try:
        with pytest.raises(mr.RepositoryError) as e:
            repo.load_all(server)
        assert says in str(e.value) and os.path.join(root, "e", "config.pbtxt") in str(e.value), str(e.value)
        assert "e" not in server.models
    finally:
        server.stop()


def test_a_step_that_fails_fails_the_request_naming_the_step(tmp_path):
    from mcp26.inference.examples.build_repository import build, example_request
    server = _served(build(str(tmp_path / "mm")))
    try:
        ens = server.get("multimodal")
        req = example_request(1)
        req["TOKENS"][0, 3] = 5000         # past the text model's 1000-row embedding table

        async def go():
            return await ens.infer(ens.prepare(req, [], {}), None, None)
        with pytest.raises(InferenceError) as e:
            asyncio.run(go())
        assert "ensemble 'multimodal' step 2 (text): " in e.value.message, e.value.message
    finally:
        server.stop()
