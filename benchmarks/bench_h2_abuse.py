"""HTTP/2 abuse side by side: each pattern of benchmarks/h2_abuse.py from one connection against
each gRPC port that faces the network, on the project's HTTP/2 stack (`--grpc-frontend fast`)
and on grpc-core (`grpcio`), in one run.

    python -m benchmarks h2_abuse [--seconds 10] [--patterns rapid_reset,...] [--ports model,ads,epp]
                                  [--frontends fast,grpcio] [--connects 3000]

The ports: the model server's KServe gRPC (`mcpctl serve --model builtin:relu`), the control
plane's ADS (`mcpctl xds serve`, a 10-service mesh) and the Endpoint Picker's ext_proc
(`mcpctl epp serve`). Per row, over the attack's `--seconds`: the server process's CPU
seconds (/proc/PID/stat, every thread) less what the legitimate client alone cost it over as
long (the `(legit alone)` row of each port), its RSS growth (the peak of 10 samples a second less
the RSS before), the first GOAWAY or RST_STREAM whose code is not NO_ERROR and when it came,
and a legitimate client on another connection (a grpcio channel: a health check, or on ADS a
CDS request and its answer, every 20 ms) as calls answered within their 2 s deadline out of
calls made. Then `--connects` sequential connections to each port, timed (the listen backlog).
The floors the table marks (issue #45): the attack's CPU <= 1 s, RSS <= 20 MB (64 MB for the
message-size patterns), an error code within 1 s, >= 99 % of the legitimate calls.

With MCP_H2SPEC set to an h2spec binary, h2spec -S runs against each port and frontend too
(pass / skip / fail and the failed cases). JSON in artifacts/bench/h2_abuse.json.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

import grpc

from benchmarks.bench_xds import cpu_s, rss_mb
from benchmarks.h2_abuse import MESSAGE_SIZE, PATTERNS, sequential_connects
from benchmarks.xds_config import write_mesh
from harness.endpoint_picker import PickerProcess, write_pool
from mcp26.demo.stack.control_plane import ControlPlane
from mcp26.demo.stack.inference_server import InferenceServer
from mcp26.demo.stack.ports import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALL_PATTERNS = [*PATTERNS, "churn_with_open_calls"]
DEADLINE_S = 2.0


class Servers:
    """The three servers on one frontend: name -> (port, pid)."""

    def __init__(self, frontend: str, ports: list[str]):
        self.frontend = frontend
        self.tmp = tempfile.TemporaryDirectory(prefix="h2-abuse-")
        self.stops = []
        self.ports: dict[str, tuple[int, int]] = {}
        if "model" in ports:
            m = InferenceServer("builtin:relu", "--grpc-frontend", frontend).start()
            self.stops.append(m.stop)
            self.ports["model"] = (m.grpc_port, m.proc.pid)
        if "ads" in ports:
            mesh = os.path.join(self.tmp.name, "mesh")
            write_mesh(mesh, services=10, routes=2, gateway_port=free_port())
            cp = ControlPlane(mesh, grpc_frontend=frontend, test_hooks=False, log_level="warning").start()
            self.stops.append(cp.close)
            self.ports["ads"] = (cp.port, cp.proc.pid)
        if "epp" in ports:
            pool = os.path.join(self.tmp.name, "pool")
            os.makedirs(pool)
            write_pool(pool, ["127.0.0.2"], free_port())
            p = PickerProcess(pool, "--grpc-frontend", frontend)
            self.stops.append(p.stop)
            self.ports["epp"] = (p.port, p.proc.pid)

    def close(self) -> None:
        for stop in reversed(self.stops):
            try:
                stop()
            except Exception as e:     # noqa: BLE001 - stop the others still
                print(f"stopping a server: {e}", file=sys.stderr)
        self.tmp.cleanup()


class Legit:
    """A well-behaved client on its own connection, calling every 20 ms with a 2 s deadline."""

    def __init__(self, port_name: str, port: int):
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.call = self._ads_call if port_name == "ads" else self._health_call
        self.ok = self.made = 0
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _health_call(self) -> None:
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        health_pb2_grpc.HealthStub(self.channel).Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE_S)

    def _ads_call(self) -> None:
        from envoy.config.core.v3 import base_pb2
        from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
        req = discovery_pb2.DiscoveryRequest(
            node=base_pb2.Node(id="router~127.0.0.1~gw.default~default.svc.cluster.local", cluster="gw"),
            type_url="type.googleapis.com/envoy.config.cluster.v3.Cluster")
        call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(self.channel).StreamAggregatedResources(
            iter([req]), timeout=DEADLINE_S)
        try:
            next(call)
        finally:
            call.cancel()

    def warm(self, within_s: float = 30.0) -> bool:
        """One call answered, trying for up to `within_s` (a server still busy with the last
        attack may take that long); False if none was."""
        deadline = time.monotonic() + within_s
        while True:
            try:
                self.call()
                return True
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.5)

    def _run(self) -> None:
        while not self.stop_flag.is_set():
            t0 = time.monotonic()
            self.made += 1
            try:
                self.call()
                self.ok += time.monotonic() - t0 <= DEADLINE_S
            except grpc.RpcError:
                pass
            self.stop_flag.wait(0.02)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> float:
        self.stop_flag.set()
        self.thread.join(DEADLINE_S + 1)
        self.channel.close()
        return 100.0 * self.ok / self.made if self.made else 0.0


BASELINE = "(legit alone)"


def run_row(pattern: str, port_name: str, port: int, pid: int, seconds: float) -> dict:
    """One pattern (or BASELINE: no attacker) for `seconds`, the legitimate client beside it."""
    legit = Legit(port_name, port)
    if not legit.warm():
        legit.channel.close()
        return {"pattern": pattern, "port": port_name, "cpu_s": 0.0, "rss_growth_mb": 0.0, "rss_after_mb": 0.0,
                "first_error": None, "legit_pct": 0.0, "legit_calls": 0, "sent_mb": None, "closed_after_s": None,
                "note": "the server answered no call for 30 s before the row (still busy with the last one)"}
    time.sleep(0.3)
    rss0 = rss_mb(pid)["VmRSS"]
    cpu0 = cpu_s(pid)
    legit.start()
    if pattern == BASELINE:
        attacker = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])
    else:
        attacker = subprocess.Popen([sys.executable, "-m", "benchmarks.h2_abuse", pattern, "127.0.0.1", str(port),
                                     port_name, str(seconds)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    peak = rss0
    while attacker.poll() is None:
        try:
            peak = max(peak, rss_mb(pid)["VmRSS"])
        except OSError:
            break
        time.sleep(0.1)
    cpu = cpu_s(pid) - cpu0
    legit_pct = legit.stop()
    out = attacker.stdout.read() if attacker.stdout else ""
    report = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    first = report.get("first_error")
    time.sleep(1.0)
    after = rss_mb(pid)["VmRSS"]
    return {"pattern": pattern, "port": port_name, "cpu_s": round(cpu, 2), "rss_growth_mb": round(peak - rss0, 1),
            "rss_after_mb": round(after - rss0, 1), "first_error": first, "legit_pct": round(legit_pct, 1),
            "legit_calls": legit.made, "sent_mb": report.get("sent_mb"), "closed_after_s": report.get("closed_after_s")}


def verdict(row: dict) -> str:
    if row["pattern"] == BASELINE:
        return ""
    rss_floor = 64 if row["pattern"] in MESSAGE_SIZE else 20
    first = row["first_error"]
    fails = []
    if row["attack_cpu_s"] > 1.0:
        fails.append("cpu")
    if row["rss_growth_mb"] > rss_floor:
        fails.append("rss")
    if row["pattern"] != "churn_with_open_calls" and (first is None or first[2] > 1.0):
        fails.append("error")
    if row["legit_pct"] < 99.0:
        fails.append("legit")
    if row.get("note"):
        fails.append("unresponsive")
    return "ok" if not fails else "FAIL " + ",".join(fails)


H2SPEC_SUMMARY = re.compile(r"(\d+) tests, (\d+) passed, (\d+) skipped, (\d+) failed")


def h2spec(binary: str, port: int) -> dict:
    r = subprocess.run([binary, "-S", "-p", str(port), "-o", "2"], capture_output=True, text=True, timeout=600)
    m = H2SPEC_SUMMARY.search(r.stdout)
    failed = re.findall(r"^\s+× (.+)$", r.stdout.split("Failures:")[-1], re.M) if "Failures:" in r.stdout else []
    if not m:
        return {"error": (r.stdout + r.stderr)[-500:]}
    total, passed, skipped, nfail = map(int, m.groups())
    return {"tests": total, "passed": passed, "skipped": skipped, "failed": nfail, "failures": failed}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--patterns", default=",".join(ALL_PATTERNS))
    ap.add_argument("--ports", default="model,ads,epp")
    ap.add_argument("--frontends", default="fast,grpcio")
    ap.add_argument("--connects", type=int, default=3000)
    args = ap.parse_args(argv)
    patterns = args.patterns.split(",")
    unknown = set(patterns) - set(ALL_PATTERNS)
    if unknown:
        ap.error(f"no pattern {', '.join(sorted(unknown))}; there are: {', '.join(ALL_PATTERNS)}")
    ports = args.ports.split(",")
    rows, connects, specs = [], [], []
    spec_binary = os.environ.get("MCP_H2SPEC")
    for frontend in args.frontends.split(","):
        servers = Servers(frontend, ports)
        try:
            for port_name in ports:
                port, pid = servers.ports[port_name]
                if spec_binary:
                    specs.append({"port": port_name, "frontend": frontend, **h2spec(spec_binary, port)})
                    print(json.dumps(specs[-1]), file=sys.stderr, flush=True)
                base = run_row(BASELINE, port_name, port, pid, args.seconds)
                for pattern in [BASELINE, *patterns]:
                    row = {"frontend": frontend, **(base if pattern == BASELINE else
                                                    run_row(pattern, port_name, port, pid, args.seconds))}
                    row["attack_cpu_s"] = round(max(0.0, row["cpu_s"] - base["cpu_s"]), 2)
                    row["verdict"] = verdict(row)
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
                if args.connects:
                    connects.append({"port": port_name, "frontend": frontend, "count": args.connects,
                                     "seconds": round(sequential_connects("127.0.0.1", port, args.connects), 2)})
                    print(json.dumps(connects[-1]), file=sys.stderr, flush=True)
        finally:
            servers.close()
    load = os.getloadavg()
    print(f"\nHTTP/2 abuse, {args.seconds:g} s from one connection (load average {load[0]:.2f} {load[1]:.2f})")
    print(f"{'pattern':22} {'port':6} {'frontend':8} {'CPU s':>6} {'attack':>6} {'RSS +MB':>8} "
          f"{'first error':>34} {'legit %':>8}  verdict")
    for r in rows:
        first = r["first_error"]
        err = f"{first[0]} {first[1]} @{first[2]:.2f}s" if first else "-"
        print(f"{r['pattern']:22} {r['port']:6} {r['frontend']:8} {r['cpu_s']:6.2f} {r['attack_cpu_s']:6.2f} "
              f"{r['rss_growth_mb']:8.1f} {err:>34} {r['legit_pct']:8.1f}  {r['verdict']}"
              + (f" ({r['note']})" if r.get("note") else ""))
    if connects:
        print("\nsequential connects")
        for c in connects:
            print(f"  {c['port']:6} {c['frontend']:8} {c['count']} in {c['seconds']:.2f} s")
    if specs:
        print("\nh2spec -S")
        for s in specs:
            if "error" in s:
                print(f"  {s['port']:6} {s['frontend']:8} error: {s['error']}")
                continue
            print(f"  {s['port']:6} {s['frontend']:8} {s['passed']}/{s['tests']} passed, {s['skipped']} skipped, "
                  f"{s['failed']} failed")
            for f in s["failures"]:
                print(f"      × {f}")
    os.makedirs(os.path.join(ROOT, "artifacts", "bench"), exist_ok=True)
    with open(os.path.join(ROOT, "artifacts", "bench", "h2_abuse.json"), "w") as f:
        json.dump({"seconds": args.seconds, "load_average": load, "rows": rows, "connects": connects,
                   "h2spec": specs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
