"""Live load of each model server: scraped from its Prometheus `/metrics`
every interval (≤ 50 ms by default), in the Gateway API Inference
Extension's model-server protocol where the server speaks it (vLLM's names)
and in this project's own names otherwise. Each figure keeps its age; an
endpoint whose scrapes keep failing is not ready.

A server that answers `GET /v1/load` (this project's, inference-backend
README "Load for the Endpoint Picker") is polled there instead: the same
three signals as one small JSON object, about a fifth of the server's CPU of
rendering /metrics -- which, 20 times a second per picker, took the decoder's
event loop away from streaming tokens (bench_epp measured it). A server whose
/v1/load is missing or not a load object is scraped on /metrics from then on.
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
LOAD_PATH = "/v1/load"


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
    """Polls every endpoint's load (/v1/load, else /metrics), concurrently, each interval."""

    def __init__(self, interval_s: float = 0.05, timeout_s: float = 0.5):
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.loads: dict[str, Load] = {}
        self.endpoints: tuple[str, ...] = ()
        self._session: aiohttp.ClientSession | None = None
        self._prometheus_only: set[str] = set()     # endpoints without a usable /v1/load

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
            got = None if key in self._prometheus_only else await self._load_json(key)
            if got is None:
                self._prometheus_only.add(key)
                got = await self._prometheus(key)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            load.failures += 1
            return
        load.waiting, load.running, kv = got
        load.kv_utilisation = min(1.0, max(0.0, kv)) if kv is not None else 0.0
        load.scraped_at, load.failures = time.monotonic(), 0

    async def _load_json(self, key: str) -> tuple[float, float, float | None] | None:
        """(waiting, running, KV utilisation) from /v1/load; None when the server has no such object."""
        async with self._session.get(f"http://{key}{LOAD_PATH}") as resp:
            if resp.status == 404:
                return None
            if resp.status != 200:
                raise aiohttp.ClientError(f"status {resp.status}")
            try:
                doc = await resp.json(content_type=None)
                return float(doc["waiting"]), float(doc["running"]), float(doc["kv_cache_utilization"])
            except (ValueError, KeyError, TypeError):
                return None

    async def _prometheus(self, key: str) -> tuple[float, float, float | None]:
        async with self._session.get(f"http://{key}/metrics") as resp:
            if resp.status != 200:
                raise aiohttp.ClientError(f"status {resp.status}")
            values = parse_prometheus(await resp.text())
        return _first(values, WAITING) or 0.0, _first(values, RUNNING) or 0.0, _first(values, KV_UTILISATION)
