"""A gRPC port already served is an error, not a port shared unseen.

grpcio turns SO_REUSEPORT on by default on Linux, so a second server on a port
whose holder also set it binds as well, and the kernel splits new connections
between them: a second control plane would take half the proxies. The holder
here is such a socket; each server must refuse to start, naming the port.
"""
import socket
import subprocess

import pytest

from mcp26.serving.executables import executable

pytestmark = pytest.mark.e2e


@pytest.fixture
def held_port():
    """A loopback port listened on with SO_REUSEPORT, as a grpcio server holds its port."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def _commands(tmp_path, port: int) -> dict[str, list[str]]:
    config = tmp_path / "config"
    config.mkdir()
    mcpctl = executable("mcpctl")
    return {
        "xds": [mcpctl, "xds", "serve", "--config-dir", str(config), "--port", str(port), "--admin-port", "0"],
        "epp": [mcpctl, "epp", "serve", "--config-dir", str(config), "--pool", "default/pool",
                "--grpc-port", str(port), "--grpc-frontend", "grpcio"],
        "model server": [mcpctl, "serve", "--model", "builtin:relu", "--http-port", "0",
                         "--grpc-port", str(port), "--grpc-frontend", "grpcio"],
    }


@pytest.mark.parametrize("server", ["xds", "epp", "model server"])
def test_a_second_server_on_a_grpc_port_in_use_refuses_to_start(tmp_path, held_port, server):
    cmd = _commands(tmp_path, held_port)[server]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"{server} started on port {held_port}, which another socket holds:\n{err[-2000:]}")
    assert proc.returncode != 0, out + err
    assert "cannot bind" in err and str(held_port) in err, err[-2000:]
