"""User space of the latency sampler: ring-buffer reader, p50/p99 per
service port, and the Prometheus collector that exports them.

The kernel emits one `latency_event` per request (first request byte in ->
first response byte out, c/latency.h). `LatencyStats` keeps a sliding
window of recent samples per port; `LatencyCollector` publishes its quantiles
in a prometheus_client registry (the model server's own, whose /metrics is
prometheus_client alone, or `mcpctl bpf latency --prometheus-port`'s), read
at each scrape.
"""
from __future__ import annotations

import ctypes as ct
import os
import threading
from collections import defaultdict, deque

from mcp26.bpf.layout import LatencyEvent
from mcp26.bpf.attach import pin_dir
from mcp26.bpf.syscall import obj_get

METRIC_LATENCY = "mcp_bpf_first_byte_latency_seconds"   # gauge, by service_port and quantile
METRIC_SAMPLES = "mcp_bpf_first_byte_latency_samples"   # gauge: samples seen, by service_port
QUANTILES = (0.5, 0.99)


def quantile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank quantile (the value below which a fraction q of samples lie)."""
    if not sorted_values:
        raise ValueError("no samples")
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 1))))
    return sorted_values[rank - 1]


class LatencyStats:
    """Per service port: total samples and a window of the latest `window`."""

    def __init__(self, window: int = 4096):
        self.window = window
        self._samples: dict[int, deque] = defaultdict(lambda: deque(maxlen=window))
        self._counts: dict[int, int] = defaultdict(int)
        self._lock = threading.Lock()

    def add(self, port: int, latency_ns: int) -> None:
        with self._lock:
            self._samples[port].append(latency_ns)
            self._counts[port] += 1

    def ports(self) -> list[int]:
        with self._lock:
            return sorted(self._samples)

    def count(self, port: int) -> int:
        with self._lock:
            return self._counts.get(port, 0)

    def quantiles_ns(self, port: int) -> dict[float, int]:
        with self._lock:
            values = sorted(self._samples.get(port, ()))
        return {q: quantile(values, q) for q in QUANTILES} if values else {}

    def summary(self) -> dict[int, dict]:
        out = {}
        for port in self.ports():
            qs = self.quantiles_ns(port)
            out[port] = {"samples": self.count(port), "p50_us": qs[0.5] / 1e3, "p99_us": qs[0.99] / 1e3}
        return out


class LatencyCollector:
    """`stats`' quantiles and sample counts as Prometheus gauges, read at each scrape."""

    def __init__(self, stats: LatencyStats):
        self.stats = stats

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily
        latency = GaugeMetricFamily(METRIC_LATENCY, "kernel-measured time from a request's first byte in to "
                                    "its response's first byte out, by service port", labels=("service_port", "quantile"))
        samples = GaugeMetricFamily(METRIC_SAMPLES, "requests the eBPF latency sampler has timed",
                                    labels=("service_port",))
        for port in self.stats.ports():
            for q, ns in self.stats.quantiles_ns(port).items():
                latency.add_metric((str(port), str(q)), ns / 1e9)
            samples.add_metric((str(port),), self.stats.count(port))
        yield latency
        yield samples


class RingReader:
    """Reads `latency_event`s from a BPF ring buffer map fd into `stats`.

    Works on the fd of a pinned map (another process's attach) as well as
    bcc's own, through libbcc's ring_buffer API.
    """

    def __init__(self, map_fd: int, stats: LatencyStats, owned_fd: bool = False, flow_ring=None):
        from bcc.libbcc import _RINGBUF_CB_TYPE, lib
        self._lib, self.stats, self._fd, self._owned = lib, stats, map_fd, owned_fd
        self.flow_ring = flow_ring          # a mesh.flow_ring.FlowRingWriter: each sample as a flow record

        def on_event(_ctx, data, size):
            if size >= ct.sizeof(LatencyEvent):
                e = ct.cast(data, ct.POINTER(LatencyEvent)).contents
                stats.add(e.port, e.latency_ns)
                if self.flow_ring is not None:
                    self.flow_ring.write_raw(bytes(e.saddr), bytes(e.daddr), e.sport, e.dport, e.family,
                                             e.latency_ns // 1000, e.payload_bytes, e.ts_ns)
            return 0

        self._cb = _RINGBUF_CB_TYPE(on_event)     # keep a reference: libbcc calls it
        self._ring = lib.bpf_new_ringbuf(map_fd, self._cb, None)
        if not self._ring:
            raise OSError(f"cannot open the latency ring buffer (fd {map_fd})")

    def poll(self, timeout_ms: int = 100) -> None:
        self._lib.bpf_poll_ringbuf(self._ring, timeout_ms)

    def drain(self) -> None:
        self._lib.bpf_consume_ringbuf(self._ring)

    def close(self) -> None:
        if self._ring:
            self._lib.bpf_free_ringbuf(self._ring)
            self._ring = None
        if self._owned and self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_pinned(ifname: str, stats: LatencyStats, flow_ring=None) -> RingReader:
    """A reader on the ring buffer `mcpctl bpf attach --sample` pinned for `ifname`."""
    path = os.path.join(pin_dir(ifname), "latency_events")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no latency sampler attached to {ifname} ({path} missing); "
                                f"run `mcpctl bpf attach --interface {ifname} --sample`")
    return RingReader(obj_get(path), stats, owned_fd=True, flow_ring=flow_ring)


class LatencyExporter:
    """Samples from an interface's pinned sampler into OpenTelemetry, in a thread.

    One call wires the kernel's samples into a process's own metrics, e.g. the
    inference backend's (prometheus_client's default registry): `LatencyExporter("eth0")`.
    """

    def __init__(self, ifname: str, registry=None, window: int = 4096):
        from prometheus_client import REGISTRY
        self.stats = LatencyStats(window)
        self._reader = open_pinned(ifname, self.stats)    # in the caller's network namespace
        self._registry = registry if registry is not None else REGISTRY
        self._collector = LatencyCollector(self.stats)
        self._registry.register(self._collector)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"bpf-latency-{ifname}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._reader.poll(100)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._reader.close()
        self._registry.unregister(self._collector)
