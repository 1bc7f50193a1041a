"""Any ONNX file serves (here: fixed shapes, no batch dimension, two inputs, INT64 and
FP64), and `--watch-model` reloads it when the file is replaced."""
from __future__ import annotations

import os
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from onnx import TensorProto, helper

from mcp26.demo.stack.inference_server import InferenceServer

pytestmark = pytest.mark.e2e


def scale_model(factor: float) -> bytes:
    """y = x * factor + cast(n): x FP64 [3], n INT64 [3] -> y FP64 [3], count INT64 []."""
    g = helper.make_graph(
        [helper.make_node("Mul", ["x", "f"], ["xs"]), helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.DOUBLE),
         helper.make_node("Add", ["xs", "nf"], ["y"]), helper.make_node("ReduceSum", ["n"], ["count"], keepdims=0)],
        "scale",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [3]),
         helper.make_tensor_value_info("n", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [3]),
         helper.make_tensor_value_info("count", TensorProto.INT64, [])],
        [helper.make_tensor("f", TensorProto.DOUBLE, [], [factor])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _infer(client, x, n):
    a, b = thttp.InferInput("x", [3], "FP64"), thttp.InferInput("n", [3], "INT64")
    a.set_data_from_numpy(x, binary_data=False)
    b.set_data_from_numpy(n, binary_data=True)
    return client.infer("scale", [a, b])


def test_unbatched_onnx_file_and_watched_reload(tmp_path):
    path = tmp_path / "scale.onnx"
    path.write_bytes(scale_model(2.0))
    x, n = np.array([1.5, -2.0, 0.25]), np.array([1, 2, 3], np.int64)
    with InferenceServer(str(path), "--watch-model", admin=False) as server:
        client = thttp.InferenceServerClient(server.http)
        meta = client.get_model_metadata("scale")
        assert [(i["name"], i["datatype"], i["shape"]) for i in meta["inputs"]] == [
            ("x", "FP64", [3]), ("n", "INT64", [3])]
        local = ort.InferenceSession(scale_model(2.0), providers=["CPUExecutionProvider"])
        r = _infer(client, x, n)
        want = local.run(None, {"x": x, "n": n})
        np.testing.assert_array_equal(r.as_numpy("y"), want[0])
        assert r.as_numpy("count") == want[1] == 6 and r.get_response()["model_version"] == "1"
        # gRPC, typed contents path: a wrong length is refused
        g = tgrpc.InferenceServerClient(server.grpc)
        bad = tgrpc.InferInput("x", [4], "FP64")
        bad.set_data_from_numpy(np.zeros(4))
        with pytest.raises(Exception, match="shape \\[4\\] does not match"):
            g.infer("scale", [bad])
        # replace the file (write, then rename, as a deploy would)
        tmp = tmp_path / "scale.onnx.new"
        tmp.write_bytes(scale_model(10.0))
        os.replace(tmp, path)
        deadline = time.monotonic() + 20
        while _infer(client, x, n).get_response()["model_version"] == "1":
            assert time.monotonic() < deadline, "model file change not picked up"
            time.sleep(0.1)
        r = _infer(client, x, n)
        np.testing.assert_array_equal(r.as_numpy("y"), x * 10.0 + n)
        assert r.get_response()["model_version"] == "2"


def embedding_model() -> bytes:
    """vec = table[ids]: ids INT64 [-1, 1] -> vec FP32 [-1, 1, 4]; an id >= 10 is out of range
    only at run time (the declared shape is fine)."""
    from onnx import numpy_helper
    g = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["vec"])], "embedding",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 1])],
        [helper.make_tensor_value_info("vec", TensorProto.FLOAT, ["batch", 1, 4])],
        [numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "table")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_one_bad_request_fails_alone_not_its_whole_batch(tmp_path):
    import queue
    path = tmp_path / "embedding.onnx"
    path.write_bytes(embedding_model())
    with InferenceServer(str(path), "--max-queue-delay-us", "50000", admin=False) as server:
        client = tgrpc.InferenceServerClient(server.grpc)
        done: queue.Queue = queue.Queue()
        ids = [3, 7, 50, 1, 9, 0]                      # 50 is out of range
        for i, token in enumerate(ids):
            inp = tgrpc.InferInput("ids", [1, 1], "INT64")
            inp.set_data_from_numpy(np.array([[token]], np.int64))
            client.async_infer("embedding", [inp], request_id=str(i),
                               callback=lambda result, error, i=i: done.put((i, result, error)))
        answers = {}
        for _ in ids:
            i, result, error = done.get(timeout=30)
            answers[i] = (result, error)
        client.close()
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    for i, token in enumerate(ids):
        result, error = answers[i]
        if token == 50:
            assert error is not None and error.status() == "StatusCode.INVALID_ARGUMENT"
            assert "rejected the input" in error.message() and "out of data bounds" in error.message()
        else:
            assert error is None, error
            np.testing.assert_array_equal(result.as_numpy("vec"), table[[token]][None, ...].reshape(1, 1, 4))
