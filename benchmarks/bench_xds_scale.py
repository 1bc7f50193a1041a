"""xDS control plane at scale: 2,000 Delta ADS clients over 20 node shapes, 1,000 services.

    python -m benchmarks xds_scale
    SCALE_CLIENTS=400 SCALE_SECONDS=20 python -m benchmarks.bench_xds_scale   # shorter

The clients run in SCALE_PROCS load processes (benchmarks/xds_load_clients.py,
each client its own channel, subscribing and ACKing as Envoy does); the
clients' node clusters fall into SCALE_SHAPES translation keys, so the
control plane translates 20 snapshots and serves 2,000 streams from them.
Measures, against one `mcpctl xds serve`:
- full push: from the first load process starting until every client holds
  CDS, EDS, LDS and RDS; the control plane's CPU seconds for it; RSS (and peak);
- churn: every second for SCALE_SECONDS, 1 % of the services get new endpoint
  ports (one change set); per change and client the time from the config
  being installed to that client receiving EDS (p50/p99/max), and the
  control plane's CPU per second of it.
Prints a table next to istiod's published figures; JSON in artifacts/bench/xds_scale.json.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks.bench_xds import cpu_s, rss_mb
from benchmarks.xds_config import service_yaml, write_mesh
from harness.ports import free_port
from harness.xds import ControlPlane, write_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TYPES = {"CDS", "EDS", "LDS", "RDS"}

# istiod, "Performance and Scalability" (istio.io docs, Istio 1.12.3-1.16.2): 1,000 services and
# 2,000 sidecars, 70,000 mesh-wide requests per second; istiod used 1 vCPU and 1.5 GB.
ISTIOD = {"services": 1000, "sidecars": 2000, "vcpu": 1.0, "memory_gb": 1.5}


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


class Fleet:
    """The load processes and what their clients received (per client: first time per type, EDS times)."""

    def __init__(self, address: str, clients: int, procs: int, shapes: int):
        self.n = clients
        self.lock = threading.Lock()
        self.first: dict[int, dict[str, float]] = {}
        self.eds: dict[int, list[float]] = {}
        self.bytes = 0
        self.errors: list[str] = []
        self.procs = []
        per = -(-clients // procs)
        for p in range(procs):
            count = min(per, clients - p * per)
            if count <= 0:
                break
            proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.xds_load_clients", "--address", address,
                 "--clients", str(count), "--offset", str(p * per), "--mode", "delta",
                 "--prefix", "scale-gw", "--shapes", str(shapes)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
            self.procs.append(proc)
            threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc) -> None:
        for line in proc.stdout:
            ev = json.loads(line)
            if "ty" not in ev:
                if "error" in ev:
                    with self.lock:
                        self.errors.append(f"client {ev['c']}: {ev['error']}")
                continue
            with self.lock:
                self.bytes += ev["b"]
                self.first.setdefault(ev["c"], {}).setdefault(ev["ty"], ev["t"])
                if ev["ty"] == "EDS":
                    self.eds.setdefault(ev["c"], []).append(ev["t"])

    def synced(self) -> tuple[int, float]:
        """(clients holding all four types, when the last of them got its last)."""
        with self.lock:
            done = [max(h[t] for t in TYPES) for h in self.first.values() if TYPES <= h.keys()]
        return len(done), max(done, default=0.0)

    def eds_after(self, since: float) -> list[float | None]:
        """Per client: its first EDS at or after `since` (None: none yet)."""
        with self.lock:
            return [next((t for t in times if t >= since), None) for times in self.eds.values()] \
                + [None] * (self.n - len(self.eds))

    def stop(self) -> None:
        for proc in self.procs:
            try:
                proc.stdin.close()
                proc.wait(20)
            except (subprocess.TimeoutExpired, OSError):
                proc.kill()
                proc.wait()


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> int:
    clients = env_int("SCALE_CLIENTS", 2000)
    seconds = env_int("SCALE_SECONDS", 60)
    procs = env_int("SCALE_PROCS", 4)
    shapes = env_int("SCALE_SHAPES", 20)
    services = env_int("SCALE_SERVICES", 1000)
    churn = max(1, services // 100)                    # 1 % of the services per second
    load_before = os.getloadavg()
    started = time.time()
    out: dict = {"config": {"clients": clients, "seconds": seconds, "procs": procs, "shapes": shapes,
                            "services": services, "churn_services_per_s": churn, "mode": "delta"}}
    with tempfile.TemporaryDirectory() as d:
        write_mesh(d, services, 10, free_port())
        cp = ControlPlane(d, test_hooks=False, log_level="warning")
        fleet = None
        try:
            cp.start(timeout=120)
            deadline = time.monotonic() + 120
            while not json.loads(cp.get("/healthz")[1])["config_loaded"]:
                if time.monotonic() > deadline:
                    raise TimeoutError(cp.log_tail())
                time.sleep(0.1)
            pid = cp.proc.pid
            out["rss_idle_mb"] = rss_mb(pid)["VmRSS"]
            cpu0, t0 = cpu_s(pid), time.time()
            fleet = Fleet(cp.address, clients, procs, shapes)
            # Bounded: past SCALE_PUSH_TIMEOUT the push is reported as how many had synced.
            deadline = time.monotonic() + env_int("SCALE_PUSH_TIMEOUT", 240)
            progress = time.monotonic() + 15
            while (synced := fleet.synced())[0] < clients:
                if time.monotonic() > deadline or all(p.poll() is not None for p in fleet.procs):
                    break
                if time.monotonic() > progress:
                    print(f"  {synced[0]}/{clients} synced after {time.time() - t0:.0f} s", flush=True)
                    progress += 15
                time.sleep(0.1)
            count, done = synced
            complete = count == clients
            time.sleep(1.0)                                # the trim after the burst
            mem = rss_mb(pid)
            out["full_push"] = {"synced": count, "complete": complete,
                                "wall_s": (done if complete else time.time()) - t0, "cp_cpu_s": cpu_s(pid) - cpu0,
                                "bytes": fleet.bytes, "rss_mb": mem["VmRSS"], "rss_peak_mb": mem["VmHWM"]}
            print(f"full push: {out['full_push']}", flush=True)

            latencies, missing, applied_lags = [], 0, []
            cpu1, w0 = cpu_s(pid), time.time()
            round_no = 0
            for second in range(seconds):
                tick = w0 + second
                time.sleep(max(0.0, tick - time.time()))
                generation = cp.configz()["generation"]
                written = time.time()
                for k in range(churn):
                    i = (second * churn + k) % services
                    write_config(d, f"svc-{i:04d}.yaml",
                                 service_yaml(i, ports=(30000 + round_no % 1000, 31000 + round_no % 1000)))
                round_no += 1
                status = cp.wait_generation_change(generation, timeout=30)
                applied_lags.append(status["applied_at"] - written)
                applied = status["applied_at"]
                got_deadline = time.monotonic() + 0.95
                while time.monotonic() < got_deadline:      # within this second
                    got = fleet.eds_after(applied)
                    if all(t is not None for t in got):
                        break
                    time.sleep(0.02)
                got = fleet.eds_after(applied)
                latencies += [t - applied for t in got if t is not None]
                missing += sum(t is None for t in got)
            churn_wall = time.time() - w0
            churn_cpu = cpu_s(pid) - cpu1
            mem = rss_mb(pid)
            out["churn"] = {"changes": seconds, "wall_s": churn_wall, "cp_cpu_s": churn_cpu,
                            "cp_cores": churn_cpu / churn_wall,
                            "push_p50_ms": 1e3 * statistics.median(latencies) if latencies else None,
                            "push_p99_ms": 1e3 * percentile(latencies, 0.99) if latencies else None,
                            "push_max_ms": 1e3 * max(latencies) if latencies else None,
                            "missed_within_1s": missing,
                            "file_to_applied_p50_ms": 1e3 * statistics.median(applied_lags),
                            "rss_mb": mem["VmRSS"], "rss_peak_mb": mem["VmHWM"]}
            out["errors"] = fleet.errors[:10]
        finally:
            if fleet is not None:
                fleet.stop()
            cp.close()
    out["machine"] = {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()}
    out["wall_s"] = time.time() - started
    os.makedirs(os.path.join(ROOT, "artifacts", "bench"), exist_ok=True)
    with open(os.path.join(ROOT, "artifacts", "bench", "xds_scale.json"), "w") as f:
        json.dump(out, f, indent=2)

    fp, ch = out["full_push"], out["churn"]
    per_client_mb = (fp["rss_mb"] - out["rss_idle_mb"]) / clients
    istiod_per_proxy_mb = ISTIOD["memory_gb"] * 1024 / ISTIOD["sidecars"]
    rows = [
        ("config", f"{services} services x 10 routes, {clients} Delta clients, {shapes} shapes, {procs} load procs", ""),
        ("full push: all clients hold CDS/EDS/LDS/RDS",
         f"{fp['wall_s']:.1f} s" if fp["complete"] else f"INCOMPLETE: {fp['synced']}/{clients} in {fp['wall_s']:.0f} s", ""),
        ("  control-plane CPU for it", f"{fp['cp_cpu_s']:.1f} s", ""),
        ("  bytes pushed", f"{fp['bytes'] / 1e9:.2f} GB", ""),
        ("control-plane RSS: idle / with clients (peak)",
         f"{out['rss_idle_mb']:.0f} / {fp['rss_mb']:.0f} MB ({fp['rss_peak_mb']:.0f})",
         f"istiod: {ISTIOD['memory_gb']} GB for {ISTIOD['sidecars']}"),
        ("  per connected client (RSS - idle) / clients", f"{per_client_mb * 1024:.0f} kB",
         f"istiod: {istiod_per_proxy_mb * 1024:.0f} kB (whole budget / sidecars)"),
        (f"churn: {churn} services' endpoints / s for {seconds} s: installed -> client EDS p50 / p99 / max",
         f"{ch['push_p50_ms']:.0f} / {ch['push_p99_ms']:.0f} / {ch['push_max_ms']:.0f} ms", ""),
        ("  (client, change) pairs without EDS within the second", f"{ch['missed_within_1s']}", ""),
        ("  file written -> installed, p50", f"{ch['file_to_applied_p50_ms']:.0f} ms", ""),
        ("  control-plane CPU during churn", f"{ch['cp_cores']:.2f} cores", f"istiod: {ISTIOD['vcpu']} vCPU"),
        ("  RSS after churn (peak)", f"{ch['rss_mb']:.0f} MB ({ch['rss_peak_mb']:.0f})", ""),
        ("load average before / after", " / ".join(f"{x:.1f}" for x in (load_before[0], out["machine"]["loadavg_after"][0])), ""),
    ]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    for r in rows:
        print(f"{r[0]:<{w0}}  {r[1]:<{w1}}  {r[2]}")
    if out["errors"]:
        print("client errors:", *out["errors"], sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
