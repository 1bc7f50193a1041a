"""Hot reconfiguration under load: a new model version (admin call) and a new QoS
policy (watched file, then admin call), with zero failed requests."""
from __future__ import annotations

import json
import threading
import time
import urllib.request

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as tgrpc

from mcp26.inference.builtin_models import build_mlp, builtin_path
from mcp26.demo.stack.inference_server import InferenceServer

pytestmark = pytest.mark.e2e

POLICY = """apiVersion: scheduling.mcp-mesh.io/v1alpha1
kind: L7SchedulingPolicy
metadata:
  name: pool
spec:
  qosPolicy: {preset}
"""


class Load:
    """Closed-loop gRPC and REST clients recording (version, input seed, output) or the error."""

    def __init__(self, server: InferenceServer, threads: int = 4):
        self.server, self.stop, self.records, self.errors = server, threading.Event(), [], []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def _run(self, i: int) -> None:
        client = tgrpc.InferenceServerClient(self.server.grpc)
        n = 0
        while not self.stop.is_set():
            n += 1
            seed = i * 1_000_000 + n
            x = np.random.default_rng(seed).standard_normal((1 + n % 3, 64)).astype(np.float32)
            try:
                if i % 2:
                    inp = tgrpc.InferInput("INPUT0", list(x.shape), "FP32")
                    inp.set_data_from_numpy(x)
                    r = client.infer("mlp", [inp])
                    self.records.append((r.get_response().model_version, x, r.as_numpy("OUTPUT0")))
                else:
                    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": list(x.shape), "datatype": "FP32",
                                                   "data": x.reshape(-1).tolist()}]}).encode()
                    with urllib.request.urlopen(urllib.request.Request(
                            f"http://{self.server.http}/v2/models/mlp/infer", data=body, method="POST"), timeout=30) as resp:
                        doc = json.loads(resp.read())
                    out = np.array(doc["outputs"][0]["data"], np.float32).reshape(doc["outputs"][0]["shape"])
                    self.records.append((doc["model_version"], x, out))
            except Exception as e:  # every failure counts
                self.errors.append(repr(e))
        client.close()

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(30)


def _status(server):
    return server.admin("/admin/status")[1]["models"][0]


def test_model_and_policy_reload_under_load_with_zero_failures(tmp_path):
    v2_path = tmp_path / "mlp-v2.onnx"
    v2_path.write_bytes(build_mlp(seed=7).SerializeToString())
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(preset="balanced"))
    sessions = {"1": ort.InferenceSession(builtin_path("mlp"), providers=["CPUExecutionProvider"]),
                "2": ort.InferenceSession(str(v2_path), providers=["CPUExecutionProvider"])}
    with InferenceServer("builtin:mlp", "--policy-file", str(policy)) as server:
        with Load(server) as load:
            time.sleep(1.0)
            status, reply = server.admin("/admin/reload", {"path": str(v2_path), "version": "2"})
            assert status == 200, reply
            model_reload_s = reply["seconds"]
            time.sleep(0.5)
            t0 = time.monotonic()
            # (presets whose standard level never times out: a slow shared machine must
            # not turn queue timeouts into "failures" of the reload)
            policy.write_text(POLICY.format(preset="throughput"))
            while "throughput" not in _status(server)["batching"]["name"]:
                assert time.monotonic() - t0 < 10, "policy file change not applied"
                time.sleep(0.02)
            file_policy_s = time.monotonic() - t0
            status, reply = server.admin("/admin/policy", {"qosPolicy": "balanced", "maxBatchSize": 16})
            assert status == 200 and reply["policy"]["max_batch_size"] == 16
            time.sleep(0.5)
        final = _status(server)
    assert not load.errors, load.errors[:5]
    versions = [v for v, _, _ in load.records]
    assert "1" in versions and "2" in versions and versions.index("2") > 0
    # After the swap no request is answered by the old version.
    first_v2 = versions.index("2")
    assert "1" not in versions[first_v2 + len(load.threads):]
    for version, x, out in load.records:
        np.testing.assert_allclose(out, sessions[version].run(None, {"INPUT0": x})[0], rtol=1e-5, atol=1e-6)
    assert final["version"] == "2" and final["batching"]["max_batch_size"] == 16
    print(f"\nreload under load: {len(load.records)} requests, 0 failures; model swap {model_reload_s:.3f}s "
          f"(load+warm-up of 77 MB), policy file noticed+applied {file_policy_s:.3f}s")


def test_bad_new_version_is_refused_and_old_keeps_serving(tmp_path):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"not an onnx model")
    with InferenceServer("builtin:mlp") as server:
        status, reply = server.admin("/admin/reload", {"path": str(bad)})
        assert status == 400 and "previous version still serving" in reply["error"]
        assert f"model file {bad}: onnxruntime cannot load it" in reply["error"], reply
        client = tgrpc.InferenceServerClient(server.grpc)
        inp = tgrpc.InferInput("INPUT0", [1, 64], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 64), np.float32))
        assert client.infer("mlp", [inp]).get_response().model_version == "1"
        # a model that loads but takes other inputs is refused too
        from onnx import TensorProto, helper
        other = tmp_path / "other.onnx"
        other.write_bytes(helper.make_model(helper.make_graph(
            [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "other",
            [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["b", 32])],
            [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["b", 32])]),
            opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
        status, reply = server.admin("/admin/reload", {"path": str(other)})
        assert status == 400 and "different inputs" in reply["error"]
        assert client.infer("mlp", [inp]).get_response().model_version == "1"
        status, reply = server.admin("/admin/policy", {"maxBatchSize": 0})
        assert status == 400 and "spec.maxBatchSize" in reply["error"]


def test_sigterm_drains_every_request_already_sent():
    """SIGTERM: not ready at once, but everything already on the wire is answered."""
    import queue as q
    import urllib.error
    with InferenceServer("builtin:mlp", "--max-batch", "1", "--drain-seconds", "1") as server:
        client = tgrpc.InferenceServerClient(server.grpc)
        done: q.Queue = q.Queue()
        for i in range(60):
            inp = tgrpc.InferInput("INPUT0", [1, 64], "FP32")
            inp.set_data_from_numpy(np.full((1, 64), i, np.float32))
            client.async_infer("mlp", [inp], callback=lambda result, error: done.put(error))
        server.proc.terminate()
        time.sleep(0.3)
        with pytest.raises(urllib.error.HTTPError) as e:   # draining: readiness fails first
            urllib.request.urlopen(f"http://{server.http}/v2/health/ready", timeout=5)
        assert e.value.code == 503
        errors = [done.get(timeout=30) for _ in range(60)]
        assert server.proc.wait(30) == 0
    assert [str(e) for e in errors if e is not None] == []
