"""A Triton repository served by a live `mcpctl serve --model-repository`: a diamond ensemble
(two branches, one fusion) over KServe v2 REST and gRPC with the real tritonclient, equal to
running its steps one by one; the mesh's QoS class reaches every step; the index lists it; a
step failing fails the request naming the step; explicit model control loads a model from
the directory."""
from __future__ import annotations

import os

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from mcp26.demo.stack.inference_server import InferenceServer

pytestmark = pytest.mark.e2e
BRANCH = 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n' \
         'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n' \
         'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n' \
         'instance_group [ { kind: KIND_CPU } ]\ndynamic_batching { max_queue_delay_microseconds: 200 }\n'
DIAMOND = '''platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "left" model_version: -1 input_map { key: "X" value: "IN" } output_map { key: "Y" value: "l" } },
  { model_name: "right" model_version: -1 input_map { key: "X" value: "IN" } output_map { key: "Y" value: "r" } },
  { model_name: "join" model_version: -1 input_map { key: "A" value: "l" } input_map { key: "B" value: "r" }
    output_map { key: "Y" value: "OUT" } } ] }
'''


def _model(path, nodes, inputs):
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", 4]) for n in inputs],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["b", 4])])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    _model(str(root / "left/1/model.onnx"), [helper.make_node("Relu", ["X"], ["Y"])], ["X"])
    _model(str(root / "right/1/model.onnx"), [helper.make_node("Sqrt", ["X"], ["Y"])], ["X"])
    _model(str(root / "join/1/model.onnx"), [helper.make_node("Sub", ["A", "B"], ["Y"])], ["A", "B"])
    _model(str(root / "spare/1/model.onnx"), [helper.make_node("Neg", ["X"], ["Y"])], ["X"])
    for name in ("left", "right", "spare"):
        (root / name / "config.pbtxt").write_text(BRANCH)
    (root / "join/config.pbtxt").write_text(BRANCH.replace('input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]',
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]'))
    os.makedirs(root / "diamond/1")
    (root / "diamond/config.pbtxt").write_text(DIAMOND)
    return str(root)


@pytest.fixture(scope="module")
def server(repo):
    with InferenceServer("repository:" + repo, "--model-control-mode", "explicit", "--load-model", "diamond") as s:
        yield s


def _expected(x):
    return np.maximum(x, 0) - np.sqrt(x)


def test_the_diamond_over_rest_and_grpc(server):
    x = np.array([[0.25, 1, 4, 9], [16, 0, 2, 3]], np.float32)
    h = thttp.InferenceServerClient(server.http)
    i = thttp.InferInput("IN", [2, 4], "FP32")
    i.set_data_from_numpy(x)
    rest = h.infer("diamond", [i], headers={"x-mcp-qos-class": "latency-critical"})
    np.testing.assert_allclose(rest.as_numpy("OUT"), _expected(x), rtol=1e-6)
    assert rest.get_response()["parameters"]["priority_level"] == 1       # the class reached the steps
    g = tgrpc.InferenceServerClient(server.grpc)
    gi = tgrpc.InferInput("IN", [2, 4], "FP32")
    gi.set_data_from_numpy(x)
    np.testing.assert_allclose(g.infer("diamond", [gi]).as_numpy("OUT"), _expected(x), rtol=1e-6)
    assert g.get_model_metadata("diamond").platform == "ensemble"
    steps = h.get_model_config("diamond")["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == ["left", "right", "join"]


def test_the_index_lists_what_is_loaded_and_what_is_not(server):
    index = {e["name"]: e for e in thttp.InferenceServerClient(server.http).get_model_repository_index()}
    assert {n: e["state"] for n, e in index.items()} == {
        "diamond": "READY", "left": "READY", "right": "READY", "join": "READY", "spare": "UNAVAILABLE"}
    assert index["spare"]["reason"] == "not loaded"


def test_a_failing_step_names_itself(server):
    x = np.array([[1, 1, 1, 1]], np.float32)
    h = thttp.InferenceServerClient(server.http)
    h.unload_model("right")
    try:
        i = thttp.InferInput("IN", [1, 4], "FP32")
        i.set_data_from_numpy(x)
        with pytest.raises(InferenceServerException) as e:
            h.infer("diamond", [i])
        assert "ensemble 'diamond' step 1 (right): model 'right' is unloaded" in str(e.value)
    finally:
        h.load_model("right")
    i = thttp.InferInput("IN", [1, 4], "FP32")
    i.set_data_from_numpy(x)
    np.testing.assert_allclose(h.infer("diamond", [i]).as_numpy("OUT"), _expected(x))


def test_explicit_load_reads_a_model_from_the_directory(server):
    g = tgrpc.InferenceServerClient(server.grpc)
    assert not thttp.InferenceServerClient(server.http).is_model_ready("spare")
    g.load_model("spare")
    assert g.is_model_ready("spare")
    i = tgrpc.InferInput("X", [1, 4], "FP32")
    i.set_data_from_numpy(np.array([[1, -2, 3, -4]], np.float32))
    assert g.infer("spare", [i]).as_numpy("Y").tolist() == [[-1, 2, -3, 4]]


def test_poll_mode_applies_the_directory_as_it_changes(tmp_path):
    import shutil
    import time
    root = tmp_path / "repo"
    _model(str(root / "a/1/model.onnx"), [helper.make_node("Relu", ["X"], ["Y"])], ["X"])
    (root / "a/config.pbtxt").write_text(BRANCH)
    x = np.array([[1, -2, 3, -4]], np.float32)

    def infer(h, name):
        i = thttp.InferInput("X", [1, 4], "FP32")
        i.set_data_from_numpy(x)
        return h.infer(name, [i]).as_numpy("Y").tolist()

    def until(predicate, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if predicate():
                    return True
            except InferenceServerException:
                pass
            time.sleep(0.2)
        return False

    with InferenceServer("repository:" + str(root), "--model-control-mode", "poll") as s:
        h = thttp.InferenceServerClient(s.http)
        assert infer(h, "a") == [[1, 0, 3, 0]]
        # a new model directory is loaded
        _model(str(root / "b/1/model.onnx"), [helper.make_node("Neg", ["X"], ["Y"])], ["X"])
        (root / "b/config.pbtxt").write_text(BRANCH)
        assert until(lambda: h.is_model_ready("b"))
        assert infer(h, "b") == [[-1, 2, -3, 4]]
        # a new version is swapped in
        _model(str(root / "a/2/model.onnx"), [helper.make_node("Abs", ["X"], ["Y"])], ["X"])
        assert until(lambda: infer(h, "a") == [[1, 2, 3, 4]])
        # a broken config changes nothing
        (root / "a/config.pbtxt").write_text(BRANCH + "max_batch_size: \"many\"\n")
        time.sleep(2.5)
        assert infer(h, "a") == [[1, 2, 3, 4]]
        assert "not applied, serving as before" in s.log_tail() and "config.pbtxt:7:" in s.log_tail()
        # a removed directory is unloaded
        shutil.rmtree(root / "b")
        assert until(lambda: not h.is_model_ready("b"))
        assert infer(h, "a") == [[1, 2, 3, 4]]


def test_admin_status_says_where_each_model_runs_and_a_policy_leaves_configs_alone(server):
    import json
    import urllib.error
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{server.admin_port}/admin/status") as r:
        models = {m["name"]: m for m in json.load(r)["models"]}
    assert models["left"]["placement"][0]["execution_provider"] == "CPUExecutionProvider"
    assert [s["model"] for s in models["diamond"]["steps"]] == ["left", "right", "join"]
    req = urllib.request.Request(f"http://127.0.0.1:{server.admin_port}/admin/policy",
                                 json.dumps({"qosPolicy": "throughput"}).encode(), {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 400 and "keeps its config.pbtxt's batching" in e.value.read().decode()
    cfg = thttp.InferenceServerClient(server.http).get_model_config("left")
    assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 200
