"""Inference backend benchmarks: side by side, in one run, as ratios.

Run from the repo root: `python -m benchmarks inference` (or `make bench`).
Prints one table and writes artifacts/bench/inference.json.

All servers here run on this machine's two cores together with the load
generator, mcp-bench, which is calibrated first (section 0) so that a
generator bottleneck would show up as such.

0. Generator ceiling. mcp-bench, an aiohttp loop and h2load (nghttp2, C)
   against one target that answers at once (Envoy direct_response): the
   highest rate each can drive here. mcp-bench's must sit well above any
   rate the model servers reach below, or those numbers measure the client.
   For gRPC, with no cheap target, mcp-bench --grpc and h2load (posting the
   same framed message) both drive the batched server: equal is good.

1. Dynamic batching vs --max-batch 1: throughput at the same p99. Both
   servers get the same closed-loop concurrency sweep, which traces each
   one's throughput-vs-p99 curve; T(L) is a server's highest throughput over
   its sweep points with p99 <= L. The common bound L is the larger of the
   two servers' p99 at their own peak throughput, so neither is held below
   the tail at which it does its best: the figure is T_batched(L) /
   T_unbatched(L). Fixing the p99 rather than the concurrency is what a
   capacity planner does: requests per second one replica serves under a
   latency objective. The table also shows the tighter bound (the smaller of
   the two peak p99s), where one server may have no point at all. Floor: >= 3x
   (at the first). Each sweep point is the median of three short runs,
   alternating between the servers (the machine is shared).

2. Priority isolation. A low-priority closed loop (concurrency well past
   saturation) keeps the server busy while an open-loop high-priority
   stream (fixed rate, latency from the intended send time) runs alongside;
   its p99 is compared with the same stream on the idle server. A control
   run sends the same stream without a priority (the default class) under the
   same load, showing what the priority levels buy. Judged (floor <= 2x):
   the `--qos-policy latency-critical` preset with its priority worker
   (--priority-grpc-port/--priority-http-port: the top class in a process of
   its own, the parent at nice 19; inference_backend/priority_worker.py), the
   high stream on the worker's port as Envoy routes it, the low load on the
   main port. Beside it, the same preset with the high stream on the main
   port, with and without its reserved lane (what the worker and the lane
   each buy), on REST and on gRPC; and, for comparison, the default
   `balanced` preset. On each server alone, loaded and control run in turn,
   the servers of a set in turn, three rounds; the medians are reported,
   with the server's own queue and compute p99 of the high stream (where
   the time went) and the low load served and shed (that it saturates).

3. Peer. MLServer 1.7 (its own venv under .cache/peers/mlserver, installed on
   first run) with a minimal onnxruntime runtime and its adaptive batching
   set like ours (same max batch, same max queue delay), serving the same
   ONNX file: throughput and p99 at equal concurrency, REST both.
   Goal: ahead of the peer. If it cannot be installed or started, the reason
   is printed and the rest still runs.

4. Mesh hop. The batched server direct vs through an Envoy (static
   bootstrap, one worker; REST -> HTTP/1.1 keep-alive pool, gRPC -> HTTP/2):
   p50 added at concurrency 1 on /v2/health/ready (the hop alone, no model
   work to hide it), on REST and on gRPC inference, and throughput at the
   batched server's peak concurrency; medians of alternating short runs.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

from benchmarks.peers.mlserver import MLServerPeer, PeerUnavailable
from mcp26.inference.bench.runner import Config, event_loop_runner, run_all
from mcp26.inference.bench.serve_process import ServeProcess
from mcp26.demo.stack.envoy import Envoy
from mcp26.demo.stack.ports import free_port
from mcp26.serving.executables import executable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODEL = "builtin:mlp"
MAX_BATCH = 32
QUEUE_DELAY_US = 2000
SWEEP = (1, 4, 8, 16, 32, 64, 128)
STEP_S = float(os.environ.get("BENCH_STEP_S", "2.4"))    # seconds per measured point (all its rounds)
ROUNDS = 3                                               # alternating short runs per point, median kept
HIGH_RATE = 100.0                                        # high-priority stream, requests/s (~10% of capacity)
LOW_CONCURRENCY = 64

RESULTS: dict = {"config": {"model": MODEL, "max_batch": MAX_BATCH, "max_queue_delay_us": QUEUE_DELAY_US,
                            "sweep": SWEEP, "step_s": STEP_S, "cpus": os.cpu_count()}}


def run(*cfgs: Config) -> list[dict]:
    return event_loop_runner()(run_all(list(cfgs)))


def closed(url: str, c: int, duration: float = STEP_S, **kw) -> dict:
    grpc = not url.startswith("http://")
    return run(Config(url=url, concurrency=c, duration=duration, warmup=2 * c, grpc=grpc, **kw))[0]


def point(res: dict) -> dict:
    row = res["rows"][0]
    return {"concurrency": res["run"]["concurrency"], "rps": row["throughput_rps"],
            "p50_ms": row["latency_ms"]["p50"], "p99_ms": row["latency_ms"]["p99"],
            "errors": row["errors"], "error_classes": row["error_classes"]}


def serve(max_batch: int, *extra: str) -> ServeProcess:
    return ServeProcess(MODEL, free_port(), free_port(), "--max-batch", str(max_batch),
                        "--max-queue-delay-us", str(QUEUE_DELAY_US), *extra)


# -- 0. generator ceiling --------------------------------------------------

def direct_response_bootstrap(port: int) -> dict:
    hcm = {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
           "stat_prefix": "ceiling",
           "route_config": {"virtual_hosts": [{"name": "any", "domains": ["*"], "routes": [
               {"match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": "ok"}}}]}]},
           "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
               "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}
    return {"static_resources": {"listeners": [_listener("ceiling", port, hcm)]}}


def _listener(name: str, port: int, hcm: dict) -> dict:
    return {"name": name, "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
            "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                            "typed_config": hcm}]}]}


def h2load_rps(url: str, c: int, n: int) -> float | None:
    exe = shutil.which("h2load")
    if not exe:
        return None
    out = subprocess.run([exe, "--h1", "-c", str(c), "-n", str(n), url],
                         capture_output=True, text=True, timeout=120).stdout
    m = re.search(r"finished in [\d.]+m?s, ([\d.]+) req/s", out)
    return float(m.group(1)) if m else None


async def _aiohttp_rps(url: str, c: int, n: int) -> float:
    import aiohttp
    left = [n]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=c)) as s:
        async def worker():
            while left[0] > 0:
                left[0] -= 1
                async with s.get(url) as r:
                    await r.read()
        t = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(c)))
        return n / (time.perf_counter() - t)


def generator_ceiling() -> dict:
    port, c = free_port(), 16
    url = f"http://127.0.0.1:{port}/ready"
    with Envoy(direct_response_bootstrap(port)):
        mcp = run(Config(url=url, concurrency=c, requests=150_000, warmup=1000))[0]
        open_loop = run(Config(url=url, concurrency=64, rate=40_000, duration=2.0))[0]
        out = {
            "mcp_bench_rps": mcp["rows"][0]["throughput_rps"],
            "mcp_bench_open_loop_40k": {"sent_rps": open_loop["run"]["sent_rate_rps"],
                                        "lag_p99_ms": open_loop["schedule_lag"]["p99_ms"],
                                        "p99_ms": open_loop["rows"][0]["latency_ms"]["p99"]},
            "aiohttp_rps": round(event_loop_runner()(_aiohttp_rps(url, c, 30_000)), 1),
            "h2load_rps": h2load_rps(url, c, 150_000),
            "concurrency": c,
        }
    return out


def h2load_grpc_rps(authority: str, payload: bytes, connections: int, streams: int, n: int) -> float | None:
    """h2load posting one framed gRPC message (what a gRPC client sends)."""
    exe = shutil.which("h2load")
    if not exe:
        return None
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".grpc") as f:
        f.write(b"\0" + len(payload).to_bytes(4, "big") + payload)
        f.flush()
        out = subprocess.run([exe, "-c", str(connections), "-m", str(streams), "-n", str(n), "-d", f.name,
                              "-H", "content-type: application/grpc", "-H", "te: trailers",
                              f"http://{authority}/inference.GRPCInferenceService/ModelInfer"],
                             capture_output=True, text=True, timeout=120).stdout
    m = re.search(r"finished in [\d.]+m?s, ([\d.]+) req/s", out)
    ok = re.search(r"(\d+) succeeded", out)
    return float(m.group(1)) if m and ok and int(ok.group(1)) == n else None


def grpc_generator_check() -> dict:
    """gRPC has no cheap target to calibrate on, so both clients drive the
    batched server itself, c=32 over 4 connections: if mcp-bench --grpc gets
    what h2load gets, the server is the limit and not the Python client."""
    from mcp26.inference.bench import grpc_slots
    from mcp26.inference.bench.target import build_tensors, parse_url
    with serve(MAX_BATCH) as s:
        t = parse_url(s.grpc_url, grpc=True)
        meta = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 64]}]}
        payload = grpc_slots.infer_request(t, build_tensors(meta), None)
        run(Config(url=s.grpc_url, grpc=True, concurrency=32, requests=500, connections=4))    # warm-up
        mcp, h2 = [], []
        for _ in range(2):                                   # alternate: the machine is shared
            mcp.append(run(Config(url=s.grpc_url, grpc=True, concurrency=32, requests=3000,
                                  connections=4))[0]["rows"][0]["throughput_rps"])
            h2.append(h2load_grpc_rps(t.authority, payload, 4, 8, 3000))
    h2 = [x for x in h2 if x]
    return {"mcp_bench_grpc_rps": statistics.median(mcp), "h2load_grpc_rps": statistics.median(h2) if h2 else None}


# -- 1. batching -------------------------------------------------------------

def interleaved(urls: list[str], levels, rounds: int = ROUNDS) -> list[list[dict]]:
    """The same closed-loop points on each server, alternating run by run, and
    each point the median of `rounds` short runs: the machine is shared, and
    a burst of other work then falls on both servers alike and on one round
    of each, not on one server's whole curve."""
    out = [[] for _ in urls]
    for c in levels:
        runs = [[] for _ in urls]
        for _ in range(rounds):
            for i, url in enumerate(urls):
                runs[i].append(point(closed(url, c, STEP_S / rounds)))
        for i in range(len(urls)):
            out[i].append(median_point(runs[i]))
    return out


def median_point(points: list[dict]) -> dict:
    out = {k: statistics.median(p[k] for p in points) for k in ("rps", "p50_ms", "p99_ms")}
    out.update(concurrency=points[0]["concurrency"], errors=sum(p["errors"] for p in points),
               error_classes={k: v for p in points for k, v in p["error_classes"].items()},
               rounds=[{k: p[k] for k in ("rps", "p50_ms", "p99_ms")} for p in points])
    return out


def best_under(points: list[dict], slo_ms: float) -> dict | None:
    ok = [p for p in points if p["p99_ms"] is not None and p["p99_ms"] <= slo_ms and not p["errors"]]
    return max(ok, key=lambda p: p["rps"]) if ok else None


def batching() -> dict:
    with serve(1) as unbatched, serve(MAX_BATCH) as batched:
        flat, dyn = interleaved([unbatched.rest_url, batched.rest_url], SWEEP)
    return {"unbatched": flat, "batched": dyn, **compare_at_p99(dyn, flat)}


def compare_at_p99(dyn: list[dict], flat: list[dict]) -> dict:
    """Throughput of each curve within a common p99 bound (see the docstring)."""
    out = {}
    clean = [[p for p in curve if not p["errors"]] or curve for curve in (dyn, flat)]
    peaks = [max(curve, key=lambda p: p["rps"])["p99_ms"] for curve in clean]
    for key, slo in (("common_bound", max(peaks)), ("tight_bound", min(peaks))):
        b, u = best_under(dyn, slo), best_under(flat, slo)
        out[key] = {"slo_p99_ms": slo, "batched": b, "unbatched": u,
                    "ratio": round(b["rps"] / u["rps"], 2) if b and u else None}
    out["ratio"] = out["common_bound"]["ratio"]
    return out


# -- 2. priority isolation ---------------------------------------------------

def mcp_bench(*args: str, nice: int = 0) -> subprocess.Popen:
    """mcp-bench in a process of its own (JSON on stdout): the saturating load's
    Python work must not delay the measured stream's event loop. The measured
    stream runs at nice -5 (we are root here; else as it is) so that on two
    busy cores its own scheduling delay stays out of the figure it reports."""
    exe = executable("mcp-bench")
    prefix = ["nice", "-n", str(nice)] if nice and (nice > 0 or os.geteuid() == 0) else []
    return subprocess.Popen([*prefix, exe, *args, "--output-format", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def collect(p: subprocess.Popen, timeout: float = 90) -> dict:
    try:
        out, err = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    if p.returncode != 0:
        raise RuntimeError(f"mcp-bench {' '.join(p.args)} failed: {err}")
    return json.loads(out)


LANE_OFF_POLICY = """apiVersion: scheduling.mcp-mesh.io/v1alpha1
kind: L7SchedulingPolicy
metadata: {name: latency-critical-no-lane}
spec: {qosPolicy: latency-critical, reservedLaneLevels: 0}
"""


def isolation_variants(variants: list[tuple], grpc: bool = False, rounds: int = ROUNDS) -> list[dict]:
    """Several servers (label, serve flags[, priority worker]), measured side by
    side: each round runs alone, under load and the control on each server in
    turn, and the median of each is kept (a burst of other work on this shared
    machine then falls on one round of every variant, not on one variant's
    whole figure). With the priority worker, the server also gets
    --priority-grpc-port/--priority-http-port and the high stream goes to the
    worker's port, as Envoy routes x-mcp-qos-class: latency-critical
    (istio-manifests/examples/inference-pool.yaml); the low load and the
    control (no class) stay on the main port, where Envoy sends them."""
    import contextlib
    with contextlib.ExitStack() as stack:
        servers, highs = [], []
        for v in variants:
            flags, worker = list(v[1]), len(v) > 2 and v[2]
            ports = (free_port(), free_port()) if worker else None
            s = stack.enter_context(ServeProcess(MODEL, free_port(), free_port(), *flags, *(
                ["--priority-grpc-port", str(ports[0]), "--priority-http-port", str(ports[1])] if worker else [])))
            servers.append(s)
            highs.append((["--grpc", "-u", s.grpc_url.replace(f":{s.grpc_port}/", f":{ports[0]}/")] if grpc else
                          ["-u", s.rest_url.replace(f":{s.http_port}/", f":{ports[1]}/")]) if worker else None)
        urls = [["--grpc", "-u", s.grpc_url] if grpc else ["-u", s.rest_url] for s in servers]
        for url, high in zip(urls, highs):
            collect(mcp_bench(*url, "-c", "8", "-n", "200"))                     # warm-up
            if high:
                collect(mcp_bench(*high, "-c", "4", "-n", "100", "--priority-mix", "critical=1"))
        runs = [{"alone": [], "prioritised": [], "prioritised_low": [], "control": [], "control_low": []}
                for _ in variants]
        for _ in range(rounds):
            for url, high, r in zip(urls, highs, runs):
                _isolation_round(url, r, high)
    return [_isolation_summary(v[0], r, grpc, rounds) for v, r in zip(variants, runs)]


def _isolation_round(url: list[str], runs: dict, high_url: list[str] | None = None) -> None:
    duration = 2.0
    high_url = high_url or url
    high = [*high_url, "-c", "32", "--rate", str(HIGH_RATE), "--duration", str(duration)]
    control = [*url, "-c", "32", "--rate", str(HIGH_RATE), "--duration", str(duration)]
    low = [*url, "-c", str(LOW_CONCURRENCY), "--duration", str(duration + 1.2), "--timeout", "5",
           "--priority-mix", "low=1"]
    runs["alone"].append(collect(mcp_bench(*high, "--priority-mix", "critical=1", nice=-5)))
    for name, args in (("prioritised", [*high, "--priority-mix", "critical=1"]), ("control", control)):
        background = mcp_bench(*low)
        time.sleep(0.6)                                                # let it fill the queues
        runs[name].append(collect(mcp_bench(*args, nice=-5)))
        runs[name + "_low"].append(collect(background))


def _isolation_summary(policy: str, runs: dict, grpc: bool, rounds: int) -> dict:
    row = lambda r: r["rows"][0]  # noqa: E731
    med = lambda rs, f: statistics.median(f(r) for r in rs)  # noqa: E731
    p99 = lambda rs: med(rs, lambda r: row(r)["latency_ms"]["p99"])  # noqa: E731
    q99 = lambda rs: med(rs, lambda r: (row(r)["server_queue_us"] or {}).get("p99") or 0)  # noqa: E731
    c99 = lambda rs: med(rs, lambda r: (row(r)["server_compute_us"] or {}).get("p99") or 0)  # noqa: E731
    alone, loaded = p99(runs["alone"]), p99(runs["prioritised"])
    return {"qos_policy": policy, "protocol": "grpc" if grpc else "rest", "high_rate_rps": HIGH_RATE,
            "low_concurrency": LOW_CONCURRENCY, "rounds": rounds,
            "high_alone_p99_ms": alone, "high_under_load_p99_ms": loaded,
            "unprioritised_under_load_p99_ms": p99(runs["control"]),
            "high_alone_p99_ms_rounds": [row(r)["latency_ms"]["p99"] for r in runs["alone"]],
            "high_under_load_p99_ms_rounds": [row(r)["latency_ms"]["p99"] for r in runs["prioritised"]],
            "high_schedule_lag_p99_ms": med(runs["prioritised"], lambda r: r["schedule_lag"]["p99_ms"] or 0),
            "high_alone_server_queue_us": {"p99": q99(runs["alone"])},
            "high_alone_server_compute_us": {"p99": c99(runs["alone"])},
            "high_server_queue_us": {"p99": q99(runs["prioritised"])},
            "high_server_compute_us": {"p99": c99(runs["prioritised"])},
            "low_server_queue_us": {"p99": q99(runs["prioritised_low"])},
            "low_ok_rps": med(runs["prioritised_low"], lambda r: row(r)["throughput_rps"]),
            "low_errors": {k: v for r in runs["prioritised_low"] for k, v in row(r)["error_classes"].items()},
            "high_errors": {k: v for r in runs["prioritised"] for k, v in row(r)["error_classes"].items()},
            "ratio": round(loaded / alone, 2) if alone else None}


JUDGED = "latency-critical + priority worker"       # the deployment the floor is for


def isolation_section() -> list[dict]:
    """latency-critical with its priority worker (judged), beside the same preset
    with the high stream on the main port, with and without the reserved lane
    (what the worker and the lane each buy), REST and gRPC side by side; then
    balanced (REST)."""
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(LANE_OFF_POLICY)
    try:
        lc = ["--qos-policy", "latency-critical"]
        worker_and_main = [(JUDGED, lc, True), ("latency-critical, main port", lc)]
        out = isolation_variants(worker_and_main) + isolation_variants(
            [*worker_and_main, ("latency-critical, main port, no reserved lane", ["--policy-file", f.name])],
            grpc=True)
    finally:
        os.unlink(f.name)
    return out + isolation_variants([("balanced, main port", ["--qos-policy", "balanced"])], rounds=2)


# -- 3. peer -----------------------------------------------------------------

PEER_CONCURRENCY = (8, 32)


def peer(onnx_path: str, meta: dict) -> dict:
    out = {"peer": "MLServer 1.7.1 + onnxruntime runtime, adaptive batching", "points": []}
    try:
        p = MLServerPeer(ROOT, "mlp", onnx_path, meta["inputs"], meta["outputs"], free_port(), free_port(),
                         free_port(), max_batch_size=MAX_BATCH, max_batch_time_s=QUEUE_DELAY_US / 1e6)
        p.start()
    except PeerUnavailable as e:
        out["unavailable"] = str(e)
        return out
    try:
        with serve(MAX_BATCH) as s:
            ours, peer_pts = interleaved([s.rest_url, f"http://127.0.0.1:{p.http_port}/v2/models/mlp"],
                                         PEER_CONCURRENCY)
    finally:
        p.stop()
    for c, a, b in zip(PEER_CONCURRENCY, ours, peer_pts):
        out["points"].append({"concurrency": c, "ours": a, "peer": b,
                              "rps_ratio": round(a["rps"] / b["rps"], 2) if b["rps"] else None,
                              "p99_ratio": round(a["p99_ms"] / b["p99_ms"], 2) if b["p99_ms"] else None})
    return out


# -- 4. mesh hop -------------------------------------------------------------

def _route_hcm(prefix: str, cluster: str) -> dict:
    return {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": prefix, "codec_type": "AUTO",
            "route_config": {"virtual_hosts": [{"name": "backend", "domains": ["*"], "routes": [
                {"match": {"prefix": "/"}, "route": {"cluster": cluster, "timeout": "30s"}}]}]},
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}


def _cluster(name: str, port: int, http2: bool) -> dict:
    c = {"name": name, "type": "STATIC", "connect_timeout": "1s",
         "circuit_breakers": {"thresholds": [{"max_connections": 1024, "max_pending_requests": 1024,
                                              "max_requests": 1024}]},
         "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
             {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]}}
    if http2:  # gRPC upstream
        c["typed_extension_protocol_options"] = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}}
    return c


def proxy_bootstrap(listen: int, upstream: int, grpc_listen: int | None = None,
                    grpc_upstream: int | None = None) -> dict:
    """A sidecar-like static Envoy: REST listener -> HTTP/1.1 pool, and
    (optionally) a gRPC listener -> HTTP/2 upstream. One worker thread."""
    listeners = [_listener("mesh_hop", listen, _route_hcm("mesh_hop", "inference"))]
    clusters = [_cluster("inference", upstream, http2=False)]
    if grpc_listen:
        listeners.append(_listener("mesh_hop_grpc", grpc_listen, _route_hcm("mesh_hop_grpc", "inference_grpc")))
        clusters.append(_cluster("inference_grpc", grpc_upstream, http2=True))
    return {"static_resources": {"listeners": listeners, "clusters": clusters}}


def alternating(direct: str, via: str, c: int, rounds: int, seconds: float) -> tuple[dict, dict]:
    """Short runs, direct and through Envoy in turn; the median of each side."""
    d, e = [], []
    for _ in range(rounds):
        d.append(point(closed(direct, c, seconds)))
        e.append(point(closed(via, c, seconds)))
    return median_point(d), median_point(e)


def mesh_hop(saturating_c: int) -> dict:
    listen, grpc_listen = free_port(), free_port()
    with serve(MAX_BATCH) as s, Envoy(proxy_bootstrap(listen, s.http_port, grpc_listen, s.grpc_port)):
        def via(url: str) -> str:
            return url.replace(f":{s.http_port}/", f":{listen}/").replace(f":{s.grpc_port}/", f":{grpc_listen}/")
        ready = f"http://127.0.0.1:{s.http_port}/v2/health/ready"
        out = {}
        for label, url, c, rounds, secs in (("ready_c1", ready, 1, 5, 0.4), ("infer_c1", s.rest_url, 1, 5, 0.6),
                                            ("grpc_infer_c1", s.grpc_url, 1, 5, 0.6),
                                            ("infer_saturated", s.rest_url, saturating_c, 3, 1.0)):
            d, e = alternating(url, via(url), c, rounds, secs)
            out[label] = {"direct": d, "envoy": e, "p50_added_ms": round(e["p50_ms"] - d["p50_ms"], 3),
                          "rps_ratio": round(e["rps"] / d["rps"], 3) if d["rps"] else None}
    return out


# -- report ------------------------------------------------------------------

def table(r: dict) -> str:
    rows = []
    g = r.get("generator")
    if g:
        h2 = g["h2load_rps"]
        rows.append(("generator ceiling (direct_response, c=16)", f"mcp-bench {g['mcp_bench_rps']:.0f}/s",
                     f"h2load {h2:.0f}/s" if h2 else "h2load: not installed",
                     f"{g['mcp_bench_rps'] / h2:.2f}x" if h2 else "-", "-"))
        rows.append(("  aiohttp client, same target", f"{g['aiohttp_rps']:.0f}/s", f"mcp-bench {g['mcp_bench_rps']:.0f}/s",
                     f"{g['aiohttp_rps'] / g['mcp_bench_rps']:.2f}x", "-"))
        gg = g.get("grpc_on_server") or {}
        if gg:
            h2g = gg["h2load_grpc_rps"]
            rows.append(("  gRPC on mcpctl serve (server-bound), c=32", f"mcp-bench {gg['mcp_bench_grpc_rps']:.0f}/s",
                         f"h2load {h2g:.0f}/s" if h2g else "h2load: failed", f"{gg['mcp_bench_grpc_rps'] / h2g:.2f}x" if h2g else "-", "-"))
    b = r.get("batching")
    if b:
        for key, label in (("common_bound", "batching: rps at p99 <="), ("tight_bound", "  tighter bound: p99 <=")):
            x = b[key]
            bb, ub, ratio = x["batched"], x["unbatched"], x["ratio"]
            rows.append((f"{label} {x['slo_p99_ms']:.1f} ms",
                         f"max-batch {MAX_BATCH}: {bb['rps']:.0f}/s (c={bb['concurrency']})" if bb else "none within",
                         f"max-batch 1: {ub['rps']:.0f}/s (c={ub['concurrency']})" if ub else "none within",
                         f"{ratio:.2f}x" if ratio else "-",
                         (">= 3x " + ("PASS" if ratio and ratio >= 3 else "FAIL")) if key == "common_bound" else "-"))
    for i in r.get("isolation", []):
        ratio, judged = i["ratio"], i["qos_policy"] == JUDGED
        rows.append((f"priority ({i['qos_policy']}, {i['protocol']}): high p99, {i['high_rate_rps']:.0f}/s",
                     f"under low load: {i['high_under_load_p99_ms']:.1f} ms", f"alone: {i['high_alone_p99_ms']:.1f} ms",
                     f"{ratio:.2f}x" if ratio else "-",
                     ("<= 2x " + ("PASS" if ratio and ratio <= 2 else "FAIL")) if judged else "-"))
        rows.append(("  control: same stream, no priority", f"{i['unprioritised_under_load_p99_ms']:.1f} ms",
                     f"alone: {i['high_alone_p99_ms']:.1f} ms",
                     f"{i['unprioritised_under_load_p99_ms'] / i['high_alone_p99_ms']:.2f}x", "-"))
        hq, lq = i["high_server_queue_us"] or {}, i["low_server_queue_us"] or {}
        rows.append(("  server queue p99 under load: high vs low", f"{(hq.get('p99') or 0) / 1e3:.1f} ms",
                     f"low {(lq.get('p99') or 0) / 1e3:.1f} ms", "-", "-"))
        hc, ac = i["high_server_compute_us"] or {}, i.get("high_alone_server_compute_us") or {}
        rows.append(("  high compute p99: under load vs alone", f"{(hc.get('p99') or 0) / 1e3:.1f} ms",
                     f"alone {(ac.get('p99') or 0) / 1e3:.1f} ms", "-", "-"))
        shed = sum(i["low_errors"].values())
        rows.append(("  low load (saturating): served, shed", f"{i['low_ok_rps']:.0f}/s",
                     f"{shed} shed in {i['rounds']} rounds", "-", "-"))
    p = r.get("peer")
    if p:
        if p.get("unavailable"):
            rows.append(("peer: MLServer", "unavailable", p["unavailable"][:60], "-", "-"))
        for pt in p.get("points", []):
            o, q = pt["ours"], pt["peer"]
            rows.append((f"peer MLServer, c={pt['concurrency']}: rps", f"ours {o['rps']:.0f}/s", f"MLServer {q['rps']:.0f}/s",
                         f"{pt['rps_ratio']:.2f}x", "goal > 1x " + ("ahead" if pt["rps_ratio"] > 1 else "BEHIND")))
            rows.append((f"peer MLServer, c={pt['concurrency']}: p99", f"ours {o['p99_ms']:.1f} ms",
                         f"MLServer {q['p99_ms']:.1f} ms", f"{pt['p99_ratio']:.2f}x",
                         "goal < 1x " + ("ahead" if pt["p99_ratio"] < 1 else "BEHIND")))
    m = r.get("mesh_hop")
    if m:
        for key, what in (("ready_c1", "/v2/health/ready"), ("infer_c1", "REST infer"), ("grpc_infer_c1", "gRPC infer")):
            x = m[key]
            rows.append((f"mesh hop, {what}, c=1: p50", f"Envoy {x['envoy']['p50_ms']:.3f} ms",
                         f"direct {x['direct']['p50_ms']:.3f} ms", f"{x['p50_added_ms'] * 1000:+.0f} us", "-"))
        sat = m["infer_saturated"]
        rows.append((f"mesh hop, infer, c={sat['direct']['concurrency']}: rps", f"Envoy {sat['envoy']['rps']:.0f}/s",
                     f"direct {sat['direct']['rps']:.0f}/s", f"{sat['rps_ratio']:.2f}x", "-"))
    head = ("measure", "this", "against", "ratio", "floor / goal")
    widths = [max(len(str(x[k])) for x in [head, *rows]) for k in range(5)]
    fmt = lambda x: "  ".join(str(v).ljust(w) for v, w in zip(x, widths))  # noqa: E731
    return "\n".join([fmt(head), "  ".join("-" * w for w in widths), *map(fmt, rows)])


def section(name: str, title: str, fn) -> None:
    """Run one section; a failure is recorded and printed, the others still run."""
    print(f"{title} ...", flush=True)
    try:
        RESULTS[name] = fn()
    except Exception as e:  # noqa: BLE001 - the reason goes into the table and the JSON
        RESULTS.setdefault("failed", {})[name] = f"{type(e).__name__}: {e}"[:2000]
        print(f"  {name} failed: {RESULTS['failed'][name][:300]}", flush=True)


def main() -> int:
    from mcp26.inference.builtin_models import builtin_path
    t0 = time.monotonic()
    RESULTS["load_average_start"] = os.getloadavg()   # this machine is shared: say how busy it was
    sections = os.environ.get("BENCH_SECTIONS", "generator,batching,isolation,peer,mesh_hop").split(",")
    if "generator" in sections:
        section("generator", "0/4 generator ceiling",
                lambda: {**generator_ceiling(), "grpc_on_server": grpc_generator_check()})
    if "batching" in sections:
        section("batching", "1/4 batching sweep", batching)
    if "isolation" in sections:
        section("isolation", "2/4 priority isolation",
                isolation_section)
    if "peer" in sections:
        meta = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 64]}],
                "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 16]}]}
        section("peer", "3/4 peer (MLServer)", lambda: peer(builtin_path("mlp"), meta))
    if "mesh_hop" in sections:
        best = (RESULTS.get("batching") or {}).get("common_bound", {}).get("batched")
        section("mesh_hop", "4/4 mesh hop", lambda: mesh_hop(best["concurrency"] if best else 32))
    RESULTS["wall_s"] = round(time.monotonic() - t0, 1)
    RESULTS["load_average_end"] = os.getloadavg()
    print()
    print(table(RESULTS))
    for name, why in RESULTS.get("failed", {}).items():
        print(f"FAILED section {name}: {why[:500]}")
    out = os.path.join(ROOT, "artifacts", "bench", "inference.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(RESULTS, f, indent=2)
    print(f"\n{RESULTS['wall_s']} s; wrote {os.path.relpath(out, ROOT)}")
    return 1 if RESULTS.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
