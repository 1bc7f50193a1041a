"""`mcpctl serve --workers 2`: two processes on the same REST and gRPC ports
(one shared socket each: test_connection_balance.py), kept coherent - both answer, an admin reload reaches both,
statistics on either protocol are the sum over both, the admin /metrics holds
every worker's series, and a dead worker stops the server. Against a live
`mcpctl serve`, with the real tritonclient."""
from __future__ import annotations

import os
import signal
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from prometheus_client.parser import text_string_to_metric_families

from mcp26.demo.stack.inference_server import InferenceServer

pytestmark = pytest.mark.e2e


def _infer_on_new_connection(server: InferenceServer, rows: int = 1) -> dict:
    """One REST infer on a connection of its own (connections go round the workers)."""
    client = thttp.InferenceServerClient(server.http)
    try:
        x = np.ones((rows, 64), np.float32)
        inp = thttp.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return client.infer("mlp", [inp]).get_response()
    finally:
        client.close()


def _per_worker_ok(metrics_text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(metrics_text):
        for s in fam.samples:
            if s.name == "mcp_inference_requests_total" and s.labels.get("code") == "OK":
                out[s.labels["worker"]] = out.get(s.labels["worker"], 0) + s.value
    return out


def test_two_workers_answer_reload_together_and_sum_their_statistics():
    with InferenceServer("builtin:mlp", "--workers", "2") as server:
        pids = server.ready["workers"]
        assert len(pids) == 2 and pids[0] == server.proc.pid
        n = 40
        for _ in range(n):
            _infer_on_new_connection(server, rows=2)

        # both processes answered (40 connections one after another go round the two)
        status, _ = server.admin("/admin/status")
        assert status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{server.admin_port}/metrics", timeout=10) as r:
            per_worker = _per_worker_ok(r.read().decode())     # parses: one TYPE per family
        assert set(per_worker) == {"0", "1"} and all(v > 0 for v in per_worker.values()), per_worker
        assert sum(per_worker.values()) == n

        # statistics are the sum over both, whichever worker answers the question
        for _ in range(3):
            doc = thttp.InferenceServerClient(server.http).get_inference_statistics("mlp")["model_stats"][0]
            assert doc["inference_count"] == 2 * n and doc["inference_stats"]["success"]["count"] == n
            g = tgrpc.InferenceServerClient(server.grpc)
            gdoc = g.get_inference_statistics("mlp", as_json=True)["model_stats"][0]
            g.close()
            assert int(gdoc["inference_count"]) == 2 * n
            assert sum(int(b["compute_infer"]["count"]) for b in gdoc["batch_stats"]) == int(gdoc["execution_count"])

        # a reload through the admin port reaches both workers: every connection sees version 2
        status, out = server.admin("/admin/reload", {})
        assert status == 200 and out["version"] == "2" and [w["version"] for w in out["workers"]] == ["2"]
        versions = {_infer_on_new_connection(server)["model_version"] for _ in range(20)}
        assert versions == {"2"}


def _status(url: str, body: bytes | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_worker_is_not_ready_until_the_first_has_joined_it():
    """The workers share the ports, and a readiness probe reaches any of them: a worker that
    said ready once loaded answered 200 while the first was still waiting for the others (and
    answered 503 to what came next). Worker 1 alone: loaded (its ready event, for the first),
    but not ready, on REST and gRPC, until the first hands it its peers."""
    with InferenceServer("builtin:relu", "--workers", "2", "--worker-index", "1") as worker:
        admin = worker.admin_port
        assert _status(f"http://{worker.http}/v2/health/ready") == 503
        assert _status(f"http://{worker.http}/v2/health/live") == 200
        client = tgrpc.InferenceServerClient(worker.grpc)
        try:
            assert client.is_server_ready() is False
            assert _status(f"http://127.0.0.1:{admin}/admin/workers", b'{"peer_admin_ports": [1]}') == 200
            assert _status(f"http://{worker.http}/v2/health/ready") == 200
            assert client.is_server_ready() is True
        finally:
            client.close()


def test_a_dead_worker_stops_the_server():
    with InferenceServer("builtin:mlp", "--workers", "2") as server:
        os.kill(server.ready["workers"][1], signal.SIGKILL)
        deadline = time.monotonic() + 15
        while server.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.proc.returncode == 1, server.log_tail()


def test_workers_go_when_the_first_is_killed():
    """The others set their parent-death signal themselves (no Python between fork and exec
    in a parent running gRPC's threads): SIGKILL of the first leaves no worker holding the ports."""
    with InferenceServer("builtin:mlp", "--workers", "2") as server:
        other = server.ready["workers"][1]
        server.proc.kill()
        deadline = time.monotonic() + 15
        while os.path.exists(f"/proc/{other}") and time.monotonic() < deadline:
            with open(f"/proc/{other}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.1)
        else:
            assert not os.path.exists(f"/proc/{other}"), "worker 1 outlived the first worker"


@pytest.mark.parametrize("model, flags, why", [
    # a repository load / unload would reach only the worker the connection landed on
    ("builtin:mlp", ["--model-control-mode", "explicit"], "--model-control-mode explicit needs --workers 1"),
    # a sequence's KV cache lives in one process
    ("builtin:tiny-decoder", [], "cannot serve a decoder model"),
])
def test_workers_refuse_what_one_process_must_hold(model, flags, why):
    server = InferenceServer(model, "--workers", "2", *flags)
    with pytest.raises(RuntimeError, match="exited with 2"):
        server.start(timeout=60)
    assert why in server.log_tail()
    server.stop()
