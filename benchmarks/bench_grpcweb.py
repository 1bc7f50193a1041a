"""Per-request cost of the gRPC-Web filters the control plane puts on every gateway listener.

One Envoy (one worker), three listeners that differ only in their HTTP
filters: none; grpc_web alone; the frames check (Lua) + grpc_web, as the
grpc_web seam emits them. Each route answers with a direct response, so what
is measured is Envoy and those filters. h2load (HTTP/2) sends two kinds of
request to each: a gRPC-Web ModelInfer-sized body (the frames check buffers
and scans it) and a plain JSON POST (the check returns at once); at a fixed
moderate rate (p50/p99 from h2load's per-request log) and closed-loop at
saturation (QPS). Configurations are interleaved round by round.

Run from the repo root: `python -m benchmarks grpcweb`; writes
artifacts/bench/grpcweb.json.
"""
from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

from google.protobuf import json_format

from mcp26.mesh.resources import MeshConfig
from mcp26.demo.stack.envoy import Envoy
from mcp26.demo.stack.grpcweb import GRPC_WEB, encode_frame
from mcp26.demo.stack.ports import free_port
from mcp26.xds.translate import Phase, grpc_web
from mcp26.xds.model.node import ProxyNode

ROOT = pathlib.Path(__file__).resolve().parent.parent

OUT = ROOT / "artifacts" / "bench" / "grpcweb.json"
CONFIGS = ("none", "grpc_web", "frames+grpc_web")
KINDS = {
    # 64 FP32 values plus the request's names and shape, as the console sends them.
    "grpc-web": ({"content-type": GRPC_WEB, "x-grpc-web": "1"}, encode_frame(bytes(300))),
    "plain": ({"content-type": "application/json"}, b'{"inputs": [{"name": "INPUT0", "data": [1, 2, 3, 4]}]}'),
}
MODERATE = {"clients": 4, "rps_per_client": 250}     # 1000 req/s: far below saturation
SATURATED = {"clients": 16, "streams": 4}
DURATION_S, WARMUP_S, ROUNDS = 3, 1, 2
ROUTER = {"name": "envoy.filters.http.router",
          "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}


def filter_sets() -> dict[str, list[dict]]:
    seam = [json.loads(json_format.MessageToJson(f, preserving_proto_field_name=True))
            for f in grpc_web.http_filters(MeshConfig(), ProxyNode("bench"), 0, Phase.PROTOCOL)]
    names = [f["name"] for f in seam]
    assert names == [grpc_web.FRAMES_FILTER, grpc_web.GRPC_WEB_FILTER], names
    return {"none": [], "grpc_web": seam[1:], "frames+grpc_web": seam}


def listener(name: str, port: int, filters: list[dict]) -> dict:
    routes = [{"match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": "ok\n"}}}]
    return {"name": name, "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
            "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": name.replace("+", "_"), "codec_type": "AUTO",
                "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": routes}]},
                "http_filters": filters + [ROUTER]}}]}]}


def h2load(port: int, kind: str, clients: int, streams: int = 1, rps: int | None = None) -> dict:
    headers, body = KINDS[kind]
    with tempfile.NamedTemporaryFile(prefix="h2load-", suffix=".log", delete=False) as log, \
            tempfile.NamedTemporaryFile(prefix="h2load-body-", delete=False) as data:
        data.write(body)
    args = ["h2load", "-t", "1", "-c", str(clients), "-m", str(streams), "-D", str(DURATION_S),
            "--warm-up-time", str(WARMUP_S), "--log-file", log.name, "-d", data.name]
    if rps:
        args += ["--rps", str(rps)]
    for k, v in headers.items():
        args += ["-H", f"{k}: {v}"]
    out = subprocess.run(args + [f"http://127.0.0.1:{port}/inference.GRPCInferenceService/ModelInfer"],
                         capture_output=True, text=True, timeout=60)
    os.unlink(data.name)
    if out.returncode != 0:
        raise RuntimeError(out.stdout + out.stderr)
    lat, statuses = [], {}
    with open(log.name) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3:
                statuses[parts[1]] = statuses.get(parts[1], 0) + 1
                lat.append(int(parts[2]))
    os.unlink(log.name)
    if set(statuses) != {"200"}:
        raise RuntimeError(f"non-200 answers from port {port} ({kind}): {statuses}")
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]   # noqa: E731
    return {"requests": len(lat), "qps": len(lat) / DURATION_S, "p50_us": q(0.50), "p99_us": q(0.99)}


def main() -> int:
    sets = filter_sets()
    ports = {n: free_port() for n in CONFIGS}
    runs = {(n, k): {"moderate": [], "saturated": []} for n in CONFIGS for k in KINDS}
    boot = {"static_resources": {"listeners": [listener(n, ports[n], sets[n]) for n in CONFIGS]}}
    with Envoy(boot):
        for rnd in range(ROUNDS):
            order = CONFIGS if rnd % 2 == 0 else tuple(reversed(CONFIGS))
            for kind in KINDS:
                for name in order:
                    r = runs[(name, kind)]
                    r["moderate"].append(h2load(ports[name], kind, MODERATE["clients"], rps=MODERATE["rps_per_client"]))
                    if rnd == 0:
                        r["saturated"].append(h2load(ports[name], kind, SATURATED["clients"], SATURATED["streams"]))
    summary = {}
    for (name, kind), r in runs.items():
        summary[f"{name}/{kind}"] = {"p50_us": statistics.median(x["p50_us"] for x in r["moderate"]),
                                     "p99_us": statistics.median(x["p99_us"] for x in r["moderate"]),
                                     "qps_saturated": statistics.median(x["qps"] for x in r["saturated"])}
    print(f"\ngRPC-Web filter cost per request (Envoy 1 worker, h2load HTTP/2, direct response; moderate = "
          f"{MODERATE['clients'] * MODERATE['rps_per_client']} req/s, saturated = {SATURATED['clients']}x{SATURATED['streams']} streams)")
    print(f"{'filters / request':<28}{'p50 us':>8}{'p50 x':>7}{'p99 us':>8}{'p99 x':>7}{'QPS sat':>9}{'QPS x':>7}")
    for kind in KINDS:
        base = summary[f"none/{kind}"]
        for name in CONFIGS:
            s = summary[f"{name}/{kind}"]
            print(f"{name + ' / ' + kind:<28}{s['p50_us']:>8}{s['p50_us'] / base['p50_us']:>7.2f}{s['p99_us']:>8}"
                  f"{s['p99_us'] / base['p99_us']:>7.2f}{s['qps_saturated']:>9.0f}{s['qps_saturated'] / base['qps_saturated']:>7.2f}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"summary": summary,
                               "runs": {f"{n}/{k}": r for (n, k), r in runs.items()},
                               "load": {"moderate": MODERATE, "saturated": SATURATED, "duration_s": DURATION_S,
                                        "warmup_s": WARMUP_S, "rounds": ROUNDS}}, indent=2))
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
