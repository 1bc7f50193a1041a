"""What translate() costs per proxy, and what sharing work between proxies buys.

The synthetic mesh of benchmarks/xds_config.py (N services x 10 routes: a
ServiceEntry with STATIC endpoints, a DestinationRule with two subsets, a
VirtualService on a gateway) is translated, side by side in one run, for
each proxy kind (gateway `router`, `sidecar`, proxyless `grpc`):

  cold      a config object translate() has never seen: index, clusters and
            route configurations all built (what one proxy alone would cost)
  shared    the next 100 proxies of the same shape (different ids): the
            per-config and per-shape work is reused, listeners/seams per node
  labels    100 gateways that differ in an unrelated label: still one shape

for N = 100 and N = 1,000 (median of 5 cold runs, after a warm-up). Ratios: cold per proxy /
shared per proxy (what the cache saves), and 1,000/100 cold scaling (10 =
linear). Times are this process's CPU seconds. Run from the repo root: `python -m benchmarks xds_translate`;
writes artifacts/bench/xds_translate.json.
"""
from __future__ import annotations

import json
import os
import pathlib
import statistics
import sys
import time

from benchmarks.xds_config import GATEWAY, service_yaml
from mcp26.mesh.resources import MeshConfig
from mcp26.mesh.parse import parse_documents
from mcp26.xds import telemetry
from mcp26.xds.translate import Translator
from mcp26.xds.model.type_urls import CLUSTER, ROUTE
from mcp26.xds.model.node import ProxyNode

SIZES = (100, 1000)
PROXIES = 100
RUNS = 5
KINDS = ("router", "sidecar", "grpc")
LABELS = {"istio": "ingressgateway"}
# CPU time of this process: translate() is single-threaded CPU work, and on a
# shared machine wall time mostly measures the neighbours.
clock = time.process_time
# As the control plane translates: its spans recorded (a Translator given no tracer records none).
TRACER = telemetry.tracer()


def mesh_text(services: int) -> str:
    return "---\n".join([GATEWAY.format(port=8080)] + [service_yaml(i) for i in range(services)])


def node(kind: str, i: int, extra: dict | None = None) -> ProxyNode:
    return ProxyNode(f"{kind}~127.0.0.{i % 250}~p{i}.default~default.svc.cluster.local", kind=kind,
                     labels={**LABELS, **(extra or {})})


def measure(resources: list, kind: str) -> dict:
    colds = []
    for _ in range(RUNS):
        config = MeshConfig(list(resources))     # a new config object: nothing of it cached,
        translator = Translator(tracer=TRACER)   # nor reused from the previous run's (incremental path)
        t0 = clock()
        snap = translator.translate(config, node(kind, 0))
        colds.append(clock() - t0)
    t0 = clock()
    for i in range(1, PROXIES + 1):
        translator.translate(config, node(kind, i))
    shared = (clock() - t0) / PROXIES
    t0 = clock()
    for i in range(1, PROXIES + 1):
        translator.translate(config, node(kind, i, {"pod": f"p{i}"}))
    labels = (clock() - t0) / PROXIES
    routes = sum(len(vh.routes) for rc in snap[ROUTE].values() for vh in rc.virtual_hosts)
    return {"cold_s": statistics.median(colds), "shared_per_proxy_s": shared, "labels_per_proxy_s": labels,
            "clusters": len(snap[CLUSTER]), "routes": routes}


def main() -> int:
    results = {}
    # Warm-up: the first call also imports and builds protobuf descriptors.
    warm = parse_documents(mesh_text(5), "warm.yaml")
    for kind in KINDS:
        Translator(tracer=TRACER).translate(MeshConfig(list(warm)), node(kind, 0))
    for n in SIZES:
        resources = parse_documents(mesh_text(n), "bench.yaml")
        for kind in KINDS:
            results[f"{n}/{kind}"] = measure(resources, kind)
    print(f"{'services':>8} {'kind':>8} {'routes':>7} {'clusters':>8} {'cold cpu s':>10} {'shared ms':>10} "
          f"{'labels ms':>10} {'cold/shared':>12} {'100 proxies s':>14}")
    for key, r in results.items():
        n, kind = key.split("/")
        r["cold_over_shared"] = r["cold_s"] / r["shared_per_proxy_s"]
        r["proxies_100_s"] = r["cold_s"] + (PROXIES - 1) * r["shared_per_proxy_s"]
        print(f"{n:>8} {kind:>8} {r['routes']:>7} {r['clusters']:>8} {r['cold_s']:>10.3f} "
              f"{r['shared_per_proxy_s'] * 1e3:>10.3f} {r['labels_per_proxy_s'] * 1e3:>10.3f} "
              f"{r['cold_over_shared']:>11.0f}x {r['proxies_100_s']:>14.3f}")
    for kind in KINDS:
        scale = results[f"1000/{kind}"]["cold_s"] / results[f"100/{kind}"]["cold_s"]
        results[f"scaling/{kind}"] = {"cold_1000_over_100": scale}
        print(f"cold scaling 1,000/100 services ({kind}): {scale:.1f} (10 = linear)")
    out = pathlib.Path("artifacts/bench")
    out.mkdir(parents=True, exist_ok=True)
    (out / "xds_translate.json").write_text(json.dumps(results, indent=2))
    print(f"wrote {out / 'xds_translate.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
