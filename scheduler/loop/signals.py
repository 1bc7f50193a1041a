"""Signals, each from a real source with its age (scheduler/decisions.py).

Per replica: the model server's `GET /v1/load` (inference-backend/README.md "Load
for the Endpoint Picker"); memory from, in order, NVML (a GPU is present and
nvidia-ml-py loads), the replica process's cgroup (memory.current / memory.max,
when the loop knows its PID and the cgroup has a limit), or the KV-cache budget
(kv_cache_bytes / kv_cache_capacity_bytes) -- `memory_source` names which.
Per flow: the kernel's samples through the shared-memory ring (flows.py).
"""
from __future__ import annotations

import asyncio
import time

import aiohttp

from mcp26.mesh import qos as Q
from mcp26.scheduler.decisions import ReplicaSignals

_LEVEL_CLASS = {str(c.priority_level): c.header_value for c in Q.QosClass}


def _nvml():
    """The NVML module when a GPU is present, else None (tried once)."""
    global _NVML
    if _NVML is False:
        try:
            import pynvml
            pynvml.nvmlInit()
            _NVML = pynvml if pynvml.nvmlDeviceGetCount() > 0 else None
        except Exception:       # no library, no driver, no device: not this source
            _NVML = None
    return _NVML


_NVML = False


def nvml_fraction(pid: int | None) -> float | None:
    nv = _nvml()
    if nv is None:
        return None
    h = nv.nvmlDeviceGetHandleByIndex(0)
    total = nv.nvmlDeviceGetMemoryInfo(h).total
    if pid is None:
        return nv.nvmlDeviceGetMemoryInfo(h).used / total
    used = sum(p.usedGpuMemory or 0 for p in nv.nvmlDeviceGetComputeRunningProcesses(h) if p.pid == pid)
    return used / total


def cgroup_fraction(pid: int | None, root: str = "/sys/fs/cgroup") -> float | None:
    """memory.current / memory.max of the process's cgroup (v2); None without a limit."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            path = next((line.split(":", 2)[2].strip() for line in f if line.startswith("0::")), None)
        if path is None:
            return None
        base = root + path.rstrip("/")
        with open(base + "/memory.max") as f:
            limit = f.read().strip()
        if limit == "max":
            return None
        with open(base + "/memory.current") as f:
            return int(f.read()) / int(limit)
    except (OSError, ValueError):
        return None


def replica_signals(endpoint: str, load: dict, age_ms: float, pid: int | None = None) -> ReplicaSignals:
    queue: dict[str, int] = {}
    for m in load.get("models") or []:
        for level, n in (m.get("waiting_by_priority_level") or {}).items():
            cls = _LEVEL_CLASS.get(str(level), f"level-{level}")
            queue[cls] = queue.get(cls, 0) + int(n)
    memory, source = nvml_fraction(pid), "nvml"
    if memory is None:
        memory, source = cgroup_fraction(pid), "cgroup"
    if memory is None:
        cap = load.get("kv_cache_capacity_bytes") or 0
        memory, source = ((load.get("kv_cache_bytes") or 0) / cap if cap else 0.0), "kv-budget"
    return ReplicaSignals(
        endpoint=endpoint, queue_depth=queue, running=int(load.get("running") or 0),
        compute_p99_ms=float(load.get("compute_p99_ms") or 0.0),
        tokens_per_second=float(load.get("tokens_per_second") or 0.0),
        kv_utilisation=float(load.get("kv_cache_utilization") or 0.0),
        kv_hit_rate=float(load.get("prefix_cache_hit_rate") or 0.0),
        memory_fraction=float(memory), memory_source=source, age_ms=age_ms)


class ReplicaReader:
    """Polls each replica's /v1/load once per cycle, concurrently; a failed read keeps
    the last figures (their age grows), a replica never read is left out."""

    def __init__(self, timeout_s: float = 0.15):
        self.timeout_s = timeout_s
        self.pids: dict[str, int] = {}
        self.last: dict[str, tuple[dict, float]] = {}      # endpoint -> (load, monotonic read time)
        self.errors: dict[str, str] = {}
        self._session: aiohttp.ClientSession | None = None

    async def _read(self, endpoint: str) -> None:
        try:
            async with self._session.get(f"http://{endpoint}/v1/load") as r:
                if r.status != 200:
                    raise aiohttp.ClientError(f"status {r.status}")
                self.last[endpoint] = (await r.json(), time.monotonic())
                self.errors.pop(endpoint, None)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
            self.errors[endpoint] = f"{type(e).__name__}: {e}"

    async def read(self, endpoints) -> tuple[ReplicaSignals, ...]:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        await asyncio.gather(*(self._read(e) for e in endpoints))
        now = time.monotonic()
        return tuple(replica_signals(e, self.last[e][0], (now - self.last[e][1]) * 1e3, self.pids.get(e))
                     for e in endpoints if e in self.last)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
