"""The host's topology as sysfs tells it: NUMA nodes (their CPUs and the firmware's distance
matrix, /sys/devices/system/node/) and PCIe links (/sys/bus/pci/devices/*/current_link_speed,
current_link_width). The decision loop samples them as resource signals
(scheduler/loop/resources.py) and the model server pins its process to the CPUs of one node
(`mcpctl serve --numa-node`): the node nearest its device when the device is a PCIe one with a
node, else the node with the most CPUs.

Every reader takes `root` (a fake sysfs tree in tests) and answers None or () where the host
has no such file - a VM without NUMA nodes or PCIe link attributes - so the caller can say the
signal is absent here rather than invent it.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

SYSFS = "/sys"
_NODE = re.compile(r"^node(\d+)$")


def parse_cpulist(text: str) -> tuple[int, ...]:
    """"0-3,8,10-11" -> (0, 1, 2, 3, 8, 10, 11); ValueError on anything else."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a or a < 0:
            raise ValueError(f"bad CPU range {part!r}")
        out.extend(range(a, b + 1))
    return tuple(out)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


@dataclass(frozen=True)
class NumaNode:
    id: int
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class Numa:
    nodes: tuple[NumaNode, ...]                 # by id
    distance: tuple[tuple[int, ...], ...]       # distance[i][j]: nodes[i] -> nodes[j] (10: local)

    def node(self, node_id: int) -> NumaNode | None:
        return next((n for n in self.nodes if n.id == node_id), None)

    def nearest_with_cpus(self, node_id: int) -> NumaNode:
        """`node_id` itself when it has CPUs, else the node with CPUs at the least distance."""
        ids = [n.id for n in self.nodes]
        row = self.distance[ids.index(node_id)] if node_id in ids else None
        with_cpus = [n for n in self.nodes if n.cpus]
        if row is None:
            return max(with_cpus, key=lambda n: (len(n.cpus), -n.id))
        return min(with_cpus, key=lambda n: (row[ids.index(n.id)], n.id))


def read_numa(root: str = SYSFS) -> Numa | None:
    """The NUMA nodes and their distance matrix; None where sysfs has no node directory."""
    base = os.path.join(root, "devices", "system", "node")
    try:
        names = os.listdir(base)
    except OSError:
        return None
    ids = sorted(int(m.group(1)) for m in map(_NODE.match, names) if m)
    if not ids:
        return None
    nodes, rows = [], []
    for i in ids:
        cpus = _read(os.path.join(base, f"node{i}", "cpulist"))
        dist = _read(os.path.join(base, f"node{i}", "distance"))
        try:
            nodes.append(NumaNode(i, parse_cpulist(cpus or "")))
            row = tuple(int(x) for x in (dist or "").split())
        except ValueError:
            return None
        if len(row) != len(ids):
            return None                         # a matrix that does not match the nodes: not trusted
        rows.append(row)
    return Numa(tuple(nodes), tuple(rows))


@dataclass(frozen=True)
class PcieLink:
    device: str                 # 0000:3b:00.0
    speed_gts: float            # current_link_speed, GT/s per lane
    width: int                  # current_link_width, lanes
    max_speed_gts: float
    max_width: int
    numa_node: int              # -1: none given
    pci_class: str              # 0x030200 (a 3D controller), ...

    @property
    def gbytes_per_s(self) -> float:
        """One direction's bandwidth: lanes x rate x line coding (8b/10b up to 5 GT/s, 128b/130b
        from 8 GT/s; PCIe 6's FLIT mode is taken as 242/256)."""
        coding = 0.8 if self.speed_gts <= 5.0 else (128 / 130 if self.speed_gts < 64 else 242 / 256)
        return self.speed_gts * self.width * coding / 8


def _speed(text: str | None) -> float | None:
    m = re.match(r"^\s*([0-9.]+)\s*GT/s", text or "")
    return float(m.group(1)) if m else None


def read_pcie(root: str = SYSFS, devices=None) -> tuple[PcieLink, ...]:
    """Every PCIe device that reports a trained link (of `devices` only, when given); () where
    none does (a VM's virtual bus)."""
    base = os.path.join(root, "bus", "pci", "devices")
    if devices is None:
        try:
            devices = sorted(os.listdir(base))
        except OSError:
            return ()
    out = []
    for dev in devices:
        d = os.path.join(base, dev)
        speed, width = _speed(_read(os.path.join(d, "current_link_speed"))), _read(os.path.join(d, "current_link_width"))
        if speed is None or not (width or "").isdigit() or int(width) == 0:
            continue
        max_speed = _speed(_read(os.path.join(d, "max_link_speed"))) or speed
        max_width = _read(os.path.join(d, "max_link_width")) or width
        node = _read(os.path.join(d, "numa_node")) or "-1"
        out.append(PcieLink(dev, speed, int(width), max_speed, int(max_width) if max_width.isdigit() else int(width),
                            int(node) if node.lstrip("-").isdigit() else -1, _read(os.path.join(d, "class")) or ""))
    return tuple(out)


def device_node(pci_address: str, root: str = SYSFS) -> int | None:
    """The NUMA node sysfs gives PCIe device `pci_address` (None: none, or no such device)."""
    text = _read(os.path.join(root, "bus", "pci", "devices", pci_address.lower(), "numa_node"))
    if text is None or not text.lstrip("-").isdigit() or int(text) < 0:
        return None
    return int(text)


def choose_node(numa: Numa, pci_address: str | None = None, root: str = SYSFS) -> NumaNode:
    """The node a serving process is pinned to: the one nearest its device (a PCIe address with
    a node), else the one with the most CPUs (ties: the lowest id)."""
    node = device_node(pci_address, root) if pci_address else None
    if node is not None:
        return numa.nearest_with_cpus(node)
    return max((n for n in numa.nodes if n.cpus), key=lambda n: (len(n.cpus), -n.id))


def pin_process(cpus: tuple[int, ...]) -> tuple[int, ...]:
    """Pin this process (every thread it has and will start: a new thread inherits the mask) to
    `cpus` that are online and allowed here; -> the CPUs it runs on now."""
    allowed = os.sched_getaffinity(0)
    mine = {c for c in cpus if c in allowed}
    if not mine:
        raise ValueError(f"none of CPUs {list(cpus)} is available to this process (allowed {sorted(allowed)})")
    for tid in (int(t) for t in os.listdir("/proc/self/task")):
        try:
            os.sched_setaffinity(tid, mine)
        except OSError:                         # a thread that ended meanwhile
            pass
    return tuple(sorted(os.sched_getaffinity(0)))
