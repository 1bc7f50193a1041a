"""A served model's load in the Gateway API Inference Extension's model-server terms.

The GIE model server protocol (kubernetes-sigs/gateway-api-inference-extension,
docs/proposals/003-model-server-protocol) asks for TotalQueuedRequests,
TotalRunningRequests and KVCacheUtilization (gauges), and prefix cache reuse.
Here, per model:

- waiting: requests queued whose first run has not begun - KServe infer
  requests in the priority queues, and generations whose prefill has not
  started (a running generation's next decode step in the queue is not a new
  waiting request, as in vLLM);
- running: generations between their prefill's start and their last token,
  plus KServe requests in the batch being computed;
- kv_cache_utilization: the share of the KV budget live sequences hold (0-1);
- prefix_cache_hit_rate: prompt tokens found in the block cache / looked up;
- tokens_per_second: generated tokens over the last 10 s (decoder.TokenMeter).

`snapshot` is what GET /v1/load answers, what /metrics exports under vLLM's
names (telemetry.GieCollector) and what the ORCA header carries: computed from
counters, no locks held long, cheap enough to poll every 50 ms.
"""
from __future__ import annotations


def snapshot(served, by_level: bool = True) -> dict:
    b = served.batcher
    gen = getattr(served, "generation_load", None)
    steps_queued = gen.steps_queued if gen else 0
    waiting = max(0, b.total_queued() - steps_queued) + (max(0, gen.waiting) if gen else 0)
    in_batch = gen.steps_in_batch if gen else 0
    running = (max(0, gen.running) if gen else 0) + max(0, b.in_flight - in_batch)
    out = {"model": served.name, "waiting": waiting, "running": running,
           "kv_cache_utilization": 0.0, "prefix_cache_hit_rate": 0.0, "tokens_per_second": 0.0}
    if by_level:       # takes the batcher's lock: not on every response's ORCA report
        out["waiting_by_priority_level"] = {str(k): v for k, v in sorted(b.queue_depth().items())}
    kv = served.kv_cache
    if kv is not None:
        out.update({
            "kv_cache_utilization": round(kv.utilization(), 6),
            "prefix_cache_hit_rate": round(kv.prefix_hit_rate(), 6),
            "tokens_per_second": round(served.tokens.tokens_per_second(), 3),
            "kv_cache_bytes": kv.bytes, "kv_cache_capacity_bytes": kv.capacity_bytes,
            "kv_block_tokens": kv.block_tokens, "kv_blocks": len(kv.pool.blocks),
            "prefix_cache_queries": kv.prefix_queries, "prefix_cache_hits": kv.prefix_hits,
        })
    return out


def server_snapshot(models) -> dict:
    """GET /v1/load: the process's load (sums over its models; utilisation and hit rate of
    the fullest), with each model's own under `models`."""
    per = [snapshot(m) for m in models.models.values()]
    out = {"ready": models.reports_ready,
           "waiting": sum(p["waiting"] for p in per), "running": sum(p["running"] for p in per),
           "kv_cache_utilization": max((p["kv_cache_utilization"] for p in per), default=0.0),
           "prefix_cache_hit_rate": max((p["prefix_cache_hit_rate"] for p in per), default=0.0),
           "tokens_per_second": sum(p["tokens_per_second"] for p in per),
           "models": per}
    for key in ("kv_cache_bytes", "kv_cache_capacity_bytes", "kv_blocks"):
        if any(key in p for p in per):
            out[key] = sum(p.get(key, 0) for p in per)
    return out
