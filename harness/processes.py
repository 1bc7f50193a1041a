"""Stopping the processes a test started, whatever state they are in."""
from __future__ import annotations

import subprocess


def stop_process(proc: subprocess.Popen | None, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `grace` seconds."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
