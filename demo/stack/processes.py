"""Stopping the processes a test or the demo started, whatever state they are in."""
from __future__ import annotations

import subprocess
import time
from typing import Iterable


def stop_processes(procs: Iterable[subprocess.Popen | None], grace: float = 10.0) -> None:
    """SIGTERM to each (in the order given) first, so they stop side by side; then SIGKILL
    whatever has not exited `grace` seconds after its SIGTERM."""
    running = [p for p in procs if p is not None and p.poll() is None]
    for proc in running:
        proc.terminate()
    deadline = time.monotonic() + grace
    for proc in running:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stop_process(proc: subprocess.Popen | None, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `grace` seconds."""
    stop_processes([proc], grace)
