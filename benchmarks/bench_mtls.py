"""mTLS vs plaintext between two sidecars (app A -> A's sidecar -> B's sidecar -> app B), side by side.

The same two real Envoys and control plane; only the DestinationRule's `tls`
(ISTIO_MUTUAL vs DISABLE) and the PeerAuthentication (STRICT vs DISABLE)
differ. Measured per mode: per-request latency p50/p99 at a fixed rate over
one keep-alive client connection (sidecar-to-sidecar connections pooled), and
new connections/s (maxRequestsPerConnection 1: every request is a new
A -> B connection, so a TLS handshake under mTLS).

Then SDS on rotation: BENCH_SDS_PROXIES (100) ADS clients in this process,
each a node of its own with a valid node-bootstrap token, ask for `default`
and `ROOTCA` and ACK as Envoy does; the workload certificate lifetime is
short (10 s), so the control plane re-issues every certificate at half life
and pushes each node its new `default`. Measured: how long the push to all
of them took (first to last rotated secret received, and in how many
rotation ticks), and the bytes on the wire per proxy and in all.
Writes artifacts/bench/mtls.json.
"""
from __future__ import annotations

import http.client
import json
import os
import pathlib
import asyncio
import statistics
import tempfile
import time

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import discovery_pb2

from mcp26.demo.stack.envoy import Envoy
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.demo.stack.control_plane import ControlPlane, write_config
from mcp26.xds.bootstrap import envoy_bootstrap
from mcp26.xds.ca import node_token_from_dir

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


def fixed_rate(port: int, rate: float, seconds: float) -> tuple[list[float], int]:
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
    return lat, failed


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


SECRET = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"


async def _sds_client(address: str, node: base_pb2.Node, seen: list, done: asyncio.Event, want: int) -> None:
    """One proxy's SDS over ADS (SotW): ask for default + ROOTCA, ACK each response; record
    (time, bytes, serial of `default`) per response until `want` distinct certificates arrived."""
    outbox: asyncio.Queue = asyncio.Queue()
    outbox.put_nowait(discovery_pb2.DiscoveryRequest(node=node, type_url=SECRET,
                                                     resource_names=["default", "ROOTCA"]))

    async def requests():
        while (req := await outbox.get()) is not None:
            yield req

    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.stream_stream(ADS, request_serializer=lambda m: m.SerializeToString(),
                                     response_deserializer=None)(requests())
        certs = set()
        async for raw in call:
            t = time.monotonic()
            resp = discovery_pb2.DiscoveryResponse.FromString(raw)
            outbox.put_nowait(discovery_pb2.DiscoveryRequest(type_url=SECRET, resource_names=["default", "ROOTCA"],
                                                             version_info=resp.version_info,
                                                             response_nonce=resp.nonce))
            for a in resp.resources:
                sec = secret_pb2.Secret.FromString(a.value)
                if sec.name == "default":
                    chain = sec.tls_certificate.certificate_chain.inline_bytes
                    if chain not in certs:
                        certs.add(chain)
                        seen.append((t, len(raw), len(certs)))
            if len(certs) >= want:
                outbox.put_nowait(None)
                done.set()
                return


def sds_rotation(proxies: int, ttl: str = "10s", timeout: float = 40.0) -> dict:
    """SDS push to `proxies` nodes when their certificates rotate (see the module doc)."""
    d = tempfile.mkdtemp(prefix="bench-sds-")
    cfg, ca = os.path.join(d, "config"), os.path.join(d, "ca")
    os.makedirs(cfg)
    write_config(cfg, "mesh.yaml", CONFIG.format(host=HOST, svc=free_port(), b_in=free_port(), app=free_port(),
                                                 tls="ISTIO_MUTUAL", pa="STRICT", per_conn=0))
    cp = ControlPlane(cfg, extra_args=["--ca-dir", ca, "--workload-cert-ttl", ttl]).start()
    try:
        nodes = []
        for i in range(proxies):
            node_id = f"sidecar~127.0.0.1~p-{i}.{NS}~{NS}.svc.cluster.local"
            n = base_pb2.Node(id=node_id, cluster=node_id)
            n.metadata.update({"LABELS": {"app": "p"}, "SERVICE_ACCOUNT": "p",
                               "IDENTITY_TOKEN": node_token_from_dir(ca, node_id, NS, "p")})
            nodes.append(n)

        async def run():
            seen = [[] for _ in nodes]
            dones = [asyncio.Event() for _ in nodes]
            tasks = [asyncio.create_task(_sds_client(cp.address, n, s, e, 2))
                     for n, s, e in zip(nodes, seen, dones)]
            try:
                await asyncio.wait_for(asyncio.gather(*(e.wait() for e in dones)), timeout)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            return seen

        seen = asyncio.run(run())
    finally:
        cp.close()
    first = [s[0] for s in seen]                    # (t, bytes, 1): the first certificate
    rotated = sorted((s[1] for s in seen), key=lambda x: x[0])
    times = [t for t, _, _ in rotated]
    # A rotation tick re-issues every certificate then past half life: a gap over
    # half a second between two rotated secrets is another tick.
    ticks = 1 + sum(1 for a, b in zip(times, times[1:]) if b - a > 0.5)
    bytes_each = [b for _, b, _ in rotated]
    return {"proxies": proxies, "ttl": ttl, "ticks": ticks,
            "push_s": times[-1] - times[0],
            "largest_tick_s": _tick_spans(times)[-1][0], "largest_tick_proxies": _tick_spans(times)[-1][1],
            "bytes_per_proxy": statistics.median(bytes_each), "bytes_total": sum(bytes_each),
            "initial_bytes_per_proxy": statistics.median(b for _, b, _ in first)}


def _tick_spans(times: list[float]) -> list[tuple[float, int]]:
    """(first to last, proxies) of each rotation tick, the largest tick last when sorted."""
    spans, start, n = [], times[0], 1
    for a, b in zip(times, times[1:]):
        if b - a > 0.5:
            spans.append((a - start, n))
            start, n = b, 0
        n += 1
    spans.append((times[-1] - start, n))
    return sorted(spans, key=lambda s: s[1])


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
                    lat, failed = fixed_rate(svc, rate, seconds)
                    results.setdefault(mode, {}).update(
                        p50_ms=statistics.median(lat), p99_ms=statistics.quantiles(lat, n=100)[98], requests=len(lat),
                        failed=failed)
                else:
                    results[mode]["new_conn_per_s"] = closed_loop(svc, seconds)
        m, p = results["mtls"], results["plaintext"]
        rows = [("p50 at %g req/s (ms)" % rate, "p50_ms"), ("p99 at %g req/s (ms)" % rate, "p99_ms"),
                ("new A->B connections/s", "new_conn_per_s")]
        print(f"{'measure':32} {'plaintext':>10} {'mTLS':>10} {'mTLS/plain':>11}")
        for label, k in rows:
            print(f"{label:32} {p[k]:10.2f} {m[k]:10.2f} {m[k] / p[k]:11.2f}")
        # What a new A -> B connection costs more under mTLS: the handshake, both ends.
        results["handshake_ms"] = 1000 / m["new_conn_per_s"] - 1000 / p["new_conn_per_s"]
        print(f"mTLS handshake per new connection (1/rate difference): {results['handshake_ms']:.2f} ms")
    finally:
        for e in envoys:
            e.stop()
        cp.close()
        app.stop()
    sds = sds_rotation(int(os.environ.get("BENCH_SDS_PROXIES", 100)))
    print(f"SDS push on rotation to {sds['proxies']} proxies: {sds['push_s'] * 1000:.0f} ms first to last "
          f"({sds['ticks']} rotation tick(s); the largest pushed {sds['largest_tick_proxies']} proxies in "
          f"{sds['largest_tick_s'] * 1000:.0f} ms), "
          f"{sds['bytes_per_proxy']:.0f} B per proxy, {sds['bytes_total'] / 1024:.0f} KiB in all "
          f"(initial SDS response {sds['initial_bytes_per_proxy']:.0f} B)")
    out = pathlib.Path("artifacts/bench")
    out.mkdir(parents=True, exist_ok=True)
    (out / "mtls.json").write_text(json.dumps({"rate": rate, "seconds": seconds, **results, "sds_rotation": sds},
                                              indent=1))


if __name__ == "__main__":
    main()
