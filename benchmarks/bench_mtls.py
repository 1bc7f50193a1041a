"""mTLS vs plaintext between two sidecars (app A -> A's sidecar -> B's sidecar -> app B), side by side.

The same two real Envoys and control plane; only the DestinationRule's `tls`
(ISTIO_MUTUAL vs DISABLE) and the PeerAuthentication (STRICT vs DISABLE)
differ. Measured per mode: per-request latency p50/p99 at a fixed rate over
one keep-alive client connection (sidecar-to-sidecar connections pooled), and
new connections/s (maxRequestsPerConnection 1: every request is a new
A -> B connection, so a TLS handshake under mTLS). Writes artifacts/bench/mtls.json.
"""
from __future__ import annotations

import http.client
import json
import os
import pathlib
import statistics
import tempfile
import time

from harness.envoy import Envoy
from harness.ports import free_port
from harness.upstreams import EchoUpstream
from harness.xds import ControlPlane, write_config
from xds_server.bootstrap import envoy_bootstrap
from xds_server.ca import node_token_from_dir

NS, HOST = "shop", "b.shop.svc.cluster.local"
NODES = {app: f"sidecar~127.0.0.1~{app}-1.{NS}~{NS}.svc.cluster.local" for app in ("a", "b")}
CONFIG = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: b, namespace: shop}}
spec:
  hosts: [{host}]
  ports: [{{number: {svc}, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints: [{{address: 127.0.0.1, ports: {{http: {b_in}}}}}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: b, namespace: shop}}
spec:
  host: {host}
  trafficPolicy:
    tls: {{mode: {tls}}}
    connectionPool: {{http: {{maxRequestsPerConnection: {per_conn}}}}}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{name: default, namespace: shop}}
spec: {{mtls: {{mode: {pa}}}}}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: a, namespace: shop}}
spec:
  workloadSelector: {{labels: {{app: a}}}}
  egress: [{{hosts: ["shop/{host}"]}}]
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: b, namespace: shop}}
spec:
  workloadSelector: {{labels: {{app: b}}}}
  ingress: [{{port: {{number: {b_in}, protocol: HTTP, name: http}}, defaultEndpoint: "127.0.0.1:{app}"}}]
  egress: [{{hosts: ["~/*"]}}]
"""
MODES = {"plaintext": ("DISABLE", "DISABLE"), "mtls": ("ISTIO_MUTUAL", "STRICT")}


def _get(conn) -> int:
    conn.request("GET", "/", headers={"host": HOST})
    r = conn.getresponse()
    body = r.read()
    if r.status != 200 and os.environ.get("BENCH_DEBUG"):
        print(r.status, dict(r.getheaders()), body[:200])
    return r.status


def fixed_rate(port: int, rate: float, seconds: float) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    lat, start, n, failed = [], time.monotonic(), 0, 0
    while time.monotonic() - start < seconds:
        t = time.perf_counter()
        if _get(conn) == 200:
            lat.append((time.perf_counter() - t) * 1000)
        else:
            failed += 1
        n += 1
        time.sleep(max(0.0, start + n / rate - time.monotonic()))
    conn.close()
    if failed:
        print(f"  {failed} requests failed at the fixed rate")
    return lat


def closed_loop(port: int, seconds: float) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    n, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        n += _get(conn) == 200
    conn.close()
    return n / (time.monotonic() - start)


def wait_ok(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            if _get(conn) == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("A -> B never answered 200")
        time.sleep(0.2)


def main() -> None:
    rate, seconds = float(os.environ.get("BENCH_RATE", 200)), float(os.environ.get("BENCH_SECONDS", 5))
    d = tempfile.mkdtemp(prefix="bench-mtls-")
    cfg, ca = os.path.join(d, "config"), os.path.join(d, "ca")
    os.makedirs(cfg)
    svc, b_in = free_port(), free_port()
    app = EchoUpstream("b").start()
    fmt = dict(host=HOST, svc=svc, b_in=b_in, app=app.port)
    write_config(cfg, "mesh.yaml", CONFIG.format(tls="DISABLE", pa="DISABLE", per_conn=0, **fmt).replace(
        "maxRequestsPerConnection: 0", "maxRequestsPerConnection: 1000000"))
    cp = ControlPlane(cfg, extra_args=["--ca-dir", ca]).start()
    envoys = []
    try:
        for name, node in NODES.items():
            admin = free_port()
            envoys.append(Envoy(envoy_bootstrap(node_id=node, xds_address=cp.address, admin_port=admin,
                                                labels={"app": name}, service_account=name,
                                                identity_token=node_token_from_dir(ca, node, NS, name)),
                                admin_port=admin).start())
        results = {}
        for mode, (tls, pa) in MODES.items():
            for per_conn, key in ((1000000, "pooled"), (1, "new_conn")):
                before = cp.configz()["generation"]
                write_config(cfg, "mesh.yaml", CONFIG.format(tls=tls, pa=pa, per_conn=per_conn, **fmt))
                cp.wait_generation_change(before)
                time.sleep(1.5)
                for _ in range(2):   # after the listener swap
                    wait_ok(svc)
                    time.sleep(0.5)
                if key == "pooled":
                    lat = fixed_rate(svc, rate, seconds)
                    results.setdefault(mode, {}).update(
                        p50_ms=statistics.median(lat), p99_ms=statistics.quantiles(lat, n=100)[98], requests=len(lat))
                else:
                    results[mode]["new_conn_per_s"] = closed_loop(svc, seconds)
        m, p = results["mtls"], results["plaintext"]
        rows = [("p50 at %g req/s (ms)" % rate, "p50_ms"), ("p99 at %g req/s (ms)" % rate, "p99_ms"),
                ("new A->B connections/s", "new_conn_per_s")]
        print(f"{'measure':32} {'plaintext':>10} {'mTLS':>10} {'mTLS/plain':>11}")
        for label, k in rows:
            print(f"{label:32} {p[k]:10.2f} {m[k]:10.2f} {m[k] / p[k]:11.2f}")
        out = pathlib.Path("artifacts/bench")
        out.mkdir(parents=True, exist_ok=True)
        (out / "mtls.json").write_text(json.dumps({"rate": rate, "seconds": seconds, **results}, indent=1))
    finally:
        for e in envoys:
            e.stop()
        cp.close()
        app.stop()


if __name__ == "__main__":
    main()
