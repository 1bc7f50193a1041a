"""bench_chain: the seed's production chain on this machine (issue #43), measured as it gives it:
QPS at P99 < 12 ms, per core, next to the seed's 14,200 QPS on 32 cores (~444 per core).

    h2load (HTTP/2, 200+ keep-alive connections, a 1 KB JSON body, open loop: --rps per connection)
      -> Envoy configured by our control plane: jwt_authn (a RequestAuthentication; every request
         carries a valid token), the header-contract Wasm filter (signs the session and QoS
         headers), grpc_web (in every gateway chain; these requests pass it), router
      -> the model server (builtin:mlp, the session signature checked) with the response cache in
         a 3-shard Redis Cluster (Debian's redis-server; harness/redis_stack.py)
      -> answers

Every request carries the same body, so after the first every answer is a cache hit: the chain is
measured as the seed's service runs, in front of its cache. Two rows: Redis as it is, and Redis
slowed to 500 ms on every answer (its proxies, harness/redis_stack.py) - the circuit breaker opens
and the local cache answers. For each, the offered rate climbs (200, 250, ... QPS; `offered_steps`) until the p99
(h2load's per-request log) passes 12 ms or a request fails; the last rate that held is the figure.

`python -m benchmarks chain [--seconds S] [--max-qps N]`; writes artifacts/bench/chain.json.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

from benchmarks import h2load_log
from harness.manifests import documents, manifest, wasm_module
from harness.redis_stack import RedisCluster, skip_reason
from mcp26.demo.stack.control_plane import GATEWAY_NODE, ControlPlane, mesh_envoy, write_config
from mcp26.demo.stack.inference_server import InferenceServer
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.tokens import Issuer
from mcp26.wasm import HEADER_CONTRACT_WASM as WASM

CONNECTIONS = 200
WARM_S = 2.0                 # left out of each step's figures (h2load below)
P99_LIMIT_MS = 12.0
SEED_QPS, SEED_CORES = 14_200, 32
KEY = hashlib.sha256(b"bench chain session key").digest()
ISSUER, AUDIENCE = "https://issuer.chain.test", "mesh-gateway"
OUT = pathlib.Path(__file__).resolve().parent.parent / "artifacts" / "bench" / "chain.json"


def body() -> bytes:
    data = [round(0.001 * i + 0.123456789, 9) for i in range(64)]
    doc = {"id": "chain", "inputs": [{"name": "INPUT0", "shape": [1, 64], "datatype": "FP32", "data": data}]}
    out = json.dumps(doc).encode()
    return out + b" " * max(0, 1024 - len(out))          # 1 KB, as the seed's requests


class Chain:
    def __enter__(self):
        self.dir = tempfile.mkdtemp(prefix="mcp-chain-")
        self.redis = RedisCluster(3).start()
        key_file = os.path.join(self.dir, "session.key")
        with open(key_file, "wb") as f:
            f.write(KEY)
        self.server = InferenceServer("builtin:mlp", "--session-key-file", key_file, "--cache-config",
                                      self.redis.cache_config(timeout_ms=50, failures=2, open_ms=1000),
                                      "--cache-config", "local,size=16777216").start()
        self.issuer = Issuer("chain-1", ISSUER, AUDIENCE)
        self.gw_port = free_port()
        cfg = os.path.join(self.dir, "mesh")
        os.makedirs(cfg)
        write_config(cfg, "mesh.yaml", documents(
            manifest("gateway.yaml", gw_port=self.gw_port),
            manifest("service_entry.yaml", name="models", number=80, port_name="http", protocol="HTTP",
                     upstream=self.server.http_port),
            manifest("gateway_route.yaml", name="models", host="models.mesh.local"),
            manifest("gateway_jwt.yaml", issuer=ISSUER, audience=AUDIENCE, jwks=self.issuer.jwks),
            manifest("header_contract_plugin.yaml", plugin_config={"sessionKey": base64.b64encode(KEY).decode()},
                     **wasm_module(WASM))))
        self.cp = ControlPlane(cfg).start()
        self.envoy = mesh_envoy(self.cp, labels={"istio": "ingressgateway"}, namespace="default")
        self.envoy.start()
        self.cp.wait_synced(GATEWAY_NODE, types=("CDS", "LDS", "ECDS"))
        self.token = self.issuer.token(exp_in=3600, sub="bench", tenant="acme")
        self.body = os.path.join(self.dir, "body.json")
        with open(self.body, "wb") as f:
            f.write(body())
        deadline = time.monotonic() + 20
        while self.probe() != 200:
            if time.monotonic() > deadline:
                raise TimeoutError(f"chain not serving:\n{self.envoy.log_tail()}\n{self.server.log_tail()}")
            time.sleep(0.2)
        return self

    def probe(self) -> int:
        req = urllib.request.Request(f"http://127.0.0.1:{self.gw_port}/v2/models/mlp/infer", data=body(),
                                     headers={"content-type": "application/json",
                                              "authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status
        except OSError:
            return 0

    def cache(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.server.admin_port}/admin/status", timeout=5) as r:
            return json.load(r)["response_cache"]

    def h2load(self, rps: int, seconds: float, connections: int = CONNECTIONS) -> dict:
        """`rps` a second on each of `connections` for `seconds` (+WARM_S left out: the
        connections' start). The connections open spread over its first second (-r 1
        --rate-period), so their per-connection timers are spread: h2load starts them all at once
        otherwise, and every connection's request then leaves in the same millisecond. The second
        after it is left out too: the first requests on new connections (Envoy's and the Wasm
        filter's per-connection setup) took 100-200 ms at 300 connections, after 0.9 s of opening."""
        self.runs = getattr(self, "runs", 0) + 1
        log = os.path.join(self.dir, f"h2load-{self.runs}.log")        # h2load appends to a log that exists
        n = int(rps * connections * (seconds + WARM_S))
        period_ms = max(1, 1000 // connections)
        cmd = ["h2load", "-c", str(connections), "-m", "1", "-t", "1", "--rps", str(rps), "-n", str(n),
               "-r", "1", "--rate-period", f"{period_ms}ms", f"--log-file={log}", "-d", self.body,
               "-H", "content-type: application/json", "-H", f"authorization: Bearer {self.token}",
               f"http://127.0.0.1:{self.gw_port}/v2/models/mlp/infer"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
        rows = h2load_log.read(log) if os.path.exists(log) else []
        if rows:                                         # the connections opening, and their first requests
            t0 = min(row[0] for row in rows) + int(WARM_S * 1e6)
            rows = [row for row in rows if row[0] >= t0]
        got = h2load_log.summary(rows) if rows else {"ok": 0, "errors": 0, "p99_ms": None, "span_s": 0}
        got["qps"] = round(got["ok"] / got["span_s"], 1) if got.get("span_s") else 0.0
        got["offered"], got["connections"] = rps * connections, connections
        if r.returncode != 0:
            got["h2load_error"] = r.stderr[-300:]
        return got

    def __exit__(self, *exc):
        for stop in (self.envoy.stop, self.cp.close, self.server.stop, self.redis.stop):
            try:
                stop()
            except Exception:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


def offered_steps(max_qps: int):
    """(per-connection rate, connections) for offered rates 200, 250, ..., 400, 500, 600, ...:
    h2load's --rps is a whole number per connection, so 200 connections alone climb in steps of
    200 QPS (a figure of 200 or 400, nothing between); between them the connections grow (>= 200
    always) and the per-connection rate is offered // 200."""
    offered = CONNECTIONS
    while offered <= max_qps:
        rps = offered // CONNECTIONS
        yield rps, round(offered / rps)
        offered += 50 if offered < 2 * CONNECTIONS else 100


def sweep(chain: Chain, seconds: float, max_qps: int) -> tuple[dict | None, list[dict]]:
    """Climb the offered rate until p99 > 12 ms or an error; -> (the last step that held, all)."""
    steps, held = [], None
    for rps, connections in offered_steps(max_qps):
        got = chain.h2load(rps, seconds, connections)
        steps.append(got)
        ok = got["ok"] > 0 and got["errors"] == 0 and got["p99_ms"] is not None and got["p99_ms"] < P99_LIMIT_MS
        print(f"  offered {got['offered']:>6}/s ({connections} conns x {rps}/s): {got['qps']:>8.1f} QPS "
              f"p50 {got.get('p50_ms')} p99 {got.get('p99_ms')} ms errors {got['errors']}{' (held)' if ok else ''}",
              flush=True)
        if not ok:
            break
        held = got
    return held, steps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench_chain")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--max-qps", type=int, default=4000, help="the highest offered rate tried")
    args = ap.parse_args(argv)
    for reason in (skip_reason(), None if shutil.which("h2load") else "h2load (nghttp2-client) is not installed",
                   None if os.path.exists(WASM) else "run `make wasm` first"):
        if reason:
            print(f"bench_chain: {reason}", file=sys.stderr)
            return 1
    cores = os.cpu_count() or 1
    doc = {"started": time.time(), "loadavg_start": os.getloadavg(), "cores": cores, "connections": CONNECTIONS}
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    with Chain() as chain:
        chain.h2load(1, 2)                                       # warm-up: the first miss, Envoy's pools
        rows = {}
        for name, delay in (("redis", 0.0), ("redis slowed to 500 ms", 0.5)):
            chain.redis.set_delay(delay)
            print(f"{name}:", flush=True)
            held, steps = sweep(chain, args.seconds, args.max_qps)
            rows[name] = {"held": held, "steps": steps, "cache": chain.cache()}
        chain.redis.set_delay(0)
    doc["rows"], doc["loadavg_end"] = rows, os.getloadavg()
    seed = SEED_QPS / SEED_CORES
    print(f"\n{'chain (h2load c>=200, 1 KB JSON)':<30} {'QPS @ p99<12ms':>15} {'per core':>9} {'vs seed/core':>13} "
          f"{'p99 ms':>7} {'breaker':>9}")
    for name, r in rows.items():
        h = r["held"]
        qps = h["qps"] if h else 0.0
        state = (r["cache"].get("breaker") or {}).get("state")
        print(f"{name:<30} {qps:>15.1f} {qps / cores:>9.1f} {qps / cores / seed:>12.2f}x "
              f"{(h or {}).get('p99_ms') or float('nan'):>7.2f} {state:>9}")
    print(f"{'the seed (32 cores)':<30} {SEED_QPS:>15,} {seed:>9.1f} {1.0:>12.2f}x")
    print(f"cores here: {cores}; load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, indent=1))
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
