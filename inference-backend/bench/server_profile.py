"""The server's profiler over a run's window (`mcpctl serve --enable-profiler`).

The model's statistics (Triton's statistics extension, GET /v2/models/NAME/stats)
carry a cumulative `profiler` entry; one reading before the load and one after
give the window's 17 metrics (profiler.derive), per priority level and for all.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request

from mcp26.inference.bench.target import Target
from mcp26.inference.profiler import derive


def read(t: Target, grpc: bool = False, timeout: float = 5.0) -> dict:
    """The profiler's cumulative doc, or {"error": why there is none}."""
    if grpc:
        return {"error": "read over REST only: run the REST target for the profiler's columns"}
    url = f"http://{t.authority}{t.model_path}/stats"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            docs = json.loads(r.read()).get("model_stats") or []
    except (urllib.error.URLError, OSError, ValueError, AttributeError) as e:
        return {"error": f"GET {url}: {getattr(e, 'reason', e)}"}
    prof = next((d.get("profiler") for d in docs if d.get("profiler")), None)
    if prof is None:
        return {"error": "the server's profiler is off (mcpctl serve --enable-profiler)"}
    return prof


def window(before: dict | None, after: dict | None, levels: list[str]) -> dict:
    """{"levels": {level: the 17 metrics}} over the run, or {"error": ...}."""
    for doc in (after, before):
        if doc is None or "error" in doc:
            return {"error": (doc or {}).get("error", "no reading")}
    return {"levels": {lv: derive(before, after, lv) for lv in levels}}
