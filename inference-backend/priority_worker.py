"""The priority worker: the top QoS class served by a process of its own.

`mcpctl serve --priority-grpc-port P [--priority-http-port Q]` starts it.

Why a process. Under a saturating low-priority load the bottleneck of this
Python server is its front end, not the model: the event loop that parses and
encodes every request (grpc.aio or aiohttp) runs a core at 100%. The
batcher's priority levels and reserved lane act only once a request reaches
the queue; before that, a top-class request on the same loop waits behind the
low ones, and on a second front end in the same process it waits for the GIL
the loop holds. Thread priorities cannot fix that: a GIL holder at a low
priority that the OS preempts keeps the GIL (priority inversion). Measured on
2 cores (README, "Priority worker"): with the high stream on its own port in
the same process, high p99 under load was 5-7x alone on gRPC.

A second process has its own GIL, event loop and ONNX Runtime session (a
model instance reserved for the class, as Triton's instance_group), and the
OS can rank it: once the worker is started the parent lowers every one of its
own threads to nice 19, so when both want a core the worker gets it, and
while the worker is idle the parent has all the cores. Nice ranks threads
within one scheduling group (autogroup or cgroup): the worker stays in the
parent's session and cgroup, so the ranking is between the two of them only
and nothing else on the host is affected.

The worker is `mcpctl serve` itself, with the parent's model, name, policy,
session key, labels and device, plus `--serve-class latency-critical` (both
of its front ends refuse any other class, before decoding), one intra-op
thread, and a loopback admin port the parent forwards reload and policy calls
to. It watches the same policy and model files. The two live and die
together: the parent stops the worker when it stops, and stops (exit status
1) when the worker dies.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys

from mcp26.mesh.qos import QosClass

log = logging.getLogger("mcp26.inference")

SERVE_CLASS = QosClass.LATENCY_CRITICAL
PARENT_NICE = 19            # the lowest CPU priority: the parent's threads yield to the worker's
WORKER_INTRA_OP_THREADS = 1  # one top-class batch at a time, on the thread that runs it


def lower_own_priority(nice: int = PARENT_NICE) -> int:
    """Set every thread of this process to `nice` (Linux nice is per thread, and new
    threads inherit their creator's), so threads started later follow. -> threads set."""
    count = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)
            count += 1
        except (ProcessLookupError, PermissionError):
            pass            # a thread that just ended
    return count


def _terminate_with_parent() -> None:
    """In the child before exec: SIGTERM it if the parent dies, even by SIGKILL,
    so a worker never outlives its replica (and keeps its ports)."""
    import ctypes
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def bind_to_parent() -> None:
    """In a started worker, first thing: SIGTERM on the parent's death (as _terminate_with_parent,
    set after exec); if the parent is already gone, stop now."""
    parent = os.getppid()
    _terminate_with_parent()
    if parent == 1 or os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


class PriorityWorker:
    """The child process: started, awaited until ready, forwarded to, stopped. (Also the
    handle of a `--workers` serving worker: `label` names it in logs and errors.)"""

    def __init__(self, argv: list[str], label: str = "priority worker", preexec: bool = True,
                 pass_fds: tuple = ()):
        self.argv = argv                    # `mcpctl serve ...` arguments for the worker
        self.label = label
        # False: the child sets its own parent-death signal (bind_to_parent). A parent that
        # already runs gRPC's threads must not run Python between fork and exec: a lock one of
        # them held at the fork (malloc's) would stay held in the child.
        self.preexec = preexec
        self.pass_fds = pass_fds            # descriptors the child inherits (a worker's shared sockets)
        self.proc: asyncio.subprocess.Process | None = None
        self.ready: dict = {}               # the worker's ready event (its ports)
        self._reader: asyncio.Task | None = None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc else None

    async def start(self) -> None:
        # Same session and cgroup as the parent (no setsid): see the module docstring.
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "mcp26.mesh.cli", *self.argv, stdout=asyncio.subprocess.PIPE,
            preexec_fn=_terminate_with_parent if self.preexec else None, pass_fds=self.pass_fds)
        log.info("%s: pid %d (%s)", self.label, self.proc.pid, " ".join(self.argv))

    async def wait_ready(self, timeout: float = 120.0) -> dict:
        """Read the worker's stdout until its ready event; raise OSError if it exits first."""
        async def read_until_ready() -> dict:
            while True:
                line = await self.proc.stdout.readline()
                if not line:
                    await self.proc.wait()
                    raise OSError(f"{self.label} exited with status {self.proc.returncode} before it was ready")
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict) and event.get("event") == "ready":
                    return event
        try:
            self.ready = await asyncio.wait_for(read_until_ready(), timeout)
        except asyncio.TimeoutError:
            raise OSError(f"{self.label} not ready after {timeout:.0f}s") from None
        self._reader = asyncio.create_task(self._drain_stdout())
        return self.ready

    async def _drain_stdout(self) -> None:
        while await self.proc.stdout.readline():
            pass

    async def get(self, path: str) -> tuple[int, str]:
        """GET from the worker's admin listener -> (HTTP status, body text)."""
        import aiohttp
        url = f"http://127.0.0.1:{self.ready['admin_port']}{path}"
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
                async with s.get(url) as r:
                    return r.status, await r.text()
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            return 502, f"{self.label} did not answer {path}: {type(e).__name__}: {e}"

    async def forward(self, path: str, doc: dict) -> tuple[int, dict]:
        """POST an admin call to the worker -> (HTTP status, body)."""
        import aiohttp
        url = f"http://127.0.0.1:{self.ready['admin_port']}{path}"
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
                async with s.post(url, json=doc) as r:
                    return r.status, await r.json()
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            return 502, {"error": f"{self.label} did not answer {path}: {type(e).__name__}: {e}"}

    def terminate(self) -> None:
        """Begin the worker's drain (SIGTERM), beside the parent's own."""
        if self.proc and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)

    async def stop(self, timeout: float = 15.0) -> None:
        if not self.proc:
            return
        self.terminate()
        try:
            await asyncio.wait_for(self.proc.wait(), timeout)
        except asyncio.TimeoutError:
            log.warning("%s %d did not stop in %.0fs; killed", self.label, self.proc.pid, timeout)
            self.proc.kill()
            await self.proc.wait()
        if self._reader:
            self._reader.cancel()
