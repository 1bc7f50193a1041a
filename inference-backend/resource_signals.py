"""What the model server feeds the decision loop's resource and flow signals, and its NUMA pin:

- `pin_to_numa_node(spec, device)` (`mcpctl serve --numa-node auto|N|off`): the process, with every
  thread it starts after (the batcher's compute threads, ONNX Runtime's pools), on the CPUs of
  one NUMA node - the node nearest the device when it is a PCIe GPU with a node, else the node
  with the most CPUs (serving/topology.py). Done before the models load, so their threads
  inherit the mask.
- `EngineStatePublisher` (`--engine-state PATH`): the engine state page (mesh/engine_state.py),
  rewritten after every batch, which the loop samples every millisecond.
- `FlowPublisher` (`--flow-ring PATH`): per flow, a request's token throughput and KV-cache
  (prefix) hit rate into a flow ring file (mesh/flow_ring.py KIND_SERVING), keyed as the kernel
  keys the same connection (client -> server), ringing the loop's doorbell. One writer: the
  event loop's thread, where the OpenAI API answers.
"""
from __future__ import annotations

import logging
import os
import time

from mcp26.mesh import flow_ring as R
from mcp26.mesh.engine_state import EngineState, EngineStateWriter
from mcp26.serving import topology as T

log = logging.getLogger("mcp26.inference")


def _gpu_pci_address(device: str) -> str | None:
    """The PCIe address NVML gives the GPU `device` names (cuda:N / auto: the first), or None."""
    if not (device == "auto" or device.startswith("cuda")):
        return None
    try:
        import pynvml
        pynvml.nvmlInit()
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        bus = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).busId
        bus = bus.decode() if isinstance(bus, bytes) else bus
        domain, rest = bus.split(":", 1)                  # 00000000:3B:00.0 -> 0000:3b:00.0
        return f"{int(domain, 16):04x}:{rest}".lower()
    except Exception:                                     # no library, driver or GPU
        return None


def pin_to_numa_node(spec: str, device: str = "auto", root: str = T.SYSFS) -> dict:
    """Pin this process as `spec` says ("off", "auto" or a node id); -> what was done, for
    /admin/status. ValueError for a node this host does not have."""
    if spec == "off":
        return {"pinned": False, "reason": "--numa-node off"}
    numa = T.read_numa(root)
    if numa is None:
        if spec != "auto":
            raise ValueError(f"--numa-node {spec}: this host reports no NUMA nodes ({root}/devices/system/node)")
        return {"pinned": False, "reason": "absent here: no NUMA nodes in sysfs"}
    if spec == "auto":
        pci = _gpu_pci_address(device)
        node, why = T.choose_node(numa, pci, root), (f"nearest {pci}" if pci else "the most CPUs")
    else:
        node = numa.node(int(spec)) if spec.isdigit() else None
        if node is None or not node.cpus:
            raise ValueError(f"--numa-node {spec}: no such node with CPUs here "
                             f"(nodes {', '.join(str(n.id) for n in numa.nodes if n.cpus)})")
        why = "--numa-node"
    cpus = T.pin_process(node.cpus)
    log.info("pinned to NUMA node %d (%s): CPUs %s", node.id, why, ",".join(map(str, cpus)))
    return {"pinned": True, "node": node.id, "why": why, "cpus": list(cpus),
            "distance": list(numa.distance[[n.id for n in numa.nodes].index(node.id)])}


class EngineStatePublisher:
    def __init__(self, path: str, models):
        self.writer = EngineStateWriter(path)
        self.models = models                # ModelServer
        self.batches = 0
        self.publish()

    def publish(self) -> None:
        """The page from the served models now (called after every batch, on its compute thread)."""
        self.batches += 1
        served = list(self.models.models.values())
        b = [m.batcher for m in served]
        self.writer.write(EngineState(
            sessions=sum(1 + (1 if m.split_width else 0) for m in served), models=len(served),
            running=sum(x.in_flight for x in b), queued=sum(x.total_queued() for x in b),
            profiles=0, batches=self.batches, updated_ns=time.monotonic_ns()))

    def close(self) -> None:
        self.writer.close()


class FlowPublisher:
    def __init__(self, path: str):
        self.ring = R.MappedRing(path, create=not os.path.exists(path))
        self.writer = self.ring.writer()
        self.bell = R.RingBell(R.doorbell_path(path))
        self.published = 0

    def publish(self, transport, tokens: int, seconds: float, cached_tokens: int, prompt_tokens: int) -> None:
        """One request's figures for the connection `transport` carried it on."""
        peer = transport.get_extra_info("peername") if transport is not None else None
        local = transport.get_extra_info("sockname") if transport is not None else None
        if not (peer and local) or seconds <= 0:
            return                          # a Unix socket, or nothing timed
        if self.writer.write_serving(peer[0], peer[1], local[0], local[1], tokens / seconds,
                                     cached_tokens / prompt_tokens if prompt_tokens else 0.0, time.monotonic_ns()):
            self.published += 1
            self.bell.ring()

    def close(self) -> None:
        self.bell.close()
        self.writer.close()
        self.ring.close()
