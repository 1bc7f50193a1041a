"""The model server keeps the cyclic collector off its startup heap: once ready,
the heap is frozen (mcp_python_gc_frozen_objects), and a full collection under
load walks only what traffic made - far shorter than the full collection of the
startup heap that the server ran before it froze it. Against a live `mcpctl
serve`, loaded by mcp-bench, read from its /metrics (mesh/gc_pauses.py)."""
from __future__ import annotations

import subprocess
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.inference_server import InferenceServer
from mesh.scripts import executable

pytestmark = pytest.mark.e2e


def _gc(metrics_text: str) -> tuple[float, dict[str, tuple[float, float]]]:
    """(frozen objects, {generation: (pauses, seconds)})."""
    frozen, pauses = 0.0, {}
    for fam in text_string_to_metric_families(metrics_text):
        for s in fam.samples:
            if s.name == "mcp_python_gc_frozen_objects":
                frozen = s.value
            elif s.name in ("mcp_python_gc_pause_seconds_count", "mcp_python_gc_pause_seconds_sum"):
                n, t = pauses.get(s.labels["generation"], (0.0, 0.0))
                pauses[s.labels["generation"]] = (s.value, t) if s.name.endswith("_count") else (n, s.value)
    return frozen, pauses


def test_startup_heap_is_frozen_and_full_collections_under_load_stay_short():
    with InferenceServer("builtin:relu") as server:
        frozen, before = _gc(server.metrics())
        # Well above what traffic leaves tracked; the imports alone are ~60,000 objects.
        assert frozen > 30_000, frozen
        n0, t0 = before["2"]
        assert n0 >= 1, before          # the collection just before the freeze
        startup_pause = t0 / n0

        deadline = time.monotonic() + 60
        while True:     # until traffic has started full collections of its own
            p = subprocess.run([executable("mcp-bench"), "-u", f"http://{server.http}/v2/models/relu", "-c", "32",
                                "--duration", "3", "--input", "INPUT0:FP32:1,256"],
                               capture_output=True, text=True, timeout=60)
            assert p.returncode == 0, p.stderr
            _, after = _gc(server.metrics())
            n1, t1 = after["2"]
            if n1 - n0 >= 2 or time.monotonic() > deadline:
                break
        assert n1 - n0 >= 2, f"no full collection under load: {after}"
        under_load = (t1 - t0) / (n1 - n0)
        # Unfrozen, each walks the startup heap again: as long as startup_pause (measured 35-75 ms).
        assert under_load < startup_pause / 4, (under_load, startup_pause, after)
