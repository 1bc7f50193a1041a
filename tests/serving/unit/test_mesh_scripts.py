"""mcp26.serving.executables.executable: beside the interpreter first, then PATH, then the bare name."""
import os
import sys

from mcp26.serving.executables import executable


def _tool(directory, name):
    path = directory / name
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return str(path)


def test_beside_the_interpreter_before_path(tmp_path, monkeypatch):
    venv_bin, on_path = tmp_path / "venv-bin", tmp_path / "path-bin"
    venv_bin.mkdir(), on_path.mkdir()
    beside = _tool(venv_bin, "mcpctl")
    _tool(on_path, "mcpctl")
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    monkeypatch.setenv("PATH", str(on_path))
    assert executable("mcpctl") == beside


def test_path_then_the_bare_name(tmp_path, monkeypatch):
    on_path = tmp_path / "path-bin"
    on_path.mkdir()
    found = _tool(on_path, "mcp-bench")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "nowhere" / "python"))
    monkeypatch.setenv("PATH", str(on_path))
    assert executable("mcp-bench") == found                  # a `pip install --target` bin/ on PATH
    assert executable("no-such-tool") == "no-such-tool"      # so the error names it
    assert os.path.basename(executable("mcp-bench")) == "mcp-bench"
