"""A wheel of the project (`pip install .`, what a user without the repo gets) holds every
module and the files read at run time, and its `mcpctl` and `mcp-bench` start. The tests
otherwise run from the editable install, whose finder maps whole folders and so would
hide a sub-package left out of pyproject.toml."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
with open(os.path.join(ROOT, "pyproject.toml"), "rb") as _fh:      # folder -> the package it installs as
    FOLDERS = {folder: package for package, folder in
               tomllib.load(_fh)["tool"]["setuptools"]["package-dir"].items()}
RUNTIME_DATA = (".c", ".h", ".lua", ".html", ".yaml", ".wit", ".mjs", ".proto")


def tracked(folder: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", folder], cwd=ROOT, capture_output=True, text=True, check=True)
    return [p for p in out.stdout.splitlines() if "/web/" not in p and os.path.isfile(os.path.join(ROOT, p))]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> str:
    if subprocess.run(["git", "rev-parse"], cwd=ROOT, capture_output=True).returncode:
        pytest.skip("not a git checkout: the tracked files are the reference")
    # Built from a copy of the tracked files: an in-tree build/ would keep files of an older build.
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for path in tracked("."):
        os.makedirs(os.path.dirname(src / path), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, path), src / path)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(src)], check=True, capture_output=True, timeout=240)
    (name,) = os.listdir(out)
    return str(out / name)


def test_wheel_holds_every_module_and_runtime_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = []
    for folder, package in FOLDERS.items():
        for path in tracked(folder):
            if path.endswith(".py") or path.endswith(RUNTIME_DATA):
                inside = package + path[len(folder):]
                if inside not in names:
                    missing.append(f"{path} (as {inside})")
    assert not missing, "left out of the wheel (pyproject.toml [tool.setuptools]):\n" + "\n".join(missing)


def test_wheel_commands_start(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                    "--target", str(target), wheel], check=True, capture_output=True, timeout=240)
    # The wheel's copy first on the path: the editable finder comes after PathFinder.
    env = dict(os.environ, PYTHONPATH=str(target))
    code = ("import inference_backend.bench.cli, scheduler.plugins.commands, mesh.cli, sys;"
            "print(inference_backend.bench.cli.__file__)")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=str(tmp_path),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(str(target)), out.stdout
    for command in ("mcpctl", "mcp-bench"):
        run = subprocess.run([sys.executable, str(target / "bin" / command), "--help"], env=env,
                             cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
        assert run.returncode == 0 and "usage" in run.stdout.lower(), (command, run.stderr[-2000:])
