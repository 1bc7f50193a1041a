"""bench_qos_rules: the seed's priority table enforced (issue #43), through a real Envoy with the
header contract in front of a model server that honours only signed classes
(harness/qos_stack.py), each rule against itself switched off, side by side on one stack:

1. share: 24 High + 24 Medium closed-loop clients; batch slots per class (the server's count)
   with the weighted share (High weighs 3x the default) and with Triton's strict level order.
   Floor: the High:Medium slot ratio within 10 % of 3:1.
2. freeze: 24 Low clients saturate the server, 4 High clients beside them; High p50/p99 with
   Low frozen while High waits and without (policy switched between rounds).
3. lane: one Critical client beside 24 Low ones; Critical p50/p99 with the reserved lane of 2
   threads and without it.

`python -m benchmarks qos_rules [--seconds S] [--rounds N]`; writes artifacts/bench/qos_rules.json.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import sys
import time

from harness.qos_stack import QosStack, closed_loop, pct

BASE = {"maxBatchSize": 8, "maxQueueDelayMicroseconds": 500, "reservedLaneLevels": 1}
OUT = pathlib.Path(__file__).resolve().parent.parent / "artifacts" / "bench" / "qos_rules.json"


def _slots(s) -> dict:
    return s.status()["qos_share"]["slots_by_level"]


def share(s, seconds: float) -> dict:
    out = {}
    for name, spec in (("weighted", BASE), ("strict", {**BASE, "weightedShare": False})):
        s.set_policy(spec)
        before = _slots(s)
        res = asyncio.run(closed_loop(s.gw_port, {"high": 24, "medium": 24}, seconds))
        after = _slots(s)
        d = {lv: after.get(lv, 0) - before.get(lv, 0) for lv in after}
        out[name] = {"high_slots": d.get("2", 0), "medium_slots": d.get("3", 0),
                     "ratio": round(d.get("2", 0) / max(1, d.get("3", 0)), 3),
                     "high_p99_ms": round(pct(res["high"]["latencies_ms"], 0.99), 2),
                     "medium_p99_ms": round(pct(res["medium"]["latencies_ms"], 0.99), 2),
                     "errors": sum(n for r in res.values() for st, n in r["statuses"].items() if st != 200)}
    s.set_policy(BASE)
    return out


def _beside_low(s, fg: dict, seconds: float) -> dict:
    async def run():
        low = asyncio.create_task(closed_loop(s.gw_port, {"low": 24}, seconds + 0.5))
        await asyncio.sleep(0.5)
        res = await closed_loop(s.gw_port, fg, seconds)
        low_res = await low
        return res, low_res
    res, low = asyncio.run(run())
    (k,) = fg
    lat = res[k]["latencies_ms"]
    return {"p50_ms": round(pct(lat, 0.5), 2), "p99_ms": round(pct(lat, 0.99), 2), "answered": len(lat),
            "low_answered": len(low["low"]["latencies_ms"]),
            "errors": sum(n for r in (res[k], low["low"]) for st, n in r["statuses"].items() if st != 200)}


def freeze(s, seconds: float, rounds: int) -> dict:
    out = {"on": [], "off": []}
    for _ in range(rounds):
        for name, spec in (("on", BASE), ("off", {**BASE, "freezeLowPriority": False})):
            s.set_policy(spec)
            out[name].append(_beside_low(s, {"high": 4}, seconds))
    s.set_policy(BASE)
    return out


def lane(s, seconds: float, rounds: int) -> dict:
    out = {"lane": [], "no lane": []}
    for _ in range(rounds):
        for name, spec in (("lane", BASE), ("no lane", {**BASE, "reservedLaneLevels": 0})):
            s.set_policy(spec)
            out[name].append(_beside_low(s, {"critical": 1}, seconds))
    s.set_policy(BASE)
    return out


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench_qos_rules")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    doc = {"started": time.time(), "loadavg_start": os.getloadavg(), "seconds": args.seconds, "rounds": args.rounds}
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    with QosStack(BASE) as s:
        asyncio.run(closed_loop(s.gw_port, {"medium": 8}, 1.0))          # warm-up
        doc["share"] = share(s, args.seconds)
        doc["freeze"] = freeze(s, args.seconds, args.rounds)
        doc["lane"] = lane(s, args.seconds, args.rounds)
    doc["loadavg_end"] = os.getloadavg()
    sh = doc["share"]
    print(f"\n{'share (24 High + 24 Medium)':<34} {'High slots':>10} {'Medium':>8} {'ratio':>7} {'High p99':>9} {'Med p99':>8}")
    for k in ("weighted", "strict"):
        r = sh[k]
        print(f"{k:<34} {r['high_slots']:>10} {r['medium_slots']:>8} {r['ratio']:>7.2f} {r['high_p99_ms']:>9.1f} "
              f"{r['medium_p99_ms']:>8.1f}")
    share_ok = abs(sh["weighted"]["ratio"] - 3.0) <= 0.3
    print(f"floor: weighted High:Medium slots {sh['weighted']['ratio']:.2f} within 10 % of 3:1: "
          f"{'MET' if share_ok else 'MISSED'}")
    for title, section, a, b in (("High beside 24 Low", "freeze", "on", "off"),
                                 ("Critical beside 24 Low", "lane", "lane", "no lane")):
        rs = doc[section]
        p50 = {k: _median([r["p50_ms"] for r in rs[k]]) for k in (a, b)}
        p99 = {k: _median([r["p99_ms"] for r in rs[k]]) for k in (a, b)}
        low = {k: _median([r["low_answered"] for r in rs[k]]) for k in (a, b)}
        print(f"\n{title + ' (medians of rounds)':<34} {a:>10} {b:>10} {b + '/' + a:>12}")
        print(f"{'p50 (ms)':<34} {p50[a]:>10.1f} {p50[b]:>10.1f} {p50[b] / p50[a]:>11.2f}x")
        print(f"{'p99 (ms)':<34} {p99[a]:>10.1f} {p99[b]:>10.1f} {p99[b] / p99[a]:>11.2f}x")
        print(f"{'Low answered':<34} {low[a]:>10.0f} {low[b]:>10.0f} {low[b] / max(1, low[a]):>11.2f}x")
        doc[section + "_summary"] = {"p50_ms": p50, "p99_ms": p99, "low_answered": low}
    errors = sh["weighted"]["errors"] + sh["strict"]["errors"] + sum(
        r["errors"] for sec in ("freeze", "lane") for rs in doc[sec].values() for r in rs)
    print(f"\nerrors: {errors}; load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    doc["floor_met"] = share_ok
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, indent=1))
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
