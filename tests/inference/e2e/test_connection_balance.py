"""`mcpctl serve --workers 2` balances connections exactly (connection_balance.py):
one listening socket shared by the workers, each holding at most one connection more
than the other, on the REST and the gRPC port; short connections one after another
go round them; a worker that stops accepting leaves its share to the others after a
moment instead of stranding it; `--connection-balance kernel` keeps SO_REUSEPORT.
Which process holds a connection is read from /proc (the socket inodes in each
worker's fd table against /proc/net/tcp), not from anything the server says."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import grpc
import pytest

from mcp26.demo.stack.inference_server import InferenceServer
from mcp26.demo.stack.ports import free_port

pytestmark = pytest.mark.e2e

BODY = b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,256],"data":[' + b",".join([b"1"] * 256) + b']}]}'
REQUEST = (b"POST /v2/models/relu/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
           b"Content-Length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY)
ESTABLISHED, LISTEN = "01", "0A"


def _sockets(port: int, state: str) -> set[str]:
    """Inodes of the TCP sockets with local `port` in `state`."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            for line in list(fh)[1:]:
                f = line.split()
                if int(f[1].rsplit(":", 1)[1], 16) == port and f[3] == state:
                    out.add(f[9])
    return out


def _inodes(pid: int) -> set[str]:
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(link[8:-1])
    return out


def _held(pids: list[int], port: int) -> list[int]:
    """Connections to `port` each process holds."""
    conns = _sockets(port, ESTABLISHED)
    return [len(conns & _inodes(p)) for p in pids]


def _infer(sock: socket.socket) -> bytes:
    """One keep-alive REST infer on `sock`; the answer's head (a 200)."""
    sock.sendall(REQUEST)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200"), data[:300]
    length = int(next(v for k, v in (h.split(b":", 1) for h in head.split(b"\r\n")[1:])
                      if k.strip().lower() == b"content-length"))
    while len(body) < length:
        body += sock.recv(65536)
    return head


def _wait_held(pids: list[int], port: int, want: list[int], timeout: float = 5.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        held = _held(pids, port)
        if sorted(held) == sorted(want) or time.monotonic() > deadline:
            return held
        time.sleep(0.05)


def test_rest_and_grpc_connections_split_evenly_and_short_ones_go_round():
    with InferenceServer("builtin:relu", "--workers", "2", "--name", "relu") as server:
        pids = server.ready["workers"]
        # one listening socket for each port, in both workers' fd tables
        for port in (server.http_port, server.grpc_port):
            listening = _sockets(port, LISTEN)
            assert len(listening) == 1 and all(listening <= _inodes(p) for p in pids), (port, listening)

        socks = []
        try:
            for _ in range(10):                  # opened together, kept open, each answered
                socks.append(socket.create_connection(("127.0.0.1", server.http_port), timeout=10))
            for s in socks:
                _infer(s)
            assert _wait_held(pids, server.http_port, [5, 5]) == [5, 5]
            socks.append(socket.create_connection(("127.0.0.1", server.http_port), timeout=10))
            _infer(socks[-1])
            assert sorted(_held(pids, server.http_port)) == [5, 6]
        finally:
            for s in socks:
                s.close()

        channels = [grpc.insecure_channel(server.grpc, options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(4)]
        try:
            for ch in channels:                  # a connection each (no shared subchannel pool)
                grpc.channel_ready_future(ch).result(timeout=10)
            assert _wait_held(pids, server.grpc_port, [2, 2]) == [2, 2]
        finally:
            for ch in channels:
                ch.close()

        # short connections one after another: ties go to the worker that has accepted fewer
        _wait_held(pids, server.http_port, [0, 0])
        before = [int(x) for x in _served_per_worker(server)]
        for _ in range(12):
            with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as s:
                _infer(s)
            _wait_held(pids, server.http_port, [0, 0])
        after = [int(x) for x in _served_per_worker(server)]
        # every connection carried one infer, so the counts are connections each worker accepted
        assert sum(after) - sum(before) == 12 and abs(after[0] - after[1]) <= 1, (before, after)


def _served_per_worker(server: InferenceServer) -> list[float]:
    """OK REST infers per worker, from the admin port's merged /metrics (label worker="i")."""
    import urllib.request
    from prometheus_client.parser import text_string_to_metric_families
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.admin_port}/metrics", timeout=10).read().decode()
    per = {"0": 0.0, "1": 0.0}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if (s.name == "mcp_inference_requests_total" and s.labels.get("code") == "OK"
                    and s.labels.get("protocol") == "http"):
                per[s.labels["worker"]] += s.value
    return [per["0"], per["1"]]


def test_a_worker_that_stops_accepting_does_not_strand_connections():
    with InferenceServer("builtin:relu", "--workers", "2", "--name", "relu") as server:
        pids = server.ready["workers"]
        os.kill(pids[1], signal.SIGSTOP)         # as a worker stuck in a long pause would be
        socks = []
        try:
            t0 = time.monotonic()
            for _ in range(4):
                socks.append(socket.create_connection(("127.0.0.1", server.http_port), timeout=10))
                _infer(socks[-1])
            took = time.monotonic() - t0
            assert _held(pids, server.http_port) == [4, 0]
            assert took < 2.0, f"4 answers took {took:.2f}s with one worker stopped"
        finally:
            os.kill(pids[1], signal.SIGCONT)
            for s in socks:
                s.close()


def test_kernel_balance_keeps_a_socket_per_worker():
    with InferenceServer("builtin:relu", "--workers", "2", "--name", "relu", "--connection-balance", "kernel") as server:
        pids = server.ready["workers"]
        listening = _sockets(server.http_port, LISTEN)
        assert len(listening) == 2 and [len(listening & _inodes(p)) for p in pids] == [1, 1]
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as s:
            _infer(s)


def test_a_port_in_use_is_refused_naming_it():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "mcp26.mesh.cli", "serve", "--model", "builtin:relu", "--workers", "2",
                               "--http-port", str(port), "--grpc-port", str(free_port())],
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert f"cannot bind REST port 127.0.0.1:{port}" in proc.stderr, proc.stderr[-2000:]
