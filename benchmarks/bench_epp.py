"""The Endpoint Picker vs Envoy's own balancers, side by side in one run.

Multi-turn chat sessions with shared system prompts (benchmarks/epp_sessions.py,
open loop; `--preset chat`, the default, or the earlier `shared-prompt` shape)
through one Envoy gateway to 2 and then 3 `builtin:tiny-decoder` replicas (each
on its own loopback address, the same port, as Pods; `--replicas 2,3`), three
ways:

  least_request  Envoy LEAST_REQUEST (what the pool gets today)
  orca_wrr       Envoy client-side weighted round robin on the replicas' ORCA
                 `endpoint-load-metrics` answers
  epp            ext_proc to `mcpctl epp serve`, override_host on its pick

Every variant gets fresh replicas (cold KV caches) and exactly the same work
(the same sessions at the same times, greedy answers). Measured per variant:
TTFT (first SSE data chunk) and whole-request p50/p99 from each request's due
time, generated tokens/s, the prefix-cache hit rate from the replicas' own
counters (`GET /v1/load`: prefix_cache_hits / prefix_cache_queries, prompt
tokens) and, for the EPP, its own estimate (`/stats`), refusals by class, and
the working set (the most prompt tokens of sessions alive at once) against the
replicas' KV budget.
Then the EPP's overhead per request: the same request through Envoy with the
picker vs through Envoy without it (and direct), to a trivial upstream.

`python -m benchmarks epp` (or `python -m benchmarks.bench_epp --help`; `--quick`
for a short smoke run); writes artifacts/bench/epp.json.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import sys
import tempfile
import time
from dataclasses import asdict, replace

from benchmarks.epp_overhead import floor as overhead_floor_of
from benchmarks.epp_overhead import overhead
from benchmarks.epp_overhead import table as overhead_table
from benchmarks.epp_stack import Picker, Replicas
from harness.endpoint_picker import write_pool
from benchmarks.epp_sessions import (PRESET_SECONDS, PRESETS, Workload, hit_ceiling, make_sessions, prefix_hits,
                                     run_sessions, summarise, turn_tokens, working_set_tokens)
from mcp26.demo.stack.envoy import Envoy
from harness.inference_gateway import balanced_gateway_bootstrap, gateway_bootstrap
from mcp26.demo.stack.ports import free_port
from mcp26.inference.builtin_models import DEC_HEAD_DIM, DEC_HEADS

ROOT = pathlib.Path(__file__).resolve().parent.parent
VARIANTS = ("least_request", "orca_wrr", "epp")
BASELINE = "least_request"
# tiny-decoder's KV bytes per token: a key and a value of DEC_HEADS x DEC_HEAD_DIM float32.
KV_BYTES_PER_TOKEN = 2 * DEC_HEADS * DEC_HEAD_DIM * 4


def _gateway(variant: str, pool: list[tuple[str, int]], directory: str,
             metrics_interval_ms: float | None) -> tuple[Envoy, Picker | None, int]:
    port = free_port()
    picker = None
    if variant == "epp":
        write_pool(directory, sorted({h for h, _ in pool}), pool[0][1])
        picker = Picker(directory, len(pool), metrics_interval_ms)
        bootstrap = gateway_bootstrap({port: False}, pool, picker.port, route_timeout_s=60)
    else:
        bootstrap = balanced_gateway_bootstrap(port, pool, variant, route_timeout_s=60)
    try:
        envoy = Envoy(bootstrap).start()
    except Exception:
        if picker:
            picker.stop()
        raise
    return envoy, picker, port


def run_variant(variant: str, w: Workload, replicas_n: int, args) -> dict:
    """One phase on fresh replicas (and a fresh picker): the raw results and counters."""
    sessions = make_sessions(w)
    replicas = Replicas(replicas_n, w.replica_kv_mb(replicas_n), args.threads)
    directory = tempfile.mkdtemp(prefix="bench-epp-")
    envoy = picker = None
    try:
        envoy, picker, port = _gateway(variant, replicas.endpoints, directory, args.metrics_interval_ms)
        before = replicas.loads()
        results, wall = asyncio.run(run_sessions(f"http://127.0.0.1:{port}/v1/chat/completions", sessions, w))
        phase = {"sessions": sessions, "results": results, "wall_s": wall, "loadavg_1m": os.getloadavg()[0]}
        after = replicas.loads()
        phase["hits"], phase["queries"] = prefix_hits(before, after)
        phase["working_set_tokens"] = working_set_tokens(results)
        phase["ceiling_hits"], phase["ceiling_queries"] = hit_ceiling(turn_tokens(sessions, results))
        phase["prompt_tokens_per_replica"] = [
            sum(m["prefix_cache_queries"] for m in a["models"]) - sum(m["prefix_cache_queries"] for m in b["models"])
            for b, a in zip(before, after)]
        if picker is not None:
            s = picker.stats()
            phase["epp"] = {k: s.get(k) for k in ("prefix_hit_rate", "decisions", "header_picks",
                                                  "mean_decision_us", "refused")}
            phase["epp"]["picked"] = [v["picked"] for v in s["endpoints"].values()]
        return phase
    finally:
        if envoy:
            envoy.stop()
        if picker:
            picker.stop()
        replicas.stop()


def combine(variant: str, phases: list[dict]) -> dict:
    """The rounds of one variant as one set of figures (percentiles over every request)."""
    results = [r for p in phases for r in p["results"]]
    sessions = [s for p in phases for s in p["sessions"]]
    wall = sum(p["wall_s"] for p in phases)
    hits, queries = sum(p["hits"] for p in phases), sum(p["queries"] for p in phases)
    c_hits, c_queries = sum(p["ceiling_hits"] for p in phases), sum(p["ceiling_queries"] for p in phases)
    out = {"variant": variant, "rounds": len(phases), "wall_s": round(wall, 2),
           "loadavg_1m": [round(p["loadavg_1m"], 2) for p in phases],
           **asdict(summarise(results, sessions, wall)),
           "prefix_hit_rate": hits / queries if queries else None,
           "prefix_cache_hits": hits, "prefix_cache_queries": queries,
           "ceiling_hit_rate": c_hits / c_queries if c_queries else None,
           "of_ceiling": hits * c_queries / (queries * c_hits) if queries and c_hits else None,
           "working_set_mb": round(max(p["working_set_tokens"] for p in phases) * KV_BYTES_PER_TOKEN / 2**20, 2),
           "prompt_tokens_per_replica": [p["prompt_tokens_per_replica"] for p in phases]}
    if any("epp" in p for p in phases):
        out["epp"] = [p.get("epp") for p in phases]
    return out


# -- the report ----------------------------------------------------------------------------------
ROWS = (("TTFT p50 (ms)", "ttft_p50_ms", "lower"), ("TTFT p99 (ms)", "ttft_p99_ms", "lower"),
        ("request p50 (ms)", "total_p50_ms", "lower"), ("request p99 (ms)", "total_p99_ms", "lower"),
        ("tokens/s", "tokens_per_s", "higher"), ("prefix-hit rate (replicas)", "prefix_hit_rate", "higher"),
        ("hit-rate ceiling (oracle)", "ceiling_hit_rate", "-"), ("hit rate / ceiling", "of_ceiling", "higher"),
        ("cached share (usage)", "cached_share", "higher"), ("working set (MB of KV)", "working_set_mb", "-"),
        ("OK requests", "ok", "higher"),
        ("failed", "failed", "lower"), ("abandoned turns", "abandoned_turns", "lower"))


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def table(results: dict[str, dict], title: str) -> str:
    names = list(results)
    others = [n for n in names if n != BASELINE]
    head = f"{title:28}" + "".join(f"{n:>15}" for n in names) + "".join(f"{n + '/LR':>15}" for n in others)
    lines = [head]
    for label, key, _ in ROWS:
        vals = [results[n].get(key) for n in names]
        base = results.get(BASELINE, {}).get(key)
        ratios = [(results[n].get(key) / base) if isinstance(base, (int, float)) and base and
                  isinstance(results[n].get(key), (int, float)) else None for n in others]
        lines.append(f"{label:28}" + "".join(f"{_fmt(v):>15}" for v in vals) +
                     "".join(f"{_fmt(r) + 'x' if r is not None else '-':>15}" for r in ratios))
    for n in names:
        refused = results[n].get("refused_by_class") or {}
        if refused:
            lines.append(f"refused {n}: " + ", ".join(f"{c} {s}: {k}" for c, by in sorted(refused.items())
                                                       for s, k in sorted(by.items())))
    lr = results.get(BASELINE, {})
    if lr.get("ceiling_hit_rate") and lr.get("prefix_hit_rate"):
        c = lr["ceiling_hit_rate"] / lr["prefix_hit_rate"]
        lines.append(f"ceiling / {BASELINE}: {lr['ceiling_hit_rate']:.3f} / {lr['prefix_hit_rate']:.3f} = {c:.2f}x "
                     f"(the most any picker's hit rate could be over {BASELINE}'s on this work"
                     + ("; 2x is out of reach)" if c < 2 else ")"))
    for n in names:           # the picker's decisions made on the headers alone (a live session's turn)
        phases = [e for e in results[n].get("epp") or [] if e and e.get("decisions")]
        if phases:
            lines.append(f"{n} picked on the headers: {sum(e.get('header_picks') or 0 for e in phases)} of "
                         f"{sum(e['decisions'] for e in phases)} decisions")
    picks = {n: results[n]["prompt_tokens_per_replica"] for n in names}
    lines.append("prompt tokens per replica: " + "; ".join(f"{n} {v}" for n, v in picks.items()))
    lines.append("load average (1 min) at the end of each phase: " +
                 "; ".join(f"{n} {', '.join(str(x) for x in results[n]['loadavg_1m'])}" for n in names))
    return "\n".join(lines)


def floors(results: dict[str, dict]) -> dict[str, dict]:
    out = {}
    lr, epp = results.get(BASELINE), results.get("epp")
    if lr and epp:
        if lr.get("prefix_hit_rate") is not None and epp.get("prefix_hit_rate") is not None:
            ratio = epp["prefix_hit_rate"] / lr["prefix_hit_rate"] if lr["prefix_hit_rate"] else float("inf")
            out["prefix_hit_rate >= 2x least_request"] = {"value": round(ratio, 3), "holds": ratio >= 2.0}
            if lr.get("ceiling_hit_rate") and lr["prefix_hit_rate"]:
                out["prefix_hit_rate >= 2x least_request"]["ceiling"] = round(
                    lr["ceiling_hit_rate"] / lr["prefix_hit_rate"], 3)
        if lr.get("ttft_p99_ms") and epp.get("ttft_p99_ms"):
            ratio = epp["ttft_p99_ms"] / lr["ttft_p99_ms"]
            out["ttft p99 <= least_request"] = {"value": round(ratio, 3), "holds": ratio <= 1.0}
    return out


def overhead_floor(over: dict | None) -> dict[str, dict]:
    return {"epp overhead p50 <= 1 ms": overhead_floor_of(over)} if over else {}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_epp", description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="chat", choices=sorted(PRESETS),
                   help="the workload's shape (default chat; shared-prompt: the earlier one, to compare)")
    p.add_argument("--rounds", type=int, default=1,
                   help="rounds of every variant, interleaved (default 1): a noisy minute hits all of them")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of " + ", ".join(VARIANTS))
    p.add_argument("--replicas", default="2,3", help="replica counts, comma-separated, each of 2 or 3 (default 2,3)")
    p.add_argument("--rate", type=float, default=None, help="sessions started per second (default: the preset's)")
    p.add_argument("--seconds", type=float, default=None,
                   help="sessions start over this long, per round (default: chat 30, shared-prompt 20)")
    p.add_argument("--think", type=float, default=None, help="seconds between an answer and the next turn")
    p.add_argument("--groups", type=int, default=None, help="distinct shared system prompts")
    p.add_argument("--kv-cache-mb", type=float, default=None,
                   help="each replica's KV-cache budget in MB (default: the preset's; " + ", ".join(
                       f"{k} {w.kv_cache_mb:g}" if w.kv_cache_mb is not None else f"{k} the pool's {w.kv_pool_mb:g} / replicas"
                       for k, w in PRESETS.items()) + ")")
    p.add_argument("--kv-pool-mb", type=float, default=None,
                   help="instead, the pool's KV budget in MB, split evenly over the replicas")
    p.add_argument("--quick", action="store_true", help="a smoke run: sessions start over 10 s")
    p.add_argument("--threads", type=int, default=1, help="each replica's intra-op threads (default 1)")
    p.add_argument("--metrics-interval-ms", type=float, default=None,
                   help="the picker's scrape interval (default: its own default)")
    p.add_argument("--overhead-requests", type=int, default=1000,
                   help="requests per target in the overhead measurement (0: skip it)")
    p.add_argument("--out", default=str(ROOT / "artifacts" / "bench" / "epp.json"))
    args = p.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variant(s): {', '.join(sorted(unknown))}")
    try:
        counts = [int(x) for x in args.replicas.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or any(n not in (2, 3) for n in counts):
        p.error("--replicas: a comma-separated list of 2 and/or 3")
    base = PRESETS[args.preset]
    seconds = 10.0 if args.quick and args.seconds is None else args.seconds or PRESET_SECONDS[args.preset]
    if args.kv_cache_mb is not None and args.kv_pool_mb is not None:
        p.error("--kv-cache-mb and --kv-pool-mb: give one (a replica's budget, or the pool's)")
    given = {k: v for k, v in (("rate", args.rate), ("think_s", args.think), ("groups", args.groups),
                               ("kv_cache_mb", args.kv_cache_mb), ("kv_pool_mb", args.kv_pool_mb)) if v is not None}
    if args.kv_pool_mb is not None:
        given["kv_cache_mb"] = None
    w = replace(base, **given)
    if (w.kv_cache_mb is not None and w.kv_cache_mb < 0) or (w.kv_cache_mb is None and not w.kv_pool_mb > 0):
        p.error("--kv-cache-mb must be at least 0 (0: no cache), --kv-pool-mb above 0")
    w = replace(w, sessions=max(1, int(w.rate * seconds)))
    print(f"preset {args.preset}: {w.sessions} sessions at {w.rate}/s, {w.turns[0]}-{w.turns[1]} turns, "
          f"{w.groups} system prompts, replicas {counts}, kv-cache "
          + ", ".join(f"{w.replica_kv_mb(n):g} MB each of {n}" for n in counts) + ", "
          f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    by_count: dict[int, dict] = {}
    for n in counts:
        phases: dict[str, list[dict]] = {v: [] for v in variants}
        for rnd in range(args.rounds):
            w_round = replace(w, seed=w.seed + rnd)      # each round new sessions, the same for every variant
            order = variants[rnd % len(variants):] + variants[:rnd % len(variants)]   # no variant always first
            for v in order:
                t = time.monotonic()
                ph = run_variant(v, w_round, n, args)
                phases[v].append(ph)
                ok = sum(1 for r in ph["results"] if r.status == 200 and not r.error)
                print(f"  {n} replicas, round {rnd + 1} {v}: {ok}/{len(ph['results'])} OK, hit rate "
                      f"{_fmt(ph['hits'] / ph['queries'] if ph['queries'] else None)}, working set "
                      f"{ph['working_set_tokens'] * KV_BYTES_PER_TOKEN / 2**20:.1f} MB, load average "
                      f"{ph['loadavg_1m']:.1f} ({time.monotonic() - t:.0f} s)", flush=True)
        results = {v: combine(v, phases[v]) for v in variants}
        by_count[n] = {"variants": results, "floors": floors(results), "kv_cache_mb": w.replica_kv_mb(n)}
    over = overhead(args.overhead_requests) if args.overhead_requests else None
    for n, r in by_count.items():
        print()
        print(table(r["variants"], f"{n} replicas ({args.preset}, {r['kv_cache_mb']:g} MB KV each)"))
    if over:
        print("\n" + overhead_table(over))
    print()
    for n, r in by_count.items():
        for name, f in r["floors"].items():
            ceiling = f" (ceiling {f['ceiling']})" if "ceiling" in f else ""
            print(f"floor {name} ({n} replicas, {args.preset}): {f['value']}{ceiling} -> "
                  f"{'holds' if f['holds'] else 'MISSED'}")
    for name, f in overhead_floor(over).items():
        print(f"floor {name}: {f['value']} -> {'holds' if f['holds'] else 'MISSED'}")
    doc = {"preset": args.preset, "workload": {**asdict(w), "replica_threads": args.threads},
           "kv_bytes_per_token": KV_BYTES_PER_TOKEN, "cpus": os.cpu_count(),
           "by_replicas": {str(n): r for n, r in by_count.items()}, "overhead": over,
           "overhead_floor": overhead_floor(over), "loadavg_end": [round(x, 2) for x in os.getloadavg()]}
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
