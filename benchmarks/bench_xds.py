"""xDS control plane benchmark: 1,000 services x 10 routes, 100 ADS clients in a separate process.

    python -m benchmarks xds [--services 1000] [--routes 10] [--clients 100] [--samples 20]

Measures, side by side in one run (SotW and Delta against the same server):
- full translate: load+validate the directory, translate for one gateway, pack;
- full push: 100 clients open their streams until every one has received
  (and ACKed) CDS, EDS, LDS and RDS;
- one endpoint change: from the new snapshot being installed until every
  client has it, and the bytes that took (Delta vs SotW);
- control-plane RSS with the clients connected, and its full garbage collections
  over the push and the changes (its /metrics, serving/gc_pauses.py);
- file change -> a real Envoy serving the new route, p50 over --samples (and next to
  the 1,000 services, with a SotW and a Delta Envoy).
Prints a table with ratios and floors, writes artifacts/bench/xds.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.demo.stack.control_plane import ControlPlane, mesh_envoy, write_config
from mcp26.demo.stack.xds_scenario import GATEWAY_LABELS, Client, base_config, virtual_service
from benchmarks.xds_config import service_yaml, write_mesh
from mcp26.serving import gc_pauses

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FLOORS = {"full_push_s": 2.0, "endpoint_change_delta_s": 0.1, "endpoint_change_bytes_ratio": 0.01,
          "file_to_envoy_p50_s": 0.3}
TYPES = ("CDS", "EDS", "LDS", "RDS")
CHANGES = 5          # endpoint changes per protocol; the table shows the median (and max)


def rss_mb(pid: int) -> dict:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "VmHWM")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) / 1024
    return out


def cpu_s(pid: int) -> float:
    """user + system CPU seconds of a process so far (robust to other load on the machine)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_translate(directory: str) -> dict:
    from mcp26.mesh.change_set import load_config
    from mcp26.xds.cache import PreparedSnapshot
    from mcp26.xds.translate import translate
    from mcp26.xds.model.node import ProxyNode
    from envoy.service.discovery.v3.discovery_pb2 import DiscoveryResponse
    from mcp26.xds.model.type_urls import ENDPOINT
    t0 = time.perf_counter()
    config = load_config(directory)
    t1 = time.perf_counter()
    node = ProxyNode("router~127.0.0.1~bench-gw-0.default~default.svc.cluster.local", labels=GATEWAY_LABELS)
    snap = translate(config, node)
    t2 = time.perf_counter()
    prepared = PreparedSnapshot.from_snapshot(snap)
    t3 = time.perf_counter()
    return {"load_validate_s": t1 - t0, "translate_s": t2 - t1, "pack_s": t3 - t2,
            "resources": {k.rsplit(".", 1)[-1]: len(v) for k, v in snap.items()},
            "snapshot_bytes": sum(r.size for by in prepared.resources.values() for r in by.values()),
            # one SotW response carrying every ClusterLoadAssignment, as on the wire (each in its Any)
            "eds_bytes": DiscoveryResponse(resources=[r.any for r in prepared.of_type(ENDPOINT).values()]).ByteSize()}


class LoadClients:
    """The clients process and the events it prints."""

    def __init__(self, address: str, clients: int, mode: str):
        self.n, self.mode = clients, mode
        self.events: list[dict] = []
        self.lock = threading.Lock()
        self.ready_at = 0.0
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.xds_load_clients", "--address", address,
             "--clients", str(clients), "--mode", mode, "--prefix", "bench-gw"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        self.started_at = time.time()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            ev = json.loads(line)
            with self.lock:
                if ev.get("event") == "ready":
                    self.ready_at = ev["t"]
                elif "error" in ev:
                    print(f"client {ev['c']}: {ev['error']}", file=sys.stderr)
                else:
                    self.events.append(ev)

    def wait(self, predicate, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                events = list(self.events)
            result = predicate(events)
            if result is not None:
                return result
            time.sleep(0.005)
        raise TimeoutError(f"{self.mode}: {what} not reached in {timeout}s")

    def full_push(self, timeout: float = 120) -> dict:
        def done(events):
            have: dict[int, dict] = {}
            for ev in events:
                have.setdefault(ev["c"], {}).setdefault(ev["ty"], ev)
            if len(have) == self.n and all(all(t in h for t in TYPES) for h in have.values()):
                last = max(max(h[t]["t"] for t in TYPES) for h in have.values())
                return {"full_push_s": last - self.ready_at,
                        "full_push_bytes": sum(ev["b"] for ev in events),
                        "eds_resources_per_client": max(h["EDS"]["n"] for h in have.values())}
            return None
        return self.wait(done, timeout, "every client synced")

    def after(self, since: float, type_short: str, timeout: float = 30) -> dict:
        def done(events):
            got = [ev for ev in events if ev["t"] >= since]
            clients = {ev["c"] for ev in got if ev["ty"] == type_short}
            if len(clients) == self.n:
                return {"last_t": max(ev["t"] for ev in got if ev["ty"] == type_short),
                        "bytes": sum(ev["b"] for ev in got), "responses": len(got),
                        "types": sorted({ev["ty"] for ev in got})}
            return None
        return self.wait(done, timeout, f"every client received {type_short}")

    def stop(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(10)
        except (subprocess.TimeoutExpired, OSError):
            self.proc.kill()
            self.proc.wait()


def change_svc0(cp: ControlPlane, directory: str, clients: LoadClients, text: str, type_short: str,
                settle_s: float) -> tuple[float, float, dict, list[dict]]:
    """Rewrite svc-0000.yaml with `text`: (written, applied, when every client received
    `type_short`, every response any client received from `applied` until `settle_s` after that)."""
    generation = cp.configz()["generation"]
    written = time.time()
    write_config(directory, "svc-0000.yaml", text)
    applied = cp.wait_generation_change(generation, timeout=60)["applied_at"]
    got = clients.after(applied, type_short)
    time.sleep(settle_s)
    with clients.lock:
        late = [ev for ev in clients.events if ev["t"] >= applied]
    return written, applied, got, late


def endpoint_change(cp: ControlPlane, directory: str, clients: LoadClients, port: int) -> dict:
    # after 0.3 s anything else this change sent would have arrived
    written, applied, got, late = change_svc0(cp, directory, clients, service_yaml(0, ports=(port, 20001)), "EDS", 0.3)
    return {"file_to_applied_s": applied - written, "push_to_all_s": got["last_t"] - applied,
            "bytes": sum(ev["b"] for ev in late), "responses": len(late),
            "types": sorted({ev["ty"] for ev in late})}


def rule_change(cp: ControlPlane, directory: str, clients: LoadClients, limit: int) -> dict:
    """A DestinationRule change (a connection-pool limit on svc-0000): its cluster changes, its
    endpoints do not; bytes by type to every client (SotW: CDS whole, EDS only to warm on)."""
    text = service_yaml(0).replace("  subsets:\n", f"  trafficPolicy: {{connectionPool: {{tcp: {{maxConnections: "
                                   f"{limit}}}}}}}\n  subsets:\n", 1)
    # the endpoints it warms on follow the CDS response within 0.5 s
    _, _, _, late = change_svc0(cp, directory, clients, text, "CDS", 0.5)
    by_type: dict[str, int] = {}
    for ev in late:
        by_type[ev["ty"]] = by_type.get(ev["ty"], 0) + ev["b"]
    return by_type


def measure_fleet(directory: str, services: int, clients: int) -> dict:
    cp = ControlPlane(directory, test_hooks=False, log_level="warning")
    out = {}
    try:
        cp.start(timeout=120)
        deadline = time.monotonic() + 120
        while not json.loads(cp.get("/healthz")[1])["config_loaded"]:
            if time.monotonic() > deadline:
                raise TimeoutError(cp.log_tail())
            time.sleep(0.1)
        out["rss_idle_mb"] = rss_mb(cp.proc.pid)["VmRSS"]
        # One client first: the gateway shape's one-time translation (measured
        # above) is then done, and the push below measures serving 100 clients.
        warm = LoadClients(cp.address, 1, "sotw")
        out["first_client_sync_s"] = warm.full_push()["full_push_s"]
        warm.stop()
        for i, mode in enumerate(("sotw", "delta")):
            gc_before = gc_pauses.pauses_from_metrics(cp.get("/metrics")[1])
            cpu_before = cpu_s(cp.proc.pid)
            load = LoadClients(cp.address, clients, mode)
            try:
                push = load.full_push()
                push["full_push_cp_cpu_s"] = cpu_s(cp.proc.pid) - cpu_before
                changes = [endpoint_change(cp, directory, load, 30000 + 10 * i + k) for k in range(CHANGES)]
                rule = rule_change(cp, directory, load, 100 + i)
                # back to the file as written: the next protocol's endpoint changes must not also
                # undo this rule change (a CDS push each client would count as an endpoint change's)
                change_svc0(cp, directory, load, service_yaml(0), "CDS", 0.0)
                change = dict(changes[0])
                for key in ("file_to_applied_s", "push_to_all_s", "bytes", "responses"):
                    change[key] = statistics.median(c[key] for c in changes)
                change["types"] = sorted({t for c in changes for t in c["types"]})    # of every change
                change["push_to_all_max_s"] = max(c["push_to_all_s"] for c in changes)
                change["samples"] = [c["push_to_all_s"] for c in changes]
                mem = rss_mb(cp.proc.pid)
                gc_after = gc_pauses.pauses_from_metrics(cp.get("/metrics")[1])
                # the control plane's full collections over the push and the changes (the histogram
                # keeps no maximum: the longest is bounded by its bucket)
                full = gc_pauses.pauses_between(gc_before, gc_after, "2")
                out[mode] = {**push, "endpoint_change": change, "rule_change_bytes": rule,
                             "rss_mb": mem["VmRSS"], "rss_peak_mb": mem["VmHWM"],
                             "full_gc": full}
            finally:
                load.stop()
            time.sleep(0.5)
    finally:
        cp.close()
    return out


def measure_file_to_envoy(samples: int, services: int = 0, routes: int = 10, delta: bool = False) -> dict:
    """Write a VirtualService change; time until the real Envoy answers from the new route.

    With `services`, the synthetic mesh sits in the same directory (its own
    gateway port): every change is then loaded and translated next to it.
    With `delta`, the Envoy uses Delta xDS (only the changed RouteConfiguration
    is sent; SotW resends every route configuration it subscribes to)."""
    with tempfile.TemporaryDirectory() as d:
        ups = {v: EchoUpstream(v).start() for v in ("v1", "v2", "v3")}
        port = free_port()
        for name, text in base_config(port, {v: u.port for v, u in ups.items()}).items():
            write_config(d, name, text)
        if services:
            write_mesh(os.path.join(d, "mesh"), services, routes, free_port())   # its own gateway.yaml
        cp = ControlPlane(d, test_hooks=False, log_level="warning")
        envoy = None
        client = Client(port)
        try:
            cp.start(timeout=120)
            node = "router~127.0.0.1~bench-envoy.default~default.svc.cluster.local"
            envoy = mesh_envoy(cp, node_id=node, labels=GATEWAY_LABELS, delta=delta).start(timeout=120)
            cp.wait_synced(node, types=TYPES, timeout=120)
            client.wait_for(lambda u: u == "v1", timeout=60)
            times = []
            for i in range(samples):
                target = "v3" if i % 2 == 0 else "v1"
                started = time.monotonic()
                write_config(d, "virtualservice.yaml", virtual_service(default=[(target, None)]))
                client.wait_for(lambda u: u == target, timeout=30)
                times.append(time.monotonic() - started)
                time.sleep(0.05)
            return {"samples": len(times), "p50_s": statistics.median(times), "min_s": min(times),
                    "max_s": max(times)}
        finally:
            client.close()
            if envoy:
                envoy.stop()
            cp.close()
            for u in ups.values():
                u.stop()


def verdict(value: float, floor: float) -> str:
    return "ok" if value <= floor else "OVER"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--services", type=int, default=1000)
    p.add_argument("--routes", type=int, default=10)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--samples", type=int, default=20)
    args = p.parse_args()
    started = time.time()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as d:
        write_mesh(d, args.services, args.routes, free_port())
        translate = measure_translate(d)
        fleet = measure_fleet(d, args.services, args.clients)
    envoy = measure_file_to_envoy(args.samples)
    envoy_big = measure_file_to_envoy(max(5, args.samples // 4), args.services, args.routes)
    envoy_big_delta = measure_file_to_envoy(max(5, args.samples // 4), args.services, args.routes, delta=True)
    sotw, delta = fleet["sotw"], fleet["delta"]
    # What one endpoint change costs against resending every ClusterLoadAssignment to every client
    # (what a SotW EDS push did before it carried only the changed ones)
    whole_eds = translate["eds_bytes"] * args.clients
    bytes_ratio = max(sotw["endpoint_change"]["bytes"], delta["endpoint_change"]["bytes"]) / max(1, whole_eds)
    result = {"config": vars(args), "translate": translate, "fleet": fleet, "file_to_envoy": envoy,
              "file_to_envoy_with_mesh": envoy_big, "file_to_envoy_with_mesh_delta": envoy_big_delta,
              "ratios": {"endpoint_change_bytes_over_whole_eds": bytes_ratio,
                         "endpoint_change_bytes_delta_over_sotw":
                             delta["endpoint_change"]["bytes"] / max(1, sotw["endpoint_change"]["bytes"]),
                         "endpoint_change_time_delta_over_sotw":
                             delta["endpoint_change"]["push_to_all_s"] / max(1e-9, sotw["endpoint_change"]["push_to_all_s"]),
                         "full_push_delta_over_sotw": delta["full_push_s"] / max(1e-9, sotw["full_push_s"])},
              "floors": FLOORS, "wall_s": time.time() - started,
              "machine": {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()}}

    n = args.clients
    rows = [
        ("config", f"{args.services} services x {args.routes} routes", "", "", "", ""),
        ("resources", ", ".join(f"{k} {v}" for k, v in translate["resources"].items()), "", "", "", ""),
        ("load + validate dir", f"{translate['load_validate_s']:.3f} s", "", "", "", ""),
        ("translate (1 gateway)", f"{translate['translate_s']:.3f} s", "", "", "", ""),
        ("pack (Any, hashes)", f"{translate['pack_s']:.3f} s  ({translate['snapshot_bytes'] / 1e6:.1f} MB)", "", "", "", ""),
        ("first client synced (cold translate)", f"{fleet['first_client_sync_s']:.3f} s", "", "", "", ""),
        (f"full push, {n} clients ACKed", f"{sotw['full_push_s']:.3f} s", f"{delta['full_push_s']:.3f} s",
         f"{result['ratios']['full_push_delta_over_sotw']:.2f}", "<= 2 s",
         verdict(max(sotw["full_push_s"], delta["full_push_s"]), FLOORS["full_push_s"])),
        ("  control-plane CPU for it", f"{sotw['full_push_cp_cpu_s']:.2f} s", f"{delta['full_push_cp_cpu_s']:.2f} s",
         f"{delta['full_push_cp_cpu_s'] / max(1e-9, sotw['full_push_cp_cpu_s']):.2f}", "", ""),
        ("  bytes pushed", f"{sotw['full_push_bytes'] / 1e6:.1f} MB", f"{delta['full_push_bytes'] / 1e6:.1f} MB",
         f"{delta['full_push_bytes'] / max(1, sotw['full_push_bytes']):.2f}", "", ""),
        (f"1 endpoint change (median of {CHANGES}): file -> installed", f"{sotw['endpoint_change']['file_to_applied_s']:.3f} s",
         f"{delta['endpoint_change']['file_to_applied_s']:.3f} s", "", "", ""),
        (f"  installed -> all {n} (max)",
         f"{sotw['endpoint_change']['push_to_all_s'] * 1e3:.1f} ms ({sotw['endpoint_change']['push_to_all_max_s'] * 1e3:.0f})",
         f"{delta['endpoint_change']['push_to_all_s'] * 1e3:.1f} ms ({delta['endpoint_change']['push_to_all_max_s'] * 1e3:.0f})",
         f"{result['ratios']['endpoint_change_time_delta_over_sotw']:.3f}", "Delta <= 100 ms",
         verdict(delta["endpoint_change"]["push_to_all_s"], FLOORS["endpoint_change_delta_s"])),
        ("  bytes to all", f"{sotw['endpoint_change']['bytes'] / 1e3:.1f} kB",
         f"{delta['endpoint_change']['bytes'] / 1e3:.1f} kB",
         f"{result['ratios']['endpoint_change_bytes_delta_over_sotw']:.2f}",
         f"each <= 1 % of all EDS ({whole_eds / 1e6:.1f} MB): {bytes_ratio:.3%}",
         verdict(bytes_ratio, FLOORS["endpoint_change_bytes_ratio"])),
        ("1 DestinationRule change: CDS + EDS bytes to all",
         *(f"{m['rule_change_bytes'].get('CDS', 0) / 1e6:.1f} + {m['rule_change_bytes'].get('EDS', 0) / 1e6:.2f} MB"
           for m in (sotw, delta)), "", "", ""),
        ("control-plane RSS", f"{sotw['rss_mb']:.0f} MB", f"{delta['rss_mb']:.0f} MB", "",
         f"idle {fleet['rss_idle_mb']:.0f} MB", ""),
        ("  full GCs in push + changes (s; longest <=)",
         *(f"{m['full_gc']['count']} ({m['full_gc']['seconds']:.3f} s; "
           f"{m['full_gc']['longest_le'] * 1e3:g} ms)" for m in (sotw, delta)), "", "", ""),
        (f"file change -> Envoy route, p50 of {envoy['samples']}", f"{envoy['p50_s'] * 1e3:.0f} ms",
         f"(min {envoy['min_s'] * 1e3:.0f}, max {envoy['max_s'] * 1e3:.0f})", "", "<= 300 ms",
         verdict(envoy["p50_s"], FLOORS["file_to_envoy_p50_s"])),
        (f"  same, next to the {args.services} services, p50 of {envoy_big['samples']}", f"{envoy_big['p50_s'] * 1e3:.0f} ms",
         f"{envoy_big_delta['p50_s'] * 1e3:.0f} ms", f"{envoy_big_delta['p50_s'] / max(1e-9, envoy_big['p50_s']):.2f}",
         "<= 300 ms", verdict(min(envoy_big["p50_s"], envoy_big_delta["p50_s"]), FLOORS["file_to_envoy_p50_s"])),
        ("    (min, max)", f"({envoy_big['min_s'] * 1e3:.0f}, {envoy_big['max_s'] * 1e3:.0f})",
         f"({envoy_big_delta['min_s'] * 1e3:.0f}, {envoy_big_delta['max_s'] * 1e3:.0f})", "", "", ""),
    ]
    header = ("measure", "SotW", "Delta", "Delta/SotW", "floor", "")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    for r in [header] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    os.makedirs(os.path.join(ROOT, "artifacts", "bench"), exist_ok=True)
    path = os.path.join(ROOT, "artifacts", "bench", "xds.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nmachine: {os.cpu_count()} CPUs, load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after"
          " (other work on the machine stretches wall times; CPU seconds do not)")
    print(f"wrote {os.path.relpath(path, ROOT)} ({result['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
