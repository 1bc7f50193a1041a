"""RBAC filter cost per request: `python -m benchmarks rbac`.

One Envoy per variant, all answering a direct response (no upstream, so the
filter is most of the difference): no RBAC filter, and translate's RBAC
filters for an ALLOW policy of 0 (an empty rule `{}`: allow all), 10 and 100
rules, each rule a path + method + header condition that does not match,
the last rule the one that does. Requests go one at a time over one
keep-alive connection; p50/p99 latency per variant and the ratio to no
filter, measured side by side in one run (variants interleaved in rounds so
machine noise spreads over all). Writes artifacts/bench/rbac.json.
"""
from __future__ import annotations

import http.client
import json
import pathlib
import statistics
import sys
import time

import yaml
from google.protobuf import json_format

from mcp26.demo.stack.envoy import Envoy
from mcp26.demo.stack.ports import free_port
from mcp26.mesh.change_set import load_texts
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.translate import Phase, rbac

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "artifacts" / "bench" / "rbac.json"
REQUESTS, ROUNDS = 3000, 10
NODE = ProxyNode("router~127.0.0.1~gw.shop~shop.svc.cluster.local", namespace="shop")


def policy(n: int) -> str:
    rules = [{"to": [{"operation": {"paths": [f"/never/{i}/*"], "methods": ["POST"]}}],
              "when": [{"key": "request.headers[x-tenant]", "values": [f"t{i}"]}]} for i in range(n - 1)]
    rules.append({"to": [{"operation": {"paths": ["/bench"], "methods": ["GET"]}}]} if n else {})
    spec = {"rules": rules}
    return yaml.safe_dump({"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
                           "metadata": {"name": f"allow-{n}", "namespace": "shop"}, "spec": spec})


def bootstrap(port: int, filters: list) -> dict:
    hcm = {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
                    "HttpConnectionManager", "stat_prefix": "bench",
           "route_config": {"virtual_hosts": [{"name": "b", "domains": ["*"], "routes": [
               {"match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": "ok"}}}]}]},
           "http_filters": filters + [{"name": "envoy.filters.http.router", "typed_config": {
               "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}
    return {"static_resources": {"listeners": [{
        "name": "bench", "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                        "typed_config": hcm}]}]}]}}


def measure(port: int, n: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    out = []
    for _ in range(n):
        t = time.perf_counter()
        conn.request("GET", "/bench")
        r = conn.getresponse()
        r.read()
        out.append((time.perf_counter() - t) * 1e6)
        if r.status != 200:
            raise SystemExit(f"port {port}: status {r.status}")
    conn.close()
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> int:
    variants = {"no filter": None, "0 rules": 0, "10 rules": 10, "100 rules": 100}
    envoys, ports = {}, {}
    try:
        for name, n in variants.items():
            filters = [] if n is None else [json.loads(json_format.MessageToJson(f)) for f in
                                            rbac.http_filters(load_texts({"p.yaml": policy(n)}), NODE, 80, Phase.AUTHZ)]
            ports[name] = free_port()
            envoys[name] = Envoy(bootstrap(ports[name], filters)).start()
        samples = {name: [] for name in variants}
        for name in variants:
            measure(ports[name], 100)                     # warm up
        for _ in range(ROUNDS):
            for name in variants:
                samples[name] += measure(ports[name], REQUESTS // ROUNDS)
    finally:
        for e in envoys.values():
            e.stop()
    base50, base99 = pct(samples["no filter"], .5), pct(samples["no filter"], .99)
    rows = {name: {"p50_us": round(pct(s, .5), 1), "p99_us": round(pct(s, .99), 1),
                   "mean_us": round(statistics.fmean(s), 1), "requests": len(s)} for name, s in samples.items()}
    print(f"{'variant':<12} {'p50 µs':>8} {'p99 µs':>8} {'p50 ×':>7} {'p99 ×':>7}")
    for name, r in rows.items():
        r["p50_ratio"], r["p99_ratio"] = round(r["p50_us"] / base50, 3), round(r["p99_us"] / base99, 3)
        print(f"{name:<12} {r['p50_us']:>8.1f} {r['p99_us']:>8.1f} {r['p50_ratio']:>7.3f} {r['p99_ratio']:>7.3f}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"rows": rows, "requests_per_variant": REQUESTS, "rounds": ROUNDS}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
