"""`mcpctl serve` refusing a file it cannot use: a model onnxruntime cannot serve (one line
naming the file and onnxruntime's reason), a session key it cannot read (naming the flag);
exit 2, no traceback, never ready."""
from __future__ import annotations

import subprocess

import pytest
from onnx import TensorProto, helper

from mcp26.demo.stack.ports import free_port
from mcp26.serving.executables import executable

pytestmark = pytest.mark.e2e


def _model(nodes, inputs, outputs) -> bytes:
    return helper.make_model(helper.make_graph(nodes, "bad", inputs, outputs),
                             opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


SCALAR = [helper.make_tensor_value_info(n, TensorProto.FLOAT, []) for n in ("start", "limit", "delta")]
BAD = {
    # not a protobuf at all
    "garbage": (b"not an onnx model", "INVALID_PROTOBUF"),
    # a node reading a tensor nothing produces
    "dangling input": (_model([helper.make_node("Relu", ["nowhere"], ["OUTPUT0"])],
                              [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["b", 4])],
                              [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["b", 4])]),
                       "onnxruntime cannot load it"),
    # loads, but its warm-up run on zero inputs fails (Range with delta 0)
    "fails warm-up": (_model([helper.make_node("Range", ["start", "limit", "delta"], ["OUTPUT0"])], SCALAR,
                             [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["n"])]),
                      "warm-up run on zero inputs failed"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_model_onnxruntime_cannot_serve_is_refused_in_one_line(tmp_path, case):
    data, reason = BAD[case]
    path = tmp_path / "model.onnx"
    path.write_bytes(data)
    http, grpc = free_port(), free_port()
    p = subprocess.run([executable("mcpctl"), "serve", "--model", str(path), "--http-port", str(http),
                        "--grpc-port", str(grpc)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    line = f"mcpctl serve: model file {path}: "
    assert line in p.stderr and reason in p.stderr, p.stderr
    assert not any("ready" in out for out in p.stdout.splitlines()), p.stdout


def test_an_unreadable_session_key_file_is_refused_by_flag(tmp_path):
    missing = tmp_path / "no-such-key"
    p = subprocess.run([executable("mcpctl"), "serve", "--model", "builtin:relu", "--session-key-file", str(missing),
                        "--http-port", str(free_port()), "--grpc-port", str(free_port())],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    assert f"mcpctl serve: --session-key-file {missing}: No such file or directory" in p.stderr, p.stderr


@pytest.mark.parametrize("data,reason", [
    (b"PK\x03\x04" + bytes(100), "bad magic b'PK\\x03\\x04\\x00\\x00\\x00\\x00': not a .mcp26bin file"),
    (b"MCP26BIN" + bytes(20), "truncated: 28 bytes, shorter than the 64-byte header"),
])
def test_a_bad_mcp26bin_is_refused_in_one_line(tmp_path, data, reason):
    path = tmp_path / "model.mcp26bin"
    path.write_bytes(data)
    p = subprocess.run([executable("mcpctl"), "serve", "--model", str(path), "--http-port", str(free_port()),
                        "--grpc-port", str(free_port())], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert f"mcpctl serve: {path}: {reason}" in p.stderr, p.stderr
    assert not any("ready" in out for out in p.stdout.splitlines()), p.stdout
