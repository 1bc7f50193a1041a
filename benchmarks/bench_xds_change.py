"""What one endpoint change costs the control plane next to a large mesh, incremental vs from scratch.

The scale benchmark's mesh (benchmarks/xds_config.py: 1,000 services x 10
routes, ServiceEntry + DestinationRule + VirtualService each) and its churn:
each change rewrites the endpoint ports of 10 services (1 %). Per change, CPU
of this process (time.process_time), median of --changes:

  load    the control plane's loader (xds.incremental_load: re-parses
          the 10 files, re-validates their resources, re-runs only the
          analyzers that read endpoints) vs mesh.change_set.load_config
          (everything, as at start-up)
  build   SnapshotCache.build for --shapes node shapes with the server's
          Translator kept (the previous config's translation reused: EDS
          only) vs a fresh Translator (a full translation), with the
          selections and Delta diffs the server's streams would ask for
          prepared in it (one subscription per shape and type, to every
          resource of it, holding the previous config's)

Run from the repo root: `python -m benchmarks xds_change` (~40 s); writes
artifacts/bench/xds_change.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from benchmarks.xds_config import service_yaml, write_mesh
from benchmarks.xds_load_clients import node
from mcp26.demo.stack.control_plane import write_config
from mcp26.mesh.change_set import load_config
from mcp26.xds import telemetry
from mcp26.xds.cache import WILDCARD_TYPES, SnapshotCache, subscription_key
from mcp26.xds.incremental_load import IncrementalLoader
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.translate import Translator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_ms(fn):
    t = time.process_time()
    out = fn()
    return out, 1e3 * (time.process_time() - t)


def subscriptions(snapshots: dict) -> list[tuple]:
    """What the hub would list (AdsHub.subscriptions) with a Delta client of every shape holding
    every resource of `snapshots`, each type subscribed by name (wildcard for CDS and LDS)."""
    out = []
    for key, snap in snapshots.items():
        for type_url, have in snap.resources.items():
            wildcard, names = type_url in WILDCARD_TYPES, frozenset(have)
            sub_key = subscription_key(wildcard, names)
            out.append((key, type_url, wildcard, names, sub_key, snap.selection(type_url, wildcard, names, sub_key)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--services", type=int, default=1000)
    ap.add_argument("--shapes", type=int, default=20)
    ap.add_argument("--changes", type=int, default=5)
    ap.add_argument("--json", default=os.path.join(ROOT, "artifacts", "bench", "xds_change.json"))
    a = ap.parse_args(argv)
    nodes = [ProxyNode.from_proto(node(i, "scale-gw", {"istio": "ingressgateway"}, a.shapes))
             for i in range(a.shapes)]
    per = max(1, a.services // 100)
    rows = {k: [] for k in ("load incremental", "load full", "build kept", "build fresh")}
    with tempfile.TemporaryDirectory() as d:
        write_mesh(d, a.services, 10, 18080)
        loader, cache = IncrementalLoader(), SnapshotCache(Translator(tracer=telemetry.tracer()).translate)
        config = loader(d)
        snaps = cache.build(config, "g0", nodes)
        cache.install(config, "g0", snaps)
        subs = subscriptions(snaps)
        for change in range(1, a.changes + 1):
            for k in range(per):
                i = (change * per + k) % a.services
                write_config(d, f"svc-{i:04d}.yaml", service_yaml(i, ports=(30000 + change, 31000 + change)))
            config, ms = cpu_ms(lambda: loader(d))
            rows["load incremental"].append(ms)
            rows["load full"].append(cpu_ms(lambda: load_config(d))[1])
            snaps, ms = cpu_ms(lambda: cache.build(config, f"g{change}", nodes, subs))
            rows["build kept"].append(ms)
            fresh = SnapshotCache(Translator(tracer=telemetry.tracer()).translate)
            rows["build fresh"].append(cpu_ms(lambda: fresh.build(config, f"g{change}", nodes, subs))[1])
            cache.install(config, f"g{change}", snaps)
            subs = subscriptions(snaps)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"{a.services} services x 10 routes, {per} services' endpoints per change, {a.shapes} node shapes; "
          f"CPU ms per change, median of {a.changes} (load average {os.getloadavg()[0]:.1f})")
    print(f"{'stage':<8}{'incremental':>14}{'from scratch':>15}{'ratio':>8}")
    for stage, inc, full in (("load", "load incremental", "load full"), ("build", "build kept", "build fresh"),
                             ("total", None, None)):
        i = med[inc] if inc else med["load incremental"] + med["build kept"]
        f = med[full] if full else med["load full"] + med["build fresh"]
        print(f"{stage:<8}{i:>14.0f}{f:>15.0f}{i / f:>8.2f}")
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as fh:
        json.dump({"services": a.services, "shapes": a.shapes, "per_change": per, "ms": rows, "median_ms": med}, fh,
                  indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
