"""xDS control plane at scale: 2,000 ADS clients over 20 node shapes, 1,000 services.

    python -m benchmarks xds_scale                                       # 2,000 clients, SotW and Delta
    python -m benchmarks.bench_xds_scale --quick                        # 200 clients, 10 s churn
    SCALE_CLIENTS=500 SCALE_SECONDS=20 SCALE_MODES=delta python -m benchmarks xds_scale   # any size

The clients run in SCALE_PROCS load processes (benchmarks/xds_load_clients.py
--report summary: SCALE_STREAMS_PER_CHANNEL streams per HTTP/2 connection,
subscribing and ACKing as Envoy does); their node clusters fall into
SCALE_SHAPES translation keys, so the control plane translates 20 snapshots
and serves 2,000 streams from them. Per mode (SCALE_MODES, "sotw,delta"),
against a fresh `mcpctl xds serve`:
- full push: from the load processes starting until every client holds the
  full config (CDS, LDS, every EDS and RDS name it follows, all ACKed);
  control-plane CPU seconds for it, RSS after (and peak);
- churn: every second for SCALE_SECONDS, 1 % of the services get new endpoint
  ports (one change set); per change and client the time from the config being
  installed to that client receiving EDS (p50/p99/max), and CPU per second of
  the control plane and of the load processes (whose CPU is whose: they share
  the machine's cores).
SCALE_FRONTENDS ("fast", the default; "grpcio,fast" for both, one after the
other per mode) picks what serves ADS (`mcpctl xds serve --grpc-frontend`).
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
from benchmarks.xds_load_clients import node_id
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.control_plane import ControlPlane, write_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIX = "scale-gw"         # the load clients' node-id prefix (xds_load_clients.node_id)

# istiod, "Performance and Scalability" (istio.io docs, Istio 1.12.3-1.16.2): 1,000 services and
# 2,000 sidecars, 70,000 mesh-wide requests per second; istiod used 1 vCPU and 1.5 GB.
ISTIOD = {"services": 1000, "sidecars": 2000, "vcpu": 1.0, "memory_gb": 1.5}


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


class Fleet:
    """The load processes: their status lines while running, each client's record at stop."""

    def __init__(self, address: str, clients: int, procs: int, shapes: int, mode: str, per_channel: int):
        self.n = clients
        self.lock = threading.Lock()
        self.status: dict[int, dict] = {}      # process -> its last status line
        self.final: dict[int, dict] = {}       # process -> its final line
        self.unsynced: dict[int, dict] = {}    # client -> what it lacks at stop (xds_load_clients.diagnosis)
        self.procs = []
        per = -(-clients // procs)
        for p in range(procs):
            count = min(per, clients - p * per)
            if count <= 0:
                break
            proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.xds_load_clients", "--address", address,
                 "--clients", str(count), "--offset", str(p * per), "--mode", mode,
                 "--prefix", PREFIX, "--shapes", str(shapes), "--report", "summary",
                 "--streams-per-channel", str(per_channel),
                 "--chaos", os.environ.get("SCALE_CHAOS", "0")],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
            self.procs.append(proc)
            threading.Thread(target=self._read, args=(p, proc), daemon=True).start()

    def _read(self, p: int, proc) -> None:
        for line in proc.stdout:
            ev = json.loads(line)
            with self.lock:
                if ev.get("final"):
                    self.final[p] = ev
                elif "synced" in ev:
                    self.status[p] = ev

    def synced(self) -> tuple[int, float]:
        """(clients holding the full config, when the last of them got it)."""
        with self.lock:
            st = list(self.status.values())
        return sum(s["synced"] for s in st), max((s["last"] for s in st), default=0.0)

    def per_process(self) -> str:
        """`synced/errors` per load process (`-` for one that has reported nothing yet)."""
        with self.lock:
            st = dict(self.status)
        first = next((s["first_error"] for s in st.values() if s.get("first_error")), "")
        return " ".join(f"{st[p]['synced']}/{st[p].get('errors', 0)}" if p in st else "-"
                        for p in range(len(self.procs))) + (f"; first error: {first}" if first else "")

    def cpu(self) -> float:
        """CPU seconds of the load processes so far."""
        total = 0.0
        for proc in self.procs:
            try:
                total += cpu_s(proc.pid)
            except OSError:
                pass
        return total

    def stop(self) -> dict[int, dict]:
        """Stop the processes; every client's record ({"synced": t, "eds": [t, ...], "error"})."""
        for proc in self.procs:
            try:
                proc.stdin.close()
            except OSError:
                pass
        for proc in self.procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        time.sleep(0.2)                                   # the readers take the last lines
        out = {}
        for ev in self.final.values():
            out.update({int(c): rec for c, rec in ev["clients"].items()})
            self.unsynced.update({int(c): d for c, d in ev.get("unsynced", {}).items()})
        return out


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def churn_latencies(records: dict[int, dict], applied: list[float]) -> tuple[list[float], int, int]:
    """Per (change, client): the first EDS at or after the change's install. Also how many
    arrived only after the next change was installed (late) and how many never did."""
    latencies, late, missing = [], 0, 0
    for rec in records.values():
        times = rec["eds"]
        j = 0
        for k, a in enumerate(applied):
            while j < len(times) and times[j] < a:
                j += 1
            if j == len(times):
                missing += 1
                continue
            latencies.append(times[j] - a)
            if k + 1 < len(applied) and times[j] >= applied[k + 1]:
                late += 1
    return latencies, late, missing


def describe_unsynced(unsynced: dict[int, dict], server_view: dict[str, dict]) -> list[dict]:
    """Per client not synced at the end: what it lacks (its own account, at stop) next to what
    the control plane's /debug/syncz said of its node when the push was given up on.
    Printed, one line each, so that a stall names its type, names and nonces."""
    out = []
    for i, d in sorted(unsynced.items()):
        server = server_view.get(node_id(i, PREFIX), {}).get("types", {})
        rec = {"client": i, **d, "server": {t: {k: s.get(k) for k in ("status", "sent_nonce", "acked_nonce",
                                                                      "resources")}
                                            for t, s in server.items()}}
        out.append(rec)
        print(f"  unsynced client {i}: {json.dumps(rec, sort_keys=True)}", flush=True)
    return out


def run_mode(mode: str, clients: int, seconds: int, procs: int, shapes: int, services: int,
             per_channel: int, frontend: str = "fast") -> dict:
    churn = max(1, services // 100)                    # 1 % of the services per second
    out: dict = {"mode": mode, "frontend": frontend, "loadavg_before": os.getloadavg()}
    server_view: dict = {}                             # the control plane's syncz, if the push stalls
    with tempfile.TemporaryDirectory() as d:
        write_mesh(d, services, 10, free_port())
        cp = ControlPlane(d, test_hooks=False, log_level="warning", grpc_frontend=frontend)
        fleet = None
        try:
            cp.start(timeout=120)
            deadline = time.monotonic() + 120
            while not json.loads(cp.get("/healthz")[1])["config_loaded"]:
                if time.monotonic() > deadline:
                    raise TimeoutError(cp.log_tail())
                time.sleep(0.1)
            pid = cp.proc.pid
            time.sleep(1.0)
            out["rss_idle_mb"] = rss_mb(pid)["VmRSS"]
            cpu0, t0 = cpu_s(pid), time.time()
            fleet = Fleet(cp.address, clients, procs, shapes, mode, per_channel)
            # Bounded: past SCALE_PUSH_TIMEOUT the push is reported as how many had synced.
            deadline = time.monotonic() + env_int("SCALE_PUSH_TIMEOUT", 300)
            progress = time.monotonic() + 15
            while (synced := fleet.synced())[0] < clients:
                if time.monotonic() > deadline or all(p.poll() is not None for p in fleet.procs):
                    break
                if time.monotonic() > progress:
                    print(f"  {mode}: {synced[0]}/{clients} synced after {time.time() - t0:.0f} s "
                          f"(per process, synced/errors: {fleet.per_process()})", flush=True)
                    progress += 15
                time.sleep(0.1)
            count, done = synced
            complete = count == clients
            push_cpu, load_cpu = cpu_s(pid) - cpu0, fleet.cpu()
            peak_push = rss_mb(pid)["VmHWM"]
            time.sleep(2.0)                                # the trim after the burst
            mem = rss_mb(pid)
            out["full_push"] = {"synced": count, "complete": complete,
                                "wall_s": (done if complete else time.time()) - t0,
                                "cp_cpu_s": push_cpu, "load_cpu_s": load_cpu,
                                "rss_mb": mem["VmRSS"], "rss_peak_mb": peak_push}
            print(f"  {mode} full push: {out['full_push']}", flush=True)
            if not complete:            # what the control plane said while clients were missing
                print("  control plane log tail:\n" + cp.log_tail(), flush=True)
                server_view = {n["node"]: n for n in cp.syncz()}

            applied_at, applied_lags = [], []
            cpu1, lcpu1, w0 = cpu_s(pid), fleet.cpu(), time.time()
            for second in range(seconds):
                time.sleep(max(0.0, w0 + second - time.time()))
                generation = cp.configz()["generation"]
                written = time.time()
                for k in range(churn):
                    i = (second * churn + k) % services
                    write_config(d, f"svc-{i:04d}.yaml",
                                 service_yaml(i, ports=(30000 + second % 1000, 31000 + second % 1000)))
                status = cp.wait_generation_change(generation, timeout=30)
                applied_at.append(status["applied_at"])
                applied_lags.append(status["applied_at"] - written)
            time.sleep(max(0.0, w0 + seconds - time.time()) + 1.0)   # the last change's pushes
            churn_wall = time.time() - w0
            churn_cpu, churn_load_cpu = cpu_s(pid) - cpu1, fleet.cpu() - lcpu1
            mem = rss_mb(pid)
        finally:
            records = fleet.stop() if fleet is not None else {}
            cp.close()
    if fleet is not None and fleet.unsynced:
        out["unsynced"] = describe_unsynced(fleet.unsynced, server_view)
    latencies, late, missing = churn_latencies(records, applied_at)
    out["churn"] = {"changes": seconds, "services_per_change": churn, "wall_s": churn_wall,
                    "cp_cpu_s": churn_cpu, "cp_cores": churn_cpu / churn_wall,
                    "load_cores": churn_load_cpu / churn_wall,
                    "push_p50_ms": 1e3 * statistics.median(latencies) if latencies else None,
                    "push_p99_ms": 1e3 * percentile(latencies, 0.99) if latencies else None,
                    "push_max_ms": 1e3 * max(latencies) if latencies else None,
                    "samples": len(latencies), "late": late, "missing": missing,
                    "file_to_applied_p50_ms": 1e3 * statistics.median(applied_lags),
                    "rss_mb": mem["VmRSS"], "rss_peak_mb": mem["VmHWM"]}
    out["errors"] = sorted({r["error"] for r in records.values() if r.get("error")})
    out["stream_restarts"] = sum(r.get("restarts", 0) for r in records.values())
    kinds: dict[str, int] = {}
    for ev in (fleet.final.values() if fleet is not None else ()):
        for k, n in ev.get("stream_errors", {}).items():
            kinds[k] = kinds.get(k, 0) + n
    out["stream_errors"] = kinds                        # every stream error, by kind
    out["clients_reported"] = len(records)
    out["loadavg_after"] = os.getloadavg()
    return out


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    clients = env_int("SCALE_CLIENTS", 200 if quick else 2000)
    seconds = env_int("SCALE_SECONDS", 10 if quick else 60)
    procs = env_int("SCALE_PROCS", 4)
    shapes = env_int("SCALE_SHAPES", 20)
    services = env_int("SCALE_SERVICES", 1000)
    per_channel = env_int("SCALE_STREAMS_PER_CHANNEL", 25)
    frontends = [f for f in os.environ.get("SCALE_FRONTENDS", "fast").split(",") if f]
    # One column per run: "delta", or "delta fast" when more than one frontend is measured.
    runs = [(m, f, m if len(frontends) == 1 else f"{m} {f}")
            for m in (x for x in os.environ.get("SCALE_MODES", "sotw,delta").split(",") if x) for f in frontends]
    modes = [label for _, _, label in runs]
    started = time.time()
    out: dict = {"config": {"clients": clients, "seconds": seconds, "procs": procs, "shapes": shapes,
                            "services": services, "streams_per_channel": per_channel, "modes": modes},
                 "machine": {"cpus": os.cpu_count()}}
    for mode, frontend, label in runs:
        out[label] = run_mode(mode, clients, seconds, procs, shapes, services, per_channel, frontend)
    out["wall_s"] = time.time() - started
    os.makedirs(os.path.join(ROOT, "artifacts", "bench"), exist_ok=True)
    with open(os.path.join(ROOT, "artifacts", "bench", "xds_scale.json"), "w") as f:
        json.dump(out, f, indent=2)

    istiod_per_proxy_kb = ISTIOD["memory_gb"] * 1024 * 1024 / ISTIOD["sidecars"]
    ms = lambda v: "-" if v is None else f"{v:.0f}"           # noqa: E731
    rows = [("", *modes, "istiod (published)"),
            ("config", *[f"{services} svc x 10 routes, {clients} clients, {shapes} shapes"] * len(modes), ""),
            ("load: processes x streams per connection", *[f"{procs} x {per_channel}"] * len(modes), "")]
    r = [out[m] for m in modes]
    fp = [x["full_push"] for x in r]
    ch = [x["churn"] for x in r]
    rows += [
        ("full push: every client holds + ACKed all",
         *[f"{f['wall_s']:.1f} s" if f["complete"] else f"INCOMPLETE {f['synced']}/{clients} in {f['wall_s']:.0f} s"
           for f in fp], ""),
        ("  CPU: control plane / load processes", *[f"{f['cp_cpu_s']:.1f} / {f['load_cpu_s']:.1f} s" for f in fp], ""),
        ("RSS: idle / after push (peak)",
         *[f"{x['rss_idle_mb']:.0f} / {f['rss_mb']:.0f} MB ({f['rss_peak_mb']:.0f})" for x, f in zip(r, fp)],
         f"{ISTIOD['memory_gb']} GB ({ISTIOD['sidecars']} sidecars)"),
        ("  per client: (RSS - idle) / clients",
         *[f"{(f['rss_mb'] - x['rss_idle_mb']) * 1024 / clients:.0f} kB" for x, f in zip(r, fp)],
         f"{istiod_per_proxy_kb:.0f} kB (whole budget / sidecars)"),
        (f"churn {ch[0]['services_per_change']} svc/s x {seconds} s: install -> EDS p50/p99/max",
         *[f"{ms(c['push_p50_ms'])} / {ms(c['push_p99_ms'])} / {ms(c['push_max_ms'])} ms" for c in ch], ""),
        ("  (change, client): samples / after next change / never",
         *[f"{c['samples']} / {c['late']} / {c['missing']}" for c in ch], ""),
        ("  file written -> installed, p50", *[f"{c['file_to_applied_p50_ms']:.0f} ms" for c in ch], ""),
        ("  cores: control plane / load processes",
         *[f"{c['cp_cores']:.2f} / {c['load_cores']:.2f}" for c in ch], f"{ISTIOD['vcpu']} vCPU"),
        ("  RSS after churn (peak)", *[f"{c['rss_mb']:.0f} MB ({c['rss_peak_mb']:.0f})" for c in ch], ""),
        ("load average (1 min) before / after",
         *[f"{x['loadavg_before'][0]:.1f} / {x['loadavg_after'][0]:.1f}" for x in r], ""),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths)).rstrip())
    for x in r:
        if x["errors"]:
            print(f"{x['mode']} {x['frontend']} client errors ({x.get('stream_restarts', 0)} streams re-opened): "
                  + ", ".join(f"{k} x{n}" for k, n in sorted(x.get("stream_errors", {}).items())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
