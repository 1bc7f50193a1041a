"""bench_loop_overload: the decision loop on vs off under the overload its policy is for
(issue #15), how long the loop's remap takes to reach Envoy, and how long a batcher policy
change takes to reach the replica's batches.

Stack (harness/loop_stack.py): control plane, Envoy with the header-contract Wasm filter
(ECDS), two `builtin:tiny-decoder` replicas (127.0.0.2/.3, a small KV budget so that the
traffic itself pushes them over 90 %), and, in the "on" rounds, `mcpctl scheduler run`
with its default policy (the seed table as a Wasm plugin: memory > 90 % -> standard is
served as batch for the hold).

1. overload: one open-loop arrival schedule (Poisson, fixed seed) of high-class requests
   (`X-LLM-Priority: high` -> interactive: mesh/qos.py's table of the seed's names; its batch
   slots weigh 3x and it freezes batch-class work while it waits) and Medium ones (no header:
   standard, the class the memory rule downgrades), at a rate above
   what the replicas generate, replayed loop off / loop on in alternating rounds on fresh
   replicas. Per class: p50/p99 latency, goodput (successful requests/s, tokens/s); total
   goodput; the floor (high p99 improves >= 2x, total goodput drops <= 10 %).
2. apply: overload -> Envoy applying the new class, once per "on" round (a replica's own
   /v1/load crossing 90 % -> the loop's decision -> the first request the gateway gives
   `batch`), and the control plane's part alone over many changes (POST
   /scheduler/class-remap -> first request seen as batch behind the gateway).
3. batcher: POST /admin/policy -> the first batch formed under the new policy at the replica
   (reported by the replica: /admin/status `policy_change`), over many changes, under a
   steady generation load; and the same from the loop's decision (a policy that alternates
   presets, carried by the loop's batcher-policy action). The seed's target: 17 ms.

`python -m benchmarks loop_overload` (the full run, ~3.7 min); with flags:
`python -m benchmarks.bench_loop_overload [--quick] [--rounds N] [--seconds S] [--sections overload,apply,batcher]`
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import threading
import time
import urllib.request

import aiohttp

from harness.loop_stack import LoopStack

KV_MB = "1"              # per replica: long standard generations fill it (as tests/e2e/test_decision_loop.py)
HIGH = {"prompt": 80, "max_tokens": 12, "headers": {"x-llm-priority": "high"}}
STANDARD = {"prompt": 600, "max_tokens": 48, "headers": {}}
TIMEOUT_S = 10.0         # a request not answered by then counts as failed


def _pct(v, q):
    if not v:
        return float("nan")
    s = sorted(v)
    return s[min(len(s) - 1, int(q * len(s)))]


def schedule(lead_s: float, seconds: float, high_rps: float, std_rps: float, lead_std_rps: float,
             seed: int = 15) -> list[tuple[float, str, int]]:
    """(offset s, class, index) for every request: two Poisson streams merged. Standard traffic
    comes at `lead_std_rps` for the first `lead_s` (below capacity: KV memory fills, nothing
    queues), then at `std_rps` for `seconds` (above capacity); high-class traffic is steady."""
    rng = random.Random(seed)
    out = []
    for name, phases in (("high", [(lead_s + seconds, high_rps)]),
                         ("standard", [(lead_s, lead_std_rps), (lead_s + seconds, std_rps)])):
        t, i = 0.0, 0
        for until, rate in phases:
            while True:
                gap = rng.expovariate(rate)
                if t + gap >= until:
                    t = until
                    break
                t += gap
                out.append((t, name, i))
                i += 1
    return sorted(out)


async def _one(session, gw_port: int, klass: str, i: int, due: float, out: list, tag: str):
    spec = HIGH if klass == "high" else STANDARD
    body = {"model": "tiny-decoder", "prompt": f"{tag} {klass} {i} " + "x" * spec["prompt"],
            "max_tokens": spec["max_tokens"], "temperature": 0}
    status, tokens = 0, 0
    try:
        async with session.post(f"http://127.0.0.1:{gw_port}/v1/completions", json=body,
                                headers={"host": "models.example.com", **spec["headers"]},
                                timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as r:
            status = r.status
            doc = await r.json(content_type=None)
            if status == 200:
                tokens = doc["usage"]["completion_tokens"]
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError):
        pass
    done = time.monotonic()
    out.append({"class": klass, "status": status, "tokens": tokens, "latency_s": done - due, "done": done})


async def replay(gw_port: int, sched, tag: str) -> tuple[list[dict], float, float]:
    """Send every request at its due time (open loop: whatever happened before); latency counts
    from the due time. -> (results, start, end of the last answer)."""
    out: list[dict] = []
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=conn) as session:
        start = time.monotonic() + 0.2
        tasks = []
        for off, klass, i in sched:
            due = start + off
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_one(session, gw_port, klass, i, due, out, tag)))
        await asyncio.gather(*tasks)
    return out, start, max((r["done"] for r in out), default=start)


def summarise(results: list[dict], start: float, end: float, window_s: float) -> dict:
    """Goodput is per second of the arrival window, the same for both variants (an answer that
    comes after it, within the timeout, still counts): the share of the offered load served."""
    wall = window_s
    row = {"window_s": window_s, "last_answer_s": round(end - start, 2)}
    for klass in ("high", "standard"):
        rs = [r for r in results if r["class"] == klass]
        ok = [r for r in rs if r["status"] == 200]
        lat = [r["latency_s"] * 1e3 for r in ok]
        # a request that failed (timed out, refused) counts as TIMEOUT_S: these percentiles are
        # lower bounds when any failed; *_answered are over the answered ones only
        every = lat + [TIMEOUT_S * 1e3] * (len(rs) - len(ok))
        row[klass] = {"sent": len(rs), "ok": len(ok), "failed": len(rs) - len(ok),
                      "statuses": sorted({r["status"] for r in rs if r["status"] != 200}),
                      "p50_ms": round(_pct(every, 0.5), 1), "p99_ms": round(_pct(every, 0.99), 1),
                      "p50_answered_ms": round(_pct(lat, 0.5), 1), "p99_answered_ms": round(_pct(lat, 0.99), 1),
                      "ok_rps": round(len(ok) / wall, 3), "tokens_s": round(sum(r["tokens"] for r in ok) / wall, 2)}
    row["total"] = {"ok_rps": round(row["high"]["ok_rps"] + row["standard"]["ok_rps"], 3),
                    "tokens_s": round(row["high"]["tokens_s"] + row["standard"]["tokens_s"], 2)}
    return row


class OverloadWatch:
    """During an "on" round: when a replica's own /v1/load first crossed 90 % of its KV budget,
    and when the gateway first gave an anonymous request `batch` (polled every 10 ms)."""

    def __init__(self, stack: LoopStack):
        self.stack, self.over_at, self.batch_at = stack, None, None
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._watch_load, daemon=True),
                         threading.Thread(target=self._watch_gateway, daemon=True)]
        for t in self._threads:
            t.start()

    def _watch_load(self):
        while not self._stop.is_set() and self.over_at is None:
            for ep in self.stack.endpoints:
                try:
                    with urllib.request.urlopen(f"http://{ep}/v1/load", timeout=1) as r:
                        doc = json.loads(r.read())
                    if doc.get("kv_cache_bytes", 0) > 0.9 * max(1, doc.get("kv_cache_capacity_bytes", 0)):
                        self.over_at = time.time()
                except (OSError, ValueError):
                    pass
            self._stop.wait(0.01)

    def _watch_gateway(self):
        while not self._stop.is_set() and self.batch_at is None:
            if self.stack.qos_seen(timeout=2) == "batch":
                self.batch_at = time.time()
            self._stop.wait(0.01)

    def stop(self):
        self._stop.set()
        for t in self._threads:
            t.join(3)


def overload_section(stack: LoopStack, rounds: int, lead_s: float, seconds: float, high_rps: float,
                     std_rps: float, lead_std_rps: float, policy_args: list[str]) -> dict:
    sched = schedule(lead_s, seconds, high_rps, std_rps, lead_std_rps)
    runs = {"off": [], "on": []}
    apply = []
    for rnd in range(rounds):
        order = ("off", "on") if rnd % 2 == 0 else ("on", "off")
        for variant in order:
            stack.restart_replicas()
            stack.clear_remaps()
            loop = watch = None
            if variant == "on":
                loop = stack.start_loop(*policy_args)
                deadline = time.monotonic() + 120
                while loop.status()["cycles"] < 3:
                    assert time.monotonic() < deadline, "the loop never cycled"
                    time.sleep(0.1)
                watch = OverloadWatch(stack)
            load0 = os.getloadavg()[0]
            try:
                results, start, end = asyncio.run(replay(stack.gw_port, sched, f"{variant}{rnd}"))
            finally:
                if watch:
                    watch.stop()
                if loop:
                    st = loop.status()
                    loop.stop()
            row = {"variant": variant, "round": rnd, "loadavg": [round(load0, 2), round(os.getloadavg()[0], 2)],
                   **summarise(results, start, end, lead_s + seconds)}
            if loop:
                remap = next((d for d in st["decisions"] for a in d.get("actions", [])
                              if a["kind"] == "remap-class" and a.get("applied") and not a.get("unchanged")), None)
                row["remap_decided"] = remap is not None
                if remap and watch.over_at and watch.batch_at:
                    apply.append({"round": rnd, "over_to_decision_ms": round((remap["at"] - watch.over_at) * 1e3, 1),
                                  "decision_to_envoy_ms": round((watch.batch_at - remap["at"]) * 1e3, 1),
                                  "over_to_envoy_ms": round((watch.batch_at - watch.over_at) * 1e3, 1)})
            runs[variant].append(row)
            h, s = row["high"], row["standard"]
            print(f"  round {rnd} loop {variant:>3}: high p50/p99 {h['p50_ms']:.0f}/{h['p99_ms']:.0f} ms "
                  f"ok {h['ok']}/{h['sent']}; standard p50/p99 {s['p50_ms']:.0f}/{s['p99_ms']:.0f} ms ok {s['ok']}/{s['sent']}; "
                  f"tokens/s {row['total']['tokens_s']:.0f}; load {row['loadavg']}"
                  + (f"; remap {'yes' if row.get('remap_decided') else 'NO'}" if loop else ""), flush=True)
    stack.clear_remaps()
    return {"schedule": {"lead_s": lead_s, "lead_standard_rps": lead_std_rps, "seconds": seconds,
                         "high_rps": high_rps, "standard_rps": std_rps, "requests": len(sched),
                         "high": HIGH, "standard": STANDARD, "timeout_s": TIMEOUT_S, "kv_cache_mb": KV_MB},
            "runs": runs, "apply": apply}


def apply_section(stack: LoopStack, changes: int) -> dict:
    """The control plane's part of a remap: POST /scheduler/class-remap -> the first anonymous
    request the gateway gives `batch` (polled back to back), then DELETE -> `standard` again."""
    out = {"to_batch_ms": [], "back_ms": []}
    for _ in range(changes):
        t0 = time.monotonic()
        code, text = stack.cp.post("/scheduler/class-remap", {"from": "standard", "to": "batch",
                                                               "expires_at": time.time() + 60})
        assert code == 200, text
        while stack.qos_seen() != "batch":
            assert time.monotonic() - t0 < 10, "the remap never reached Envoy"
        out["to_batch_ms"].append((time.monotonic() - t0) * 1e3)
        t0 = time.monotonic()
        stack.clear_remaps()
        while stack.qos_seen() != "standard":
            assert time.monotonic() - t0 < 10, "the remap was never removed"
        out["back_ms"].append((time.monotonic() - t0) * 1e3)
        time.sleep(0.05)
    return out


class SteadyLoad:
    """Closed-loop generations straight to one replica (2 at a time), so that batches keep
    forming while its policy changes; in a thread of its own."""

    def __init__(self, endpoint: str, concurrency: int = 2):
        self.endpoint, self.concurrency, self.done = endpoint, concurrency, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    async def _run(self):
        async with aiohttp.ClientSession() as session:
            async def worker(w):
                i = 0
                while not self._stop.is_set():
                    i += 1
                    body = {"model": "tiny-decoder", "prompt": f"steady {w} {i} " + "y" * 40, "max_tokens": 24,
                            "temperature": 0}
                    try:
                        async with session.post(f"http://{self.endpoint}/v1/completions", json=body) as r:
                            await r.read()
                            self.done += 1
                    except aiohttp.ClientError:
                        await asyncio.sleep(0.05)
            await asyncio.gather(*(worker(w) for w in range(self.concurrency)))

    def stop(self):
        self._stop.set()
        self._thread.join(10)


PRESETS = ("throughput", "balanced")
ALTERNATING_POLICY = """
from mcp26.scheduler.decisions import Action
ENDPOINT, EVERY = {endpoint!r}, {every}
state = {{"n": 0}}
def decide(signals):
    # a batcher-policy change every EVERY periods, alternating two presets
    state["n"] += 1
    if state["n"] % EVERY:
        return []
    return [Action("batcher-policy", ENDPOINT, {presets!r}[(state["n"] // EVERY) % 2], reason="benchmark")]
"""


def _changes(replica) -> list[dict]:
    code, doc = replica.admin("/admin/status")
    assert code == 200, doc
    return next(iter(doc["policy_changes"].values()))


def batcher_section(stack: LoopStack, changes: int, loop_changes: int) -> dict:
    """POST /admin/policy -> the first batch formed under it (the replica's own record), many
    times under a steady load; then the same from the loop's decision (cycle start)."""
    replica = stack.replicas[0]
    load = SteadyLoad(stack.endpoints[0])
    out = {"admin": [], "loop": []}
    try:
        time.sleep(1.0)
        for k in range(changes):
            t0 = time.time()
            code, doc = replica.admin("/admin/policy", {"qosPolicy": PRESETS[k % 2]})
            answered = time.time()
            assert code == 200, doc
            gen = next(iter(doc["generation"].values()))
            deadline = time.monotonic() + 10
            while True:
                rec = next((c for c in _changes(replica) if c["generation"] == gen), None)
                if rec and rec["first_batch_at"]:
                    break
                assert time.monotonic() < deadline, f"no batch formed under policy generation {gen}"
                time.sleep(0.005)
            out["admin"].append({"call_to_first_batch_ms": (rec["first_batch_at"] - t0) * 1e3,
                                 "applied_to_first_batch_ms": (rec["first_batch_at"] - rec["applied_at"]) * 1e3,
                                 "call_to_applied_ms": (rec["applied_at"] - t0) * 1e3,
                                 "call_answered_ms": (answered - t0) * 1e3})
            time.sleep(0.03)
        if loop_changes:
            with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
                f.write(ALTERNATING_POLICY.format(endpoint=stack.endpoints[0], every=2, presets=PRESETS))
            before = {c["generation"] for c in _changes(replica)}
            loop = stack.start_loop("--policy", f"python:{f.name}", "--replica-admin",
                                    f"{stack.endpoints[0]}=127.0.0.1:{replica.admin_port}")
            try:
                deadline = time.monotonic() + 60 + loop_changes * 2
                seen: dict[int, dict] = {}          # by cycle: status keeps only the last 20 decisions
                while len(seen) < loop_changes and time.monotonic() < deadline:
                    for d in loop.status()["decisions"]:
                        if any(a["kind"] == "batcher-policy" and a.get("applied") for a in d.get("actions", [])):
                            seen[d["cycle"]] = d
                    time.sleep(0.2)
                decided = list(seen.values())
            finally:
                loop.stop()
                os.unlink(f.name)
            time.sleep(0.5)
            recs = {c["generation"]: c for c in _changes(replica) if c["generation"] not in before}
            for d in decided:
                a = next(a for a in d["actions"] if a["kind"] == "batcher-policy")
                rec = recs.get(a.get("generation") and next(iter(a["generation"].values())))
                if rec and rec["first_batch_at"]:
                    out["loop"].append({"decision_to_first_batch_ms": (rec["first_batch_at"] - d["at"]) * 1e3,
                                        "post_ms": a["ms"], "policy_call_ms": d["call_ms"]})
    finally:
        load.stop()
    out["steady_requests"] = load.done
    return out


def _stats(xs) -> str:
    return f"{_pct(xs, 0.5):8.2f} {_pct(xs, 0.99):8.2f} {max(xs) if xs else float('nan'):8.2f} {len(xs):>5}"


def _median(xs):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def print_overload(doc: dict) -> dict:
    runs = doc["runs"]
    agg = {}
    for v in ("off", "on"):
        rs = runs[v]
        agg[v] = {"high_p50": _median([r["high"]["p50_ms"] for r in rs]), "high_p99": _median([r["high"]["p99_ms"] for r in rs]),
                  "std_p50": _median([r["standard"]["p50_ms"] for r in rs]), "std_p99": _median([r["standard"]["p99_ms"] for r in rs]),
                  "high_p99_ans": _median([r["high"]["p99_answered_ms"] for r in rs]),
                  "std_p99_ans": _median([r["standard"]["p99_answered_ms"] for r in rs]),
                  "high_rps": _median([r["high"]["ok_rps"] for r in rs]), "std_rps": _median([r["standard"]["ok_rps"] for r in rs]),
                  "high_tok": _median([r["high"]["tokens_s"] for r in rs]), "std_tok": _median([r["standard"]["tokens_s"] for r in rs]),
                  "tot_rps": _median([r["total"]["ok_rps"] for r in rs]), "tot_tok": _median([r["total"]["tokens_s"] for r in rs]),
                  "high_failed": sum(r["high"]["failed"] for r in rs), "std_failed": sum(r["standard"]["failed"] for r in rs)}
    names = [("high p50 (ms)", "high_p50"), ("high p99 (ms)", "high_p99"), ("high p99 answered only", "high_p99_ans"),
             ("standard p50 (ms)", "std_p50"), ("standard p99 (ms)", "std_p99"), ("standard p99 answered only", "std_p99_ans"),
             ("high ok req/s", "high_rps"), ("high tokens/s", "high_tok"),
             ("standard ok req/s", "std_rps"), ("standard tokens/s", "std_tok"), ("total ok req/s", "tot_rps"),
             ("total tokens/s", "tot_tok"), ("high failed (all rounds)", "high_failed"),
             ("standard failed (all rounds)", "std_failed")]
    print(f"\n{'medians over rounds':<30} {'loop off':>10} {'loop on':>10} {'on/off':>8}   (latency from the due "
          f"time; a failed request counts as {TIMEOUT_S:.0f} s; goodput per second of the arrival window)")
    for label, k in names:
        a, b = agg["off"][k], agg["on"][k]
        print(f"{label:<30} {a:>10.1f} {b:>10.1f} {b / a if a else float('nan'):>7.2f}x")
    p99_gain = agg["off"]["high_p99"] / max(1e-9, agg["on"]["high_p99"])
    drop_rps = 1 - agg["on"]["tot_rps"] / max(1e-9, agg["off"]["tot_rps"])
    drop_tok = 1 - agg["on"]["tot_tok"] / max(1e-9, agg["off"]["tot_tok"])
    ok = p99_gain >= 2 and drop_rps <= 0.10 and drop_tok <= 0.10
    print(f"floor: high-class p99 improved {p99_gain:.2f}x (>= 2x), total goodput change "
          f"{-drop_rps:+.1%} req/s, {-drop_tok:+.1%} tokens/s (drop <= 10 %): {'MET' if ok else 'MISSED'}")
    return {"medians": agg, "high_p99_improvement": round(p99_gain, 3), "goodput_drop_rps": round(drop_rps, 4),
            "goodput_drop_tokens": round(drop_tok, 4), "floor_met": ok}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench_loop_overload")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1 round of 3 + 6 s, fewer changes")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--lead-seconds", type=float, default=4.0, help="standard below capacity first")
    ap.add_argument("--seconds", type=float, default=14.0, help="then overload for this long")
    ap.add_argument("--high-rps", type=float, default=2.0)
    ap.add_argument("--lead-standard-rps", type=float, default=6.0)
    ap.add_argument("--standard-rps", type=float, default=24.0)
    ap.add_argument("--policy", default=None, help="the loop's --policy (default: its own, the Wasm seed table)")
    ap.add_argument("--sections", default="overload,apply,batcher")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.lead_seconds, args.seconds = 1, 3.0, 6.0
    sections = set(args.sections.split(","))
    policy_args = ["--policy", args.policy] if args.policy else []
    out = {"started": time.time(), "loadavg_start": os.getloadavg()}
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    with LoopStack(replica_args=("--kv-cache-mb", KV_MB)) as stack:
        if "overload" in sections:
            print(f"overload: {args.rounds} round(s) x (off, on); high {args.high_rps}/s throughout; standard "
                  f"{args.lead_standard_rps}/s for {args.lead_seconds:.0f} s then {args.standard_rps}/s for "
                  f"{args.seconds:.0f} s", flush=True)
            doc = overload_section(stack, args.rounds, args.lead_seconds, args.seconds, args.high_rps,
                                   args.standard_rps, args.lead_standard_rps, policy_args)
            doc["summary"] = print_overload(doc)
            out["overload"] = doc
        if "apply" in sections:
            n = 5 if args.quick else 30
            doc = apply_section(stack, n)
            applied = out.get("overload", {}).get("apply", [])
            print(f"\noverload -> Envoy applying the new class (ms)       {'p50':>8} {'p99':>8} {'max':>8} {'n':>5}")
            print(f"{'replica over 90 % -> loop decision (on rounds)':<50} "
                  + _stats([a["over_to_decision_ms"] for a in applied]))
            print(f"{'loop decision -> Envoy gives batch (on rounds)':<50} "
                  + _stats([a["decision_to_envoy_ms"] for a in applied]))
            print(f"{'replica over 90 % -> Envoy gives batch':<50} " + _stats([a["over_to_envoy_ms"] for a in applied]))
            print(f"{'control plane POST remap -> Envoy gives batch':<50} " + _stats(doc["to_batch_ms"]))
            print(f"{'control plane DELETE remap -> Envoy standard':<50} " + _stats(doc["back_ms"]))
            out["apply"] = {**doc, "during_overload": applied, "loadavg": os.getloadavg()}
        if "batcher" in sections:
            stack.restart_replicas()
            n, m = (8, 3) if args.quick else (60, 12)
            doc = batcher_section(stack, n, m)
            adm, lp = doc["admin"], doc["loop"]
            print(f"\nbatcher policy change -> first batch under it (ms)  {'p50':>8} {'p99':>8} {'max':>8} {'n':>5}"
                  f"   (seed: 17 ms; load average {os.getloadavg()[0]:.2f})")
            print(f"{'admin POST sent -> first batch':<50} " + _stats([a["call_to_first_batch_ms"] for a in adm]))
            print(f"{'  of which POST sent -> applied':<50} " + _stats([a["call_to_applied_ms"] for a in adm]))
            print(f"{'  of which applied -> first batch':<50} " + _stats([a["applied_to_first_batch_ms"] for a in adm]))
            print(f"{'admin POST answered (client)':<50} " + _stats([a["call_answered_ms"] for a in adm]))
            print(f"{'loop cycle start (decision) -> first batch':<50} "
                  + _stats([a["decision_to_first_batch_ms"] for a in lp]))
            p50 = _pct([a["call_to_first_batch_ms"] for a in adm], 0.5)
            print(f"vs the seed's 17 ms: admin call -> first batch p50 {p50:.2f} ms = {p50 / 17:.2f}x")
            out["batcher"] = {**doc, "loadavg": os.getloadavg()}
    out["loadavg_end"] = os.getloadavg()
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    os.makedirs("artifacts/bench", exist_ok=True)
    with open("artifacts/bench/loop_overload.json", "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
