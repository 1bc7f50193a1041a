""".mcp26bin served: hot update under load with zero failures, a bad update refused while
the old version keeps serving, answers bit-identical to the ONNX model's, and the design
document's two commands run literally (in a network namespace of their own, so the
default ports 8080/8081 are theirs)."""
from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.grpc as tgrpc
from onnx import numpy_helper

from mcp26.demo.stack.inference_server import InferenceServer
from mcp26.inference import model_format
from mcp26.inference.builtin_models import build_mlp
from mcp26.inference.profiler import METRICS
from mcp26.inference.runtime import OnnxModel

pytestmark = pytest.mark.e2e
BIN = os.path.dirname(sys.executable)


def fine_tuned_mlp(changed=("w0", "b0", "w3", "b3")) -> onnx.ModelProto:
    """builtin:mlp with its first and last layers changed (1.3 % of the weights)."""
    model = build_mlp()
    rng = np.random.default_rng(99)
    for init in model.graph.initializer:
        if init.name in changed:
            a = numpy_helper.to_array(init)
            init.CopyFrom(numpy_helper.from_array((a + 0.01 * rng.standard_normal(a.shape)).astype(a.dtype), init.name))
    return model


def reference(path: str, x: np.ndarray) -> np.ndarray:
    """The ONNX model as the mapped .mcp26bin session runs it: basic level, prepacking off."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.add_session_config_entry("session.disable_prepacking", "1")
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"]).run(None, {"INPUT0": x})[0]


@pytest.fixture(scope="module")
def mlp_versions(tmp_path_factory):
    d = tmp_path_factory.mktemp("mcp26bin")
    onnx.save(build_mlp(), str(d / "v1.onnx"))
    onnx.save(fine_tuned_mlp(), str(d / "v2.onnx"))
    model_format.pack(str(d / "v1.onnx"), str(d / "v1.mcp26bin"))
    model_format.pack(str(d / "v2.onnx"), str(d / "v2.mcp26bin"), base=str(d / "v1.mcp26bin"))
    return d


class Load:
    """gRPC clients in a closed loop, recording (version, input, output) or the error."""

    def __init__(self, server: InferenceServer, threads: int = 3):
        self.server, self.stop, self.records, self.errors = server, threading.Event(), [], []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def _run(self, i: int) -> None:
        client = tgrpc.InferenceServerClient(self.server.grpc)
        n = 0
        while not self.stop.is_set():
            n += 1
            x = np.random.default_rng(i * 100_000 + n).standard_normal((1 + n % 3, 64)).astype(np.float32)
            inp = tgrpc.InferInput("INPUT0", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            try:
                r = client.infer("v1", [inp])
                self.records.append((r.get_response().model_version, x, r.as_numpy("OUTPUT0")))
            except Exception as e:          # every failure counts
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


def settled(server: InferenceServer, version: str) -> dict:
    """/admin/status of the model once `version` serves from its full session."""
    deadline = time.monotonic() + 60
    while True:
        status = server.admin("/admin/status")[1]["models"][0]
        if status["version"] == version and status["weights"] == "session":
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.05)


def test_incremental_hot_update_under_load_zero_failures_bit_identical(mlp_versions):
    d = mlp_versions
    full, update = os.path.getsize(d / "v1.mcp26bin"), os.path.getsize(d / "v2.mcp26bin")
    assert update <= 0.05 * full, (update, full)
    with InferenceServer(str(d / "v1.mcp26bin")) as server:
        settled(server, "1")            # v1 settled first: the update must come in mapped and settle again
        with Load(server) as load:
            time.sleep(0.8)
            status, reply = server.admin("/admin/reload", {"path": str(d / "v2.mcp26bin"), "version": "2"})
            assert status == 200, reply
            time.sleep(0.8)
        # a bad update is refused, by name, and version 2 keeps serving
        bad = d / "v3.mcp26bin"
        shutil.copy(d / "v2.mcp26bin", bad)
        chunk = next(c for c in model_format.open_container(str(bad)).chunks if c["file"] == 0)
        with open(bad, "r+b") as fh:
            fh.seek(chunk["offset"] + 8)
            fh.write(b"\x00\x01\x02\x03")
        status, reply = server.admin("/admin/reload", {"path": str(bad), "version": "3"})
        assert status == 400 and f"{bad}: hash mismatch: chunk {chunk['name']!r}" in reply["error"], reply
        # served from the mapped weights at once, then settled into the session the ONNX file
        # gets (model_server._maybe_settle): from then the answers are the ONNX file's, bit for bit
        status = settled(server, "2")
        assert status["settles"] == 2, status
        # the settled session's threads serve at the server's own priority (none inherited a nice value)
        nice = {tid: int(open(f"/proc/{server.proc.pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()[16])
                for tid in os.listdir(f"/proc/{server.proc.pid}/task")}
        assert set(nice.values()) == {0}, nice
        x = np.ones((2, 64), np.float32)
        inp = tgrpc.InferInput("INPUT0", [2, 64], "FP32")
        inp.set_data_from_numpy(x)
        r = tgrpc.InferenceServerClient(server.grpc).infer("v1", [inp])
        assert r.get_response().model_version == "2"
        onnx_served = OnnxModel.load("v1", "2", str(d / "v2.onnx"), "cpu", status["intra_op_threads"], warmup=False)
        assert np.array_equal(r.as_numpy("OUTPUT0"), onnx_served.run({"INPUT0": x})["OUTPUT0"])
    assert not load.errors, load.errors[:3]
    versions = [v for v, _, _ in load.records]
    assert "1" in versions and "2" in versions
    refs = {"1": str(d / "v1.onnx"), "2": str(d / "v2.onnx")}
    # under load rows share batches with other requests' rows, and a GEMM's rounding depends on
    # the batch it runs in and on prepacking (mapped or settled): close here; bit-identical above
    for version, x, out in load.records[::7]:
        np.testing.assert_allclose(out, reference(refs[version], x), rtol=1e-5, atol=1e-6)
    print(f"\nhot update: {len(load.records)} requests, 0 failed; "
          f"update file {update} B = {100 * update / full:.2f} % of {full} B")


@pytest.fixture(scope="module")
def resnet_dir(tmp_path_factory):
    """The repository's script builds resnet50.onnx and resnet50.mcp26bin (nothing downloaded)."""
    d = tmp_path_factory.mktemp("resnet")
    subprocess.run([sys.executable, "-m", "mcp26.inference.resnet50", "-o", str(d)], check=True, timeout=300,
                   capture_output=True)
    return d


def _in_netns(script: str, cwd, timeout: float) -> subprocess.CompletedProcess:
    """`script` in a new network namespace (loopback only), so the document's default ports are free."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("unshare / ip (util-linux, iproute2) not installed")
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f"cannot make a network namespace here: {probe.stderr.strip()}")
    env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    return subprocess.run(["unshare", "-n", "bash", "-c", "ip link set lo up\n" + script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


DOC_SERVE = "mcpctl serve --model resnet50.mcp26bin --enable-profiler --device {device} --qos-policy latency-critical"
DOC_BENCH = "mcp-bench -c 1000 -n 10000 -u http://localhost:8080/infer --output-format csv > mcp2026_benchmark.csv"


@pytest.mark.slow
def test_design_document_commands_literally(resnet_dir):
    """Both commands as the document writes them (`--device cpu` where it has npu:0,gpu:1: this
    machine has neither); the server maps the file, answers /infer, and mcp-bench says that
    the latency-critical server shed most of c=1000, and exits 1 for it."""
    script = f"""
{DOC_SERVE.format(device="cpu")} > serve.out 2> serve.err &
pid=$!
for i in $(seq 1 900); do grep -q '"event": "ready"' serve.out && break; sleep 0.1; done
{DOC_BENCH}
echo "bench-rc=$?"
kill -TERM $pid; wait $pid
echo "serve-rc=$?"
"""
    r = _in_netns(script, resnet_dir, 400)
    out = r.stdout
    assert "bench-rc=1" in out, (out, r.stderr[-2000:])
    assert "serve-rc=0" in out, (resnet_dir / "serve.err").read_text()[-2000:]
    assert " shed (" in r.stderr and "above --max-error-rate 1 %" in r.stderr and "overload/http-429=" in r.stderr
    import json
    ready = json.loads((resnet_dir / "serve.out").read_text().splitlines()[0])
    assert ready["model"] == "resnet50" and ready["http_port"] == 8080 and ready["load_seconds"] < 0.5
    rows = list(csv.DictReader(io.StringIO((resnet_dir / "mcp2026_benchmark.csv").read_text())))
    assert len(rows) == 1 and rows[0]["priority"] == "all" and int(rows[0]["requests"]) == 10000
    assert int(rows[0]["shed"]) > 0 and int(rows[0]["ok"]) > 0
    for key, unit, _, _ in METRICS:
        assert f"{key} ({unit})" in rows[0], key
    row = rows[0]
    assert float(row["batch_fill_ratio (ratio)"]) > 0 and float(row["compute_us_per_row (us)"]) > 0
    assert "Conv=" in row["kernel_by_op (ms)"]
    assert int(float(row["fused_nodes (nodes)"])) == 53      # every BatchNormalization folded at pack


def test_design_document_serve_command_names_the_missing_device(resnet_dir):
    """The document's command with its devices: serves where they exist; here it names the missing one
    (inference.devices, #41) and is never ready."""
    from mcp26.inference import devices
    found = devices.devices()
    try:
        devices.resolve("npu:0,gpu:1")
        pytest.skip("this machine has an NPU and a second GPU: the command would serve")
    except devices.DeviceError:
        pass
    r = _in_netns(DOC_SERVE.format(device="npu:0,gpu:1") + " --log-level warning", resnet_dir, 120)
    assert r.returncode == 2, (r.stdout[-500:], r.stderr[-1500:])
    missing = "npu:0: no NPU here" if not any(d.kind == "npu" for d in found) else "gpu:1: "
    assert f"mcpctl serve: --device {missing}" in r.stderr and f"devices: {devices.listing(found)}" in r.stderr, \
        r.stderr[-1500:]
    assert '"event": "ready"' not in r.stdout
