"""`mcpctl serve --split-under-load` end to end: under c=64 the server moves its
batches to one-thread instances whose threads the kernel reports in SCHED_IDLE,
answers computed there are the model's own, and what cannot be split is
refused or said to be off at start-up."""
from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import urllib.request

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as tgrpc

from mcp26.demo.stack.inference_server import InferenceServer
from mcp26.inference import builtin_models

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")]
SCHED_IDLE = 5          # /proc/.../stat field 41 (policy)


def status(server) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.admin_port}/admin/status", timeout=10) as r:
        return next(m for m in json.load(r)["models"] if m["name"] == "mlp")["split_under_load"]


def thread_policies(pid: int) -> dict[int, int]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = open(f"/proc/{pid}/task/{tid}/stat").read()
        except FileNotFoundError:
            continue
        out[int(tid)] = int(stat[stat.rindex(")") + 2:].split()[38])
    return out


def test_saturating_load_splits_and_the_answers_stay_the_models():
    with InferenceServer("builtin:mlp", "--split-under-load", "--intra-op-threads", "2") as server:
        before = status(server)
        assert before["width"] == 2 and not before["split"] and before["narrow_batches"] == 0
        idle_threads = [t for t, p in thread_policies(server.proc.pid).items() if p == SCHED_IDLE]
        assert len(idle_threads) == 2           # the narrow instances' threads, waiting
        bench = subprocess.run([sys.executable, "-m", "mcp26.inference.bench.cli", "-u",
                                f"http://127.0.0.1:{server.http_port}/v2/models/mlp", "-c", "64",
                                "--duration", "2", "--warmup", "64", "--input", "INPUT0:FP32:1,64",
                                "--output-format", "json"], capture_output=True, text=True, timeout=60)
        assert bench.returncode == 0, bench.stderr
        assert json.loads(bench.stdout)["rows"][0]["errors"] == 0
        during = status(server)
        assert during["changes"] >= 1 and during["narrow_batches"] > 0 and during["split"]
        # Still split (the load average moves only with arrivals): these run on the narrow
        # instances, and must be what onnxruntime itself computes.
        session = ort.InferenceSession(builtin_models.builtin_path("mlp"), providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(11)
        rows = [rng.standard_normal((1, 64)).astype(np.float32) for _ in range(16)]
        client = tgrpc.InferenceServerClient(server.grpc)

        def infer(x):
            inp = tgrpc.InferInput("INPUT0", [1, 64], "FP32")
            inp.set_data_from_numpy(x)
            return client.infer("mlp", [inp]).as_numpy("OUTPUT0")

        narrow_before = status(server)["narrow_batches"]
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            got = list(pool.map(infer, rows))
        assert status(server)["narrow_batches"] > narrow_before
        for g, x in zip(got, rows):
            np.testing.assert_allclose(g, session.run(None, {"INPUT0": x})[0], rtol=1e-4, atol=1e-5)


def test_split_under_load_refuses_instances_and_says_when_it_is_off():
    server = InferenceServer("builtin:mlp", "--split-under-load", "--instances", "2")
    with pytest.raises(RuntimeError, match="exited with 2"):
        server.start(timeout=60)
    assert "--split-under-load chooses the instances itself; leave out --instances" in server.log_tail()
    server.stop()
    with InferenceServer("builtin:mlp", "--split-under-load", "--intra-op-threads", "1") as server:
        assert "--split-under-load: off for model mlp: its session has 1 intra-op thread" in server.log_tail()
        # a one-thread session's compute thread yields its core to the front end, as a narrow one does
        assert sorted(thread_policies(server.proc.pid).values()).count(SCHED_IDLE) == 1
        with urllib.request.urlopen(f"http://127.0.0.1:{server.admin_port}/admin/status", timeout=10) as r:
            assert next(m for m in json.load(r)["models"] if m["name"] == "mlp")["split_under_load"] is None
    with InferenceServer("builtin:tiny-decoder", "--split-under-load", "--intra-op-threads", "2") as server:
        assert ("--split-under-load: off for model tiny-decoder: a decoder's KV cache is advanced by one run "
                "at a time") in server.log_tail()
