"""The model server keeps the cyclic collector off its startup heap: once ready,
the heap is frozen (mcp_python_gc_frozen_objects), and a full collection under
load walks only what traffic made - far shorter than the full collection of the
startup heap that the server ran before it froze it. Against a live `mcpctl
serve`, loaded by mcp-bench, read from its /metrics (serving/gc_pauses.py)."""
from __future__ import annotations

import subprocess
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mcp26.demo.stack.inference_server import InferenceServer
from mcp26.serving import gc_pauses
from mcp26.serving.executables import executable

pytestmark = pytest.mark.e2e


def _frozen(metrics_text: str) -> float:
    return next(s.value for fam in text_string_to_metric_families(metrics_text) for s in fam.samples
                if s.name == "mcp_python_gc_frozen_objects")


@pytest.mark.slow      # a ratio of GC pauses under load
def test_startup_heap_is_frozen_and_full_collections_under_load_stay_short():
    with InferenceServer("builtin:relu") as server:
        text = server.metrics()
        # Well above what traffic leaves tracked; the imports alone are ~60,000 objects.
        assert _frozen(text) > 30_000, _frozen(text)
        before = gc_pauses.pauses_from_metrics(text)
        startup = gc_pauses.pauses_between({}, before, "2")
        assert startup["count"] >= 1, before        # the collection just before the freeze
        startup_pause = startup["seconds"] / startup["count"]

        deadline = time.monotonic() + 60
        while True:     # until traffic has started full collections of its own
            p = subprocess.run([executable("mcp-bench"), "-u", f"http://{server.http}/v2/models/relu", "-c", "32",
                                "--duration", "3", "--input", "INPUT0:FP32:1,256"],
                               capture_output=True, text=True, timeout=60)
            assert p.returncode == 0, p.stderr
            under_load = gc_pauses.pauses_between(before, gc_pauses.pauses_from_metrics(server.metrics()), "2")
            if under_load["count"] >= 2 or time.monotonic() > deadline:
                break
        assert under_load["count"] >= 2, f"no full collection under load: {under_load}"
        # Unfrozen, each walks the startup heap again: as long as startup_pause (measured 25-75 ms).
        assert under_load["seconds"] / under_load["count"] < startup_pause / 4, (under_load, startup_pause)
