"""Triton's perf_analyzer, as the tritonclient 2.50.0 wheel ships it, in a venv of its own.

The wheel's `bin/perf_analyzer` links libcudart.so.12 (PyPI: nvidia-cuda-runtime-cu12,
found through LD_LIBRARY_PATH; no GPU is needed to load it) and libb64.so.0d (not on
PyPI: Debian's libb64-0d). It goes in .cache/perf-analyzer-venv, never the project's
venv (tritonclient 2.50 would replace the 2.41 the tests use). `locate()` finds an
installed one; `install()` makes the venv first; both raise Unavailable with the reason.
"""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".cache", "perf-analyzer-venv")
VERSION = "2.50.0"


class Unavailable(Exception):
    pass


def _env() -> dict:
    libs = glob.glob(os.path.join(VENV, "lib", "python*", "site-packages", "nvidia", "cuda_runtime", "lib"))
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(libs + [env.get("LD_LIBRARY_PATH", "")]).strip(os.pathsep)
    return env


def locate() -> tuple[str, dict]:
    """(perf_analyzer's path, the environment to run it in), or Unavailable(reason)."""
    binary = os.path.join(VENV, "bin", "perf_analyzer")
    if not os.path.exists(binary):
        raise Unavailable(f"perf_analyzer is not installed in {VENV} (python -m benchmarks perf_analyzer installs it: "
                          f"tritonclient[all]=={VERSION} and nvidia-cuda-runtime-cu12 from PyPI)")
    env = _env()
    missing = [line.split()[0] for line in subprocess.run(["ldd", binary], capture_output=True, text=True,
                                                            env=env).stdout.splitlines() if "not found" in line]
    if missing:
        hint = " (libb64.so.0d: Debian's libb64-0d, `apt-get install libb64-0d`)" if any("b64" in m for m in missing) else ""
        raise Unavailable(f"perf_analyzer cannot load {', '.join(missing)}{hint}")
    return binary, env


def install() -> tuple[str, dict]:
    try:
        return locate()
    except Unavailable:
        pass
    pip = os.path.join(VENV, "bin", "pip")
    try:
        if not os.path.exists(pip):
            subprocess.run([sys.executable, "-m", "venv", VENV], check=True, capture_output=True, timeout=300)
        subprocess.run([pip, "install", "-q", f"tritonclient[all]=={VERSION}", "nvidia-cuda-runtime-cu12"],
                       check=True, capture_output=True, text=True, timeout=900)
    except subprocess.CalledProcessError as e:
        raise Unavailable(f"installing tritonclient {VERSION} failed: {(e.stderr or '')[-400:]}") from None
    except subprocess.TimeoutExpired:
        raise Unavailable(f"installing tritonclient {VERSION} took too long") from None
    return locate()


_NUM = r"([0-9.]+)"


def run(binary: str, env: dict, model: str, url: str, protocol: str, concurrency: int,
        window_ms: int = 2000, timeout: float = 180) -> dict:
    """One closed-loop point: client throughput and latency percentiles (ms), and the
    server-side averages perf_analyzer reads from ModelStatistics (us)."""
    cmd = [binary, "-m", model, "-u", url, "-i", protocol, "--concurrency-range", str(concurrency),
           "--measurement-interval", str(window_ms), "-s", "100", "--max-trials", "6"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    out = p.stdout + p.stderr
    if p.returncode != 0:
        raise RuntimeError(f"perf_analyzer exited {p.returncode}: {out[-800:]}")

    def grab(pattern: str):
        m = re.search(pattern, out)
        return float(m.group(1)) if m else None

    server = re.search(r"Avg request latency: (\d+) usec \(overhead (\d+) usec \+ queue (\d+) usec \+ compute input "
                       r"(\d+) usec \+ compute infer (\d+) usec \+ compute output (\d+) usec\)", out)
    return {
        "rps": grab(r"Throughput: " + _NUM + " infer/sec"),
        "p50": _ms(grab(r"p50 latency: " + _NUM + " usec")), "p99": _ms(grab(r"p99 latency: " + _NUM + " usec")),
        "server_inference_count": grab(r"Inference count: " + _NUM),
        "server_execution_count": grab(r"Execution count: " + _NUM),
        "server_request_us": dict(zip(("total", "overhead", "queue", "compute_input", "compute_infer",
                                       "compute_output"), map(int, server.groups()))) if server else None,
        "output": out,
    }


def _ms(us):
    return None if us is None else round(us / 1000, 3)
