"""Resource fusion signals (the seed's section 2.3): the NUMA latency matrix, PCIe link
bandwidth and the inference engine's state, each sampled on its own period and kept as an
exponential average with its own decay, exactly as the seed gives them:

| signal  | period | decay | source on this host                                                      |
| ------- | ------ | ----- | ------------------------------------------------------------------------ |
| numa    | 10 ms  | 0.92  | /sys/devices/system/node/node*/distance, cpulist (serving/topology.py)   |
| pcie    | 5 ms   | 0.88  | /sys/bus/pci/devices/*/current_link_speed, _width; NVML PCIe TX/RX with a GPU |
| engine  | 1 ms   | 0.95  | each replica's engine state page (mesh/engine_state.py)                  |

average <- decay * average + (1 - decay) * sample (the first sample is the average). A source
the host does not have is marked "absent here" (a VM's PCI bus reports no link; no GPU, no
NVML), never filled in. A policy sees the averages as `Signals.resources` (scheduler/decisions.py
ResourceSignals; the Wasm plugins too);
the model server uses the same topology to pin itself to one node (`mcpctl serve --numa-node`).

Each signal runs as its own asyncio task on absolute deadlines (no drift); a deadline missed by
whole periods is skipped and counted (`late`), as the loop's own period is.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from mcp26.mesh.engine_state import EngineStateReader
from mcp26.scheduler.decisions import ABSENT, EngineSignals, LinkSignals, ResourceSignals
from mcp26.serving.topology import SYSFS, read_numa, read_pcie

PCIE_RESCAN_S = 1.0          # a full scan of the PCI bus for links (hot-plug); every 5 ms only the known ones


@dataclass(frozen=True)
class Schedule:
    period_s: float
    decay: float


# The seed's periods and decay factors.
NUMA = Schedule(0.010, 0.92)
PCIE = Schedule(0.005, 0.88)
ENGINE = Schedule(0.001, 0.95)


class Ewma:
    def __init__(self, decay: float):
        self.decay = decay
        self.value: float | None = None

    def add(self, x: float) -> float:
        self.value = float(x) if self.value is None else self.decay * self.value + (1 - self.decay) * float(x)
        return self.value


class EwmaTable:
    """Exponential averages by key (a matrix cell, a link, a replica's field)."""

    def __init__(self, decay: float):
        self.decay = decay
        self.cells: dict = {}

    def add(self, key, x: float) -> float:
        return self.cells.setdefault(key, Ewma(self.decay)).add(x)

    def get(self, key) -> float | None:
        e = self.cells.get(key)
        return None if e is None else e.value


class ResourceSampler:
    def __init__(self, root: str = SYSFS, engine_pages: dict[str, str] | None = None, nvml=None,
                 clock=time.monotonic):
        self.root, self.clock = root, clock
        self.engine_paths = dict(engine_pages or {})
        self._engine_readers: dict[str, EngineStateReader] = {}
        self._nvml = nvml                       # a pynvml module with a GPU, or None (scheduler.loop.signals)
        self.numa = EwmaTable(NUMA.decay)
        self.pcie = EwmaTable(PCIE.decay)
        self.engine = EwmaTable(ENGINE.decay)
        self._numa_layout: tuple = ((), {})
        self._numa_source = self._pcie_source = self._engine_source = ABSENT
        self.samples = {"numa": 0, "pcie": 0, "engine": 0}
        self._pcie_known: tuple = ()            # the devices with a link, found by a full scan ...
        self._pcie_scanned = -1e9               # ... this often (PCIE_RESCAN_S): between scans, only theirs
        self.late = {"numa": 0, "pcie": 0, "engine": 0}
        self._tasks: list[asyncio.Task] = []

    # -- one sample of each ------------------------------------------------------------
    def sample_numa(self) -> None:
        numa = read_numa(self.root)
        if numa is None:
            self._numa_source = ABSENT
            return
        ids = tuple(n.id for n in numa.nodes)
        for i, row in zip(ids, numa.distance):
            for j, d in zip(ids, row):
                self.numa.add((i, j), d)
        self._numa_layout = (ids, {n.id: n.cpus for n in numa.nodes})
        self._numa_source = f"sysfs {self.root.rstrip('/')}/devices/system/node"
        self.samples["numa"] += 1

    def sample_pcie(self) -> None:
        now = self.clock()
        if now - self._pcie_scanned >= PCIE_RESCAN_S:
            self._pcie_scanned = now
            self._pcie_known = tuple(link.device for link in read_pcie(self.root))
        links = read_pcie(self.root, self._pcie_known) if self._pcie_known else ()
        for link in links:
            self.pcie.add(("link", link.device), link.gbytes_per_s)
        sources = [f"sysfs {self.root.rstrip('/')}/bus/pci/devices"] if links else []
        if self._nvml is not None:
            nv = self._nvml
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                self.pcie.add(("nvml", f"gpu{i} tx"), nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES))
                self.pcie.add(("nvml", f"gpu{i} rx"), nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES))
            sources.append("nvml PCIe throughput")
        self._pcie_source = ", ".join(sources) or ABSENT
        self.samples["pcie"] += 1

    def sample_engine(self) -> None:
        seen = []
        for endpoint, path in self.engine_paths.items():
            reader = self._engine_readers.get(endpoint)
            if reader is None:
                try:
                    reader = self._engine_readers[endpoint] = EngineStateReader(path)
                except (OSError, ValueError):
                    continue                    # not written yet (the replica is starting)
            state = reader.read()
            if state is None:
                continue
            for name in ("sessions", "running", "queued", "profiles"):
                self.engine.add((endpoint, name), getattr(state, name))
            seen.append(endpoint)
        self._engine_source = "engine state pages (mesh/engine_state.py)" if seen else ABSENT
        self.samples["engine"] += 1

    # -- what a policy sees --------------------------------------------------------------
    def view(self) -> ResourceSignals:
        ids, cpus = self._numa_layout
        matrix = tuple(tuple(round(self.numa.get((i, j)), 3) for j in ids) for i in ids)
        links = tuple(LinkSignals(k[1], round(v.value, 3)) for k, v in self.pcie.cells.items() if k[0] == "link")
        nvml = tuple(LinkSignals(k[1], round(v.value, 1)) for k, v in self.pcie.cells.items() if k[0] == "nvml")
        engine: dict = {}
        for (endpoint, name), e in self.engine.cells.items():
            engine.setdefault(endpoint, {})[name] = round(e.value, 3)
        return ResourceSignals(ids, tuple(cpus.get(i, ()) for i in ids), matrix, self._numa_source, links, nvml,
                               self._pcie_source, tuple(EngineSignals(ep, **f) for ep, f in engine.items()),
                               self._engine_source)

    def describe(self) -> dict:
        v = self.view()
        return {
            "numa": {"period_ms": NUMA.period_s * 1e3, "decay": NUMA.decay, "source": v.numa_source,
                     "nodes": list(v.numa_nodes), "cpus": [list(c) for c in v.numa_cpus],
                     "distance": [list(r) for r in v.numa_distance]},
            "pcie": {"period_ms": PCIE.period_s * 1e3, "decay": PCIE.decay, "source": v.pcie_source,
                     "links_gbytes_per_s": {x.device: x.value for x in v.pcie_links},
                     "nvml_kb_per_s": {x.device: x.value for x in v.pcie_throughput}},
            "engine": {"period_ms": ENGINE.period_s * 1e3, "decay": ENGINE.decay, "source": v.engine_source,
                       "replicas": {e.endpoint: {"sessions": e.sessions, "running": e.running, "queued": e.queued,
                                                 "profiles": e.profiles} for e in v.engine}},
            "samples": dict(self.samples), "late": dict(self.late),
        }

    # -- the three periodic tasks ----------------------------------------------------------
    async def _every(self, name: str, schedule: Schedule, sample) -> None:
        loop = asyncio.get_running_loop()
        start, k = loop.time(), 0
        while True:
            deadline = start + k * schedule.period_s
            delay = deadline - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            behind = int((loop.time() - deadline) // schedule.period_s)
            if behind > 0:                      # fell behind by whole periods: skip them, count them
                self.late[name] += behind
                k += behind
            try:
                sample()
            except Exception:                   # a source that fails one sample keeps its average
                pass
            k += 1

    def start(self) -> None:
        """The periodic tasks; the engine's only with pages to read (1 kHz of nothing is not free)."""
        signals = [("numa", NUMA, self.sample_numa), ("pcie", PCIE, self.sample_pcie)]
        if self.engine_paths:
            signals.append(("engine", ENGINE, self.sample_engine))
        self._tasks = [asyncio.create_task(self._every(n, s, f)) for n, s, f in signals]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for r in self._engine_readers.values():
            r.close()
