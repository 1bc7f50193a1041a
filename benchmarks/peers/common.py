"""What every peer of benchmarks/bench_peers.py shares: its own venv under
.cache/peers/NAME (installed from PyPI on first use, reused after), a process
started in its own session and stopped with its children, a readiness probe,
and PeerUnavailable carrying the reason a peer could not run.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


class PeerUnavailable(Exception):
    pass


def base_python() -> str:
    """The interpreter the project's venv was made from: the peers' venvs use
    the same Python (Triton's python-backend stub must match its version)."""
    exe = os.path.join(sys.base_prefix, "bin", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    return exe if os.path.exists(exe) else sys.executable


def venv_dir(root: str, name: str) -> str:
    return os.path.join(root, ".cache", "peers", name)


def venv_ready(venv: str, requirements: list[str]) -> bool:
    """True if `venv` was installed with exactly these requirements (the
    marker is written last, so a half-finished install is never taken)."""
    try:
        with open(os.path.join(venv, "mcp-peer.json")) as f:
            return json.load(f).get("requirements") == requirements
    except (OSError, ValueError):
        return False


def ensure_venv(root: str, name: str, requirements: list[str], timeout: float = 900) -> str:
    """.cache/peers/NAME with `requirements` installed; created on first use."""
    venv = venv_dir(root, name)
    if venv_ready(venv, requirements):
        return venv
    print(f"installing {name} peer into {os.path.relpath(venv, root)} (first run only): "
          f"{' '.join(requirements)} ...", flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    try:
        subprocess.run([base_python(), "-m", "venv", venv], check=True, capture_output=True, timeout=120)
        subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q", *requirements],
                       check=True, capture_output=True, timeout=timeout)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        detail = (getattr(e, "stderr", b"") or b"").decode(errors="replace")
        detail = "\n".join(line for line in detail.splitlines() if not line.startswith("WARNING"))
        raise PeerUnavailable(f"cannot install {name} into {venv}: {e} {detail[-400:]}") from None
    with open(os.path.join(venv, "mcp-peer.json"), "w") as f:
        json.dump({"requirements": requirements}, f)
    return venv


def site_packages(venv: str) -> str:
    v = sys.version_info
    return os.path.join(venv, "lib", f"python{v[0]}.{v[1]}", "site-packages")


def installed_version(venv: str, dist: str) -> str | None:
    """A distribution's version in `venv`, read from its dist-info folder."""
    sp = site_packages(venv)
    norm = dist.lower().replace("-", "_")
    try:
        for entry in os.listdir(sp):
            if entry.endswith(".dist-info") and entry.lower().startswith(norm + "-"):
                return entry[len(norm) + 1:-len(".dist-info")]
    except OSError:
        pass
    return None


def server_metadata(url: str) -> dict:
    """A KServe v2 server's metadata (GET /v2: name, version), {} if none."""
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return {}


class PeerProcess:
    """A server process in its own session, its log in a file; ready when
    `ready_url` answers 200."""

    def __init__(self, label: str, argv: list[str], ready_url: str, log_path: str,
                 env: dict | None = None, cwd: str | None = None):
        self.label, self.argv, self.ready_url, self.log_path = label, argv, ready_url, log_path
        self.env, self.cwd = env, cwd
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 120.0) -> None:
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd,
                                         env=self.env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PeerUnavailable(f"{self.label} exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.ready_url, timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise PeerUnavailable(f"{self.label} not ready after {timeout:.0f}s: {self.log_tail()}")

    def log_tail(self, n: int = 1500) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-n:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            # its own session: workers and stubs it started go with it
            try:
                os.killpg(self.proc.pid, 15)
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
            except ProcessLookupError:
                pass
