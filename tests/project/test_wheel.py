"""The wheel a user installs: built from a clean copy of the checkout (`make wheel`), installed
into a fresh venv outside the repository beside PyPI's `scheduler` distribution, and run from a
directory that is not the checkout. The other tests run from the editable install, whose finder
maps whole folders and so would hide a sub-package or a data file left out of pyproject.toml."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
import zipfile

import pytest

from harness.browser import Browser, missing as browser_missing
from harness.paths import ROOT
from mcp26.demo.stack.ports import free_port, wait_port
from mcp26.demo.stack.processes import stop_process

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

with open(ROOT / "pyproject.toml", "rb") as _fh:
    _SETUPTOOLS = tomllib.load(_fh)["tool"]["setuptools"]
FOLDERS = {folder: package for package, folder in _SETUPTOOLS["package-dir"].items()}  # folder -> package
RUNTIME_DATA = (".c", ".h", ".lua", ".html", ".yaml", ".wit", ".proto")
BUILT = ("wasm-filters/build/header_contract.wasm", "xds-server/console/web/dist/console.js")
WEB = "xds-server/console/web"


def checkout_files() -> list[str]:
    """What a clean clone of this working tree holds: tracked files and new ones git does not ignore."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return [p for p in out.stdout.splitlines() if (ROOT / p).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> str:
    if subprocess.run(["git", "rev-parse"], cwd=ROOT, capture_output=True).returncode:
        pytest.skip("not a git checkout: the tracked files are the reference")
    src, out = tmp_path_factory.mktemp("clone"), tmp_path_factory.mktemp("dist")
    for path in checkout_files():
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, src / path)
    # The checkout's venv and npm packages stand in for `make install` in the clone; -o keeps make
    # from reinstalling either (which would point the editable install at the clone).
    (src / ".venv").symlink_to(ROOT / ".venv")
    (src / WEB / "node_modules").symlink_to(ROOT / WEB / "node_modules")
    run = subprocess.run(["make", "-s", "-C", str(src), "wheel", "-o", ".venv/.installed",
                          "-o", f"{WEB}/node_modules/.installed"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (name,) = [n for n in os.listdir(src / "dist") if n.endswith(".whl")]
    shutil.copy2(src / "dist" / name, out / name)
    return str(out / name)


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A fresh venv outside the checkout with the wheel (and its dependencies from the package
    index) and PyPI's `scheduler`, whose top-level name this project's wheel no longer takes."""
    home = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(home)], check=True, timeout=120)
    pip = subprocess.run([str(home / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                          "scheduler", wheel], capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, pip.stderr[-3000:]
    return home


@pytest.fixture
def away(tmp_path):
    """A working directory that is not the checkout, with an environment that does not point into it."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return tmp_path, env


def test_the_wheel_has_one_import_root_and_every_runtime_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    roots = {n.split("/")[0] for n in names}
    assert {r for r in roots if not r.endswith(".dist-info")} == {"mcp26"}, roots
    missing = []
    for path in checkout_files():
        folder = path.split("/")[0]
        if folder in FOLDERS and "/web/" not in path and (path.endswith(".py") or path.endswith(RUNTIME_DATA)):
            inside = FOLDERS[folder].replace(".", "/") + path[len(folder):]
            if inside not in names:
                missing.append(f"{path} (as {inside})")
    for path in BUILT:
        folder = path.split("/")[0]
        if FOLDERS[folder].replace(".", "/") + path[len(folder):] not in names:
            missing.append(f"{path} (built by make wheel)")
    assert not missing, "left out of the wheel (pyproject.toml [tool.setuptools]):\n" + "\n".join(missing)
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "Name: mcp26-mesh" in meta and "License-Expression: Apache-2.0" in meta, meta[:800]
    assert not any(line.startswith("Requires-Dist: grpcio-tools") and "extra ==" not in line
                   for line in meta.splitlines()), "grpcio-tools is a build-time tool"


def test_it_installs_beside_pypi_scheduler(venv, away):
    cwd, env = away
    code = ("import scheduler, mcp26.scheduler, mcp26.mesh.cli, json;"
            "print(json.dumps([scheduler.__file__, mcp26.scheduler.__file__, mcp26.mesh.cli.__file__]))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    theirs, ours, cli = json.loads(out.stdout)
    site = str(venv / "lib")
    assert theirs.startswith(site) and theirs.endswith("scheduler/__init__.py") and "mcp26" not in theirs
    assert ours.startswith(site) and "/mcp26/scheduler/" in ours and cli.startswith(site)
    check = subprocess.run([str(venv / "bin" / "pip"), "check"], cwd=cwd, env=env, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout


def _mcpctl(venv, cwd, env, *args, timeout=120):
    return subprocess.run([str(venv / "bin" / "mcpctl"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_validate_and_wasm_inspect_run_from_elsewhere(venv, away):
    cwd, env = away
    (cwd / "good.yaml").write_text(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: r, namespace: default}\n"
        "spec:\n  hosts: [reviews]\n  http:\n  - route:\n    - destination: {host: reviews}\n")
    (cwd / "bad.yaml").write_text(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: r, namespace: default}\n"
        "spec:\n  hosts: [reviews]\n  http:\n  - route:\n    - destination: {host: reviews, port: {number: 0}}\n")
    good = _mcpctl(venv, cwd, env, "validate", "good.yaml")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "unavailable" not in good.stderr, good.stderr          # every sub-command's part imports
    bad = _mcpctl(venv, cwd, env, "validate", "bad.yaml")
    assert bad.returncode == 1 and "bad.yaml:8" in bad.stdout + bad.stderr, bad.stdout + bad.stderr
    inspect = _mcpctl(venv, cwd, env, "wasm", "inspect")
    assert inspect.returncode == 0, inspect.stderr
    assert str(venv / "lib") in inspect.stdout and "proxy_abi_version_0_2_1" in inspect.stdout, inspect.stdout
    bench = subprocess.run([str(venv / "bin" / "mcp-bench"), "--help"], cwd=cwd, env=env,
                           capture_output=True, text=True, timeout=60)
    assert bench.returncode == 0 and "usage" in bench.stdout.lower(), bench.stderr


def _start(argv, cwd, env, port, log):
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_port(port, timeout=90)
    except Exception:
        stop_process(proc)
        raise AssertionError(open(log.name).read()[-3000:])
    return proc


def _wait_ready(url, timeout=90):
    """The port opens before the model is loaded: ready is KServe's /v2/health/ready answering 200."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError):
            pass
        assert time.monotonic() < deadline, f"{url} not ready in {timeout} s"
        time.sleep(0.2)


def test_serve_builtin_relu_answers_from_elsewhere(venv, away):
    cwd, env = away
    http, grpc = free_port(), free_port()
    with open(cwd / "serve.log", "w") as log:
        proc = _start([str(venv / "bin" / "mcpctl"), "serve", "--model", "builtin:relu", "--http-port", str(http),
                       "--grpc-port", str(grpc), "--drain-seconds", "0"], cwd, env, http, log)
    try:
        data = [(-1.5, 0.0, 2.5, -3.0)[i % 4] for i in range(256)]       # builtin:relu is FP32 [-1, 256]
        body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 256], "datatype": "FP32",
                                       "data": data}]}).encode()
        _wait_ready(f"http://127.0.0.1:{http}/v2/health/ready")
        req = urllib.request.Request(f"http://127.0.0.1:{http}/v2/models/relu/infer", data=body,
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            answer = json.load(r)
        (out,) = answer["outputs"]
        assert out["data"] == [max(x, 0.0) for x in data], answer
    finally:
        stop_process(proc)


def test_console_page_renders_from_elsewhere(venv, away):
    cwd, env = away
    (cwd / "config").mkdir()
    ads, admin, console = free_port(), free_port(), free_port()
    with open(cwd / "xds.log", "w") as log:
        xds = _start([str(venv / "bin" / "mcpctl"), "xds", "serve", "--config-dir", "config", "--port", str(ads),
                      "--admin-port", str(admin)], cwd, env, admin, log)
    try:
        with open(cwd / "console.log", "w") as log:
            page = _start([str(venv / "bin" / "mcpctl"), "console", "--port", str(console),
                           "--xds-admin", f"http://127.0.0.1:{admin}"], cwd, env, console, log)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{console}/console.js", timeout=10) as r:
                bundle = r.read()
            site_bundle = next((venv / "lib").glob("python3*/site-packages/mcp26/xds/console/web/dist/console.js"))
            assert bundle == site_bundle.read_bytes() and len(bundle) > 10_000
            why = browser_missing()
            if why:
                pytest.skip(f"the page's script is served; rendering it needs a browser: {why}")
            with Browser() as b:
                assert b.goto(url=f"http://127.0.0.1:{console}/") == 200
                shown = b.wait_text(selector="#proxies", text="no proxy connected")
                assert "loading" not in shown
        finally:
            stop_process(page)
    finally:
        stop_process(xds)
