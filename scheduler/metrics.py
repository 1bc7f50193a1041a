"""Live load of each model server: scraped from its Prometheus `/metrics`
every interval (≤ 50 ms by default), in the Gateway API Inference
Extension's model-server protocol where the server speaks it (vLLM's names)
and in this project's own names otherwise. Each figure keeps its age; an
endpoint whose scrapes keep failing is not ready.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp

# Metric names per signal, in order of preference (GIE model-server protocol first).
WAITING = ("vllm:num_requests_waiting", "mcp_inference_queue_depth")
RUNNING = ("vllm:num_requests_running", "mcp_inference_running_requests")
KV_UTILISATION = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "mcp_inference_kv_cache_utilization")
FAILURES_UNTIL_NOT_READY = 3


@dataclass
class Load:
    waiting: float = 0.0
    running: float = 0.0
    kv_utilisation: float = 0.0
    scraped_at: float = 0.0          # time.monotonic() of the last good scrape; 0: never
    failures: int = 0

    @property
    def ready(self) -> bool:
        return self.scraped_at > 0 and self.failures < FAILURES_UNTIL_NOT_READY

    def age_s(self, now: float | None = None) -> float | None:
        return None if not self.scraped_at else (now or time.monotonic()) - self.scraped_at


def parse_prometheus(text: str) -> dict[str, float]:
    """name -> value, summing the series of one name (labels dropped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name_part, _, rest = line.partition(" ")
        name = name_part.split("{", 1)[0]
        try:
            value = float(rest.split()[0])
        except (ValueError, IndexError):
            continue
        out[name] = out.get(name, 0.0) + value
    return out


def _first(values: dict[str, float], names: tuple[str, ...]) -> float | None:
    for n in names:
        if n in values:
            return values[n]
    return None


class MetricsPoller:
    """Scrapes `http://ENDPOINT/metrics` for every endpoint, concurrently, each interval."""

    def __init__(self, interval_s: float = 0.05, timeout_s: float = 0.5):
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.loads: dict[str, Load] = {}
        self.endpoints: tuple[str, ...] = ()
        self._session: aiohttp.ClientSession | None = None

    def set_endpoints(self, keys) -> None:
        self.endpoints = tuple(keys)
        self.loads = {k: self.loads.get(k) or Load() for k in self.endpoints}

    async def run(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        try:
            while True:
                started = time.monotonic()
                await asyncio.gather(*(self.scrape(k) for k in self.endpoints))
                await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))
        finally:
            await self._session.close()

    async def scrape(self, key: str) -> None:
        load = self.loads.get(key)
        if load is None or self._session is None:
            return
        try:
            async with self._session.get(f"http://{key}/metrics") as resp:
                if resp.status != 200:
                    raise aiohttp.ClientError(f"status {resp.status}")
                values = parse_prometheus(await resp.text())
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            load.failures += 1
            return
        load.waiting = _first(values, WAITING) or 0.0
        load.running = _first(values, RUNNING) or 0.0
        kv = _first(values, KV_UTILISATION)
        load.kv_utilisation = min(1.0, max(0.0, kv)) if kv is not None else 0.0
        load.scraped_at, load.failures = time.monotonic(), 0
