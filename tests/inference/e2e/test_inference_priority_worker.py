"""The priority worker (`mcpctl serve --priority-grpc-port/--priority-http-port`):
the top QoS class in a process of its own, the parent at nice 19.
Against live `mcpctl serve` processes, with the real tritonclient."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from mcp26.mesh import headers as H
from mcp26.mesh.qos import QosClass
from mcp26.demo.stack.inference_server import InferenceServer, read_pool_events, requests_served
from mcp26.demo.stack.ports import free_port, free_port_block

pytestmark = pytest.mark.e2e
TOP = {H.QOS_CLASS: QosClass.LATENCY_CRITICAL.header_value}


def _x(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 64)).astype(np.float32)


def _grpc_input(x: np.ndarray):
    inp = tgrpc.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return inp


def _http_input(x: np.ndarray):
    inp = thttp.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return inp


def _thread_nices(pid: int) -> set[int]:
    """The nice value of every thread of `pid`, read from /proc (field 19 of stat)."""
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                out.add(int(fh.read().rsplit(")", 1)[1].split()[16]))
        except (FileNotFoundError, ProcessLookupError):
            pass
    return out


def _gone(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def test_worker_serves_only_the_top_class_in_its_own_process():
    """Both of the worker's front ends answer latency-critical at level 1 with the main
    port's result, and refuse every other class (or none, or only the protocol's
    priority parameter) before any work; the main port still takes every class. The
    worker is another process, at the parent's original priority, while every parent
    thread runs at nice 19; an admin reload on the parent reaches the worker; SIGTERM
    stops both cleanly."""
    gport, hport = free_port(), free_port()
    with InferenceServer("builtin:mlp", "--qos-policy", "latency-critical", "--priority-grpc-port", str(gport),
                         "--priority-http-port", str(hport)) as server:
        worker = server.ready["priority_worker"]
        assert (worker["grpc_port"], worker["http_port"]) == (gport, hport)
        pid = worker["pid"]
        assert pid != server.proc.pid
        with open(f"/proc/{pid}/stat") as fh:
            assert int(fh.read().rsplit(")", 1)[1].split()[1]) == server.proc.pid     # its parent
        assert _thread_nices(server.proc.pid) == {19}
        assert 19 not in _thread_nices(pid)

        main = tgrpc.InferenceServerClient(server.grpc)
        prio = tgrpc.InferenceServerClient(f"127.0.0.1:{gport}")
        prio_http = thttp.InferenceServerClient(f"127.0.0.1:{hport}")
        expected = main.infer("mlp", [_grpc_input(_x(7))], headers=dict(TOP)).as_numpy("OUTPUT0")
        for _ in range(3):
            r = prio.infer("mlp", [_grpc_input(_x(7))], headers=dict(TOP))
            np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), expected)
            assert r.get_response().parameters["priority_level"].uint64_param == 1
            rh = prio_http.infer("mlp", [_http_input(_x(7))], headers=dict(TOP))
            np.testing.assert_allclose(rh.as_numpy("OUTPUT0"), expected, rtol=1e-6)
            assert rh.get_response()["parameters"]["priority_level"] == 1
        for headers in ({H.QOS_CLASS: QosClass.BATCH.header_value},
                        {H.QOS_CLASS: QosClass.INTERACTIVE.header_value}, {}):
            with pytest.raises(InferenceServerException) as e:
                prio.infer("mlp", [_grpc_input(_x(7))], headers=dict(headers))
            assert "PERMISSION_DENIED" in str(e.value.status()) and "latency-critical" in e.value.message()
            with pytest.raises(InferenceServerException) as e:
                prio_http.infer("mlp", [_http_input(_x(7))], headers=dict(headers))
            assert e.value.status() == "403" and "latency-critical" in e.value.message()
            main.infer("mlp", [_grpc_input(_x(7))], headers=dict(headers))       # the main port takes it
        # the protocol's priority parameter is the client's word, not the mesh's: refused too
        with pytest.raises(InferenceServerException):
            prio.infer("mlp", [_grpc_input(_x(7))], priority=1)

        status, body = server.admin("/admin/reload", {})
        assert status == 200 and body["version"] == "2" and body["priority_worker"]["version"] == "2", body
        r = prio.infer("mlp", [_grpc_input(_x(7))], headers=dict(TOP))
        assert r.get_response().model_version == "2"           # answered by the worker's new version
        status, body = server.admin("/admin/policy", {"qosPolicy": "balanced"})
        assert status == 200 and body["priority_worker"]["policy"]["name"] == "balanced", body
    assert server.proc.returncode == 0
    assert _gone(pid)


def test_parent_stops_when_the_worker_dies():
    """The two serve as one replica: with the worker killed, the parent stops (status 1),
    so the orchestrator restarts both."""
    with InferenceServer("builtin:mlp", "--qos-policy", "latency-critical",
                         "--priority-grpc-port", str(free_port())) as server:
        os.kill(server.ready["priority_worker"]["pid"], signal.SIGKILL)
        assert server.proc.wait(30) == 1
        assert "priority worker exited" in server.log_tail()


def test_envoy_in_front_of_replicas_routes_the_top_class_to_their_workers():
    """`--replicas 2 --envoy-port P` with priority workers: each replica runs its own
    worker (ports base + 4i), and the Envoy in front sends latency-critical requests,
    REST and gRPC, to the workers and every other class to the replicas."""
    from mcp26.inference.envoy_bootstrap import replica_ports
    base = free_port_block(8)
    listen, envoy_admin = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mcp26.mesh.cli", "serve", "--model", "builtin:mlp", "--replicas", "2",
                             "--http-port", str(base), "--grpc-port", str(base + 1),
                             "--priority-http-port", str(base + 2), "--priority-grpc-port", str(base + 3),
                             "--envoy-port", str(listen), "--envoy-admin-port", str(envoy_admin), "--drain-seconds", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        ready, _ = read_pool_events(proc, replicas=2)
        layout = replica_ports(base, base + 1, 2, priority_http_port=base + 2, priority_grpc_port=base + 3)
        assert sorted((r["http_port"], r["priority_worker"]["http_port"], r["priority_worker"]["grpc_port"])
                      for r in ready) == [(p["http"], p["priority_http"], p["priority_grpc"]) for p in layout]
        assert layout[1]["http"] == base + 4
        _wait_http(f"http://127.0.0.1:{envoy_admin}/ready")
        mains = [p["http"] for p in layout]
        workers = [p["priority_http"] for p in layout]
        before = {p: (requests_served(p, "http"), requests_served(p, "grpc")) for p in mains + workers}
        addr = f"127.0.0.1:{listen}"
        http, grpc_client = thttp.InferenceServerClient(addr), tgrpc.InferenceServerClient(addr)
        for i in range(24):
            headers = TOP if i % 2 == 0 else {H.QOS_CLASS: QosClass.STANDARD.header_value}
            http.infer("mlp", [_http_input(_x(i))], headers=dict(headers))
            grpc_client.infer("mlp", [_grpc_input(_x(i))], headers=dict(headers))
        after = {p: (requests_served(p, "http"), requests_served(p, "grpc")) for p in mains + workers}
        for k, protocol in enumerate(("http", "grpc")):
            to_workers = sum(after[p][k] - before[p][k] for p in workers)
            to_mains = sum(after[p][k] - before[p][k] for p in mains)
            assert (to_workers, to_mains) == (12, 12), protocol
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stdout.close()


def _wait_http(url: str, timeout: float = 30.0) -> None:
    import urllib.request
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"{url} not ready"
        time.sleep(0.1)


def test_worker_does_not_outlive_a_killed_parent():
    """SIGKILL gives the parent no chance to stop its worker: the kernel's parent-death
    signal does, so the worker's ports are free again for the restarted replica."""
    gport = free_port()
    with InferenceServer("builtin:mlp", "--priority-grpc-port", str(gport)) as server:
        pid = server.ready["priority_worker"]["pid"]
        server.proc.kill()
        server.proc.wait(10)
        assert _gone(pid)


def test_a_worker_port_in_use_is_a_clear_error_and_leaves_nothing_running():
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "mcp26.mesh.cli", "serve", "--model", "builtin:mlp",
                            "--http-port", str(free_port()), "--grpc-port", str(free_port()),
                            "--priority-grpc-port", str(port)], capture_output=True, text=True, timeout=90)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"mcpctl serve [priority worker]: cannot bind gRPC port 127.0.0.1:{port}" in r.stderr
    assert "priority worker exited with status 2 before it was ready" in r.stderr
    assert "Traceback" not in r.stderr
    left = subprocess.run(["pgrep", "-f", "--", f"--grpc-port {port}"], capture_output=True, text=True)
    assert left.returncode == 1, left          # 1: no process matched (2 would be a pgrep usage error)
