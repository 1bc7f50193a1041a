"""Regrouping end to end (inference_backend/batcher.py, "Regrouping"): two closed-loop
clients of 8 connections each against one builtin:mlp instance. Without it the two groups
tend to stay apart, each batch holding one (batches of ~8: measured 7.98-13.0 over three
runs against 4ba36ca); with it the instance waits for the answered group to come back and
batches both. Read from the server: its batches (Triton's statistics) and /admin/status."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest

from mcp26.demo.stack.inference_server import InferenceServer

pytestmark = pytest.mark.e2e


def stats(server) -> tuple[int, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/v2/models/mlp/stats", timeout=10) as r:
        s = json.load(r)["model_stats"][0]
    return s["execution_count"], s["inference_count"]


def test_two_closed_loop_clients_are_batched_together():
    with InferenceServer("builtin:mlp", "--intra-op-threads", "2") as server:
        argv = [sys.executable, "-m", "mcp26.inference.bench.cli", "-u",
                f"http://127.0.0.1:{server.http_port}/v2/models/mlp", "-c", "8", "--duration", "3",
                "--warmup", "8", "--input", "INPUT0:FP32:1,64", "--output-format", "json"]
        runs0, rows0 = stats(server)
        clients = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for _ in range(2)]
        outs = [c.communicate(timeout=60) for c in clients]
        runs1, rows1 = stats(server)
        for c, (out, err) in zip(clients, outs):
            assert c.returncode == 0, err
            assert json.loads(out)["rows"][0]["errors"] == 0
        model = next(m for m in server.admin("/admin/status")[1]["models"] if m["name"] == "mlp")
        assert model["regrouped_batches"] > 0
        assert (rows1 - rows0) / (runs1 - runs0) >= 11, (runs1 - runs0, rows1 - rows0)
