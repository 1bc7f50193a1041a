"""The control plane on a real Kubernetes API server, beside the same workload in a directory.

    MCP_KUBE_APISERVER=/path/kube-apiserver python -m benchmarks kubernetes
    KUBE_SERVICES=100 KUBE_CLIENTS=20 KUBE_SECONDS=10 python -m benchmarks kubernetes    # quick

1,000 Services, each with 2 Pods (status.podIP set through the status subresource) and an
EndpointSlice, in a kube-apiserver + etcd on loopback (harness.kube_cluster); 100 ADS clients
(benchmarks/xds_load_clients.py, in 2 processes, 10 node shapes). Per source, a fresh
`mcpctl xds serve` (`--kubeconfig`, or `--config-dir` holding the same objects as YAML):
- initial sync: process start -> config loaded (the API server: every kind listed), then
  clients started -> every client holds and has ACKed everything; RSS after;
- API-server requests the control plane caused per second (the server's own
  apiserver_request_total for LIST, WATCH and GET: the benchmark itself only writes), during
  the initial sync and during churn;
- churn: every second for KUBE_SECONDS, 1 % of the EndpointSlices get a new endpoint address
  (written to the API server, or the Service's file rewritten); per change and client, the
  time from the change being stored (the last write of the second returned) to that client
  receiving EDS: p50/p99/max.
istiod's published figures beside both. JSON in artifacts/bench/kubernetes.json.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import re
import statistics
import sys
import tempfile
import time

from benchmarks.bench_xds import cpu_s, rss_mb
from benchmarks.bench_xds_scale import ISTIOD, Fleet, churn_latencies, percentile
from benchmarks.xds_config import GATEWAY
from harness.kube_cluster import KubeCluster, binaries, stand_in_crds
from mcp26.demo.stack.control_plane import ControlPlane

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NS = "scale"
# The clients are gateways (istio=ingressgateway): a Gateway and a route over every Service,
# so each holds a listener, its routes, every cluster and every EDS.
ROUTES = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: all, namespace: default}}
spec:
  hosts: ["*"]
  gateways: [bench-gw]
  http:
{routes}
"""


def gateway_yaml(services: int) -> str:
    routes = "\n".join(f"  - match: [{{uri: {{prefix: /s{i}/}}}}]\n    route: [{{destination: {{host: "
                       f"svc-{i:04d}.{NS}.svc.cluster.local, port: {{number: 8080}}}}}}]" for i in range(services))
    return GATEWAY.format(port=18080) + "---\n" + ROUTES.format(routes=routes)


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def objects(i: int, generation: int = 0) -> tuple[dict, list[dict], dict]:
    """Service i, its two Pods (with their status) and its EndpointSlice (`generation` moves the addresses)."""
    name = f"svc-{i:04d}"
    ips = [f"10.{64 + (i * 2 + k) // 65536}.{(i * 2 + k) // 256 % 256}.{(i * 2 + k) % 256}" for k in range(2)]
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS, "labels": {"app": name}},
           "spec": {"clusterIP": f"10.96.{100 + i // 250}.{i % 250 + 1}", "selector": {"app": name},
                    "ports": [{"name": "http", "port": 8080, "targetPort": 9080, "protocol": "TCP"}]}}
    pods = [{"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": f"{name}-{k}", "namespace": NS, "labels": {"app": name}},
             "spec": {"containers": [{"name": "app", "image": "example.com/app:1",
                                      "ports": [{"containerPort": 9080, "name": "http"}]}]},
             "status": {"podIP": ip, "podIPs": [{"ip": ip}], "phase": "Running"}} for k, ip in enumerate(ips)]
    eps = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": f"{name}-abc", "namespace": NS, "labels": {"kubernetes.io/service-name": name}},
           "addressType": "IPv4", "ports": [{"name": "http", "port": 9080 + generation % 1000, "protocol": "TCP"}],
           "endpoints": [{"addresses": [ip], "conditions": {"ready": True},
                          "targetRef": {"kind": "Pod", "name": p["metadata"]["name"], "namespace": NS}}
                         for ip, p in zip(ips, pods)]}
    return svc, pods, eps


def populate(kube: KubeCluster, services: int) -> float:
    kube.namespace(NS)
    started = time.time()

    def one(i: int) -> None:
        svc, pods, eps = objects(i)
        kube.ok("POST", f"/api/v1/namespaces/{NS}/services", svc)
        for p in pods:
            status = p.pop("status")
            kube.ok("POST", f"/api/v1/namespaces/{NS}/pods", p)
            kube.set_pod_ip(NS, p["metadata"]["name"], status["podIP"])
        kube.ok("POST", f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices", eps)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(services)))
    kube.kubectl("apply", "--server-side", "-f", "-", input=gateway_yaml(services))
    return time.time() - started


def write_directory(d: str, services: int) -> None:
    import yaml
    with open(os.path.join(d, "gateway.yaml"), "w") as f:
        f.write(gateway_yaml(services))
    for i in range(services):
        write_service(d, i, 0, yaml)


def write_service(d: str, i: int, generation: int, yaml) -> None:
    svc, pods, eps = objects(i, generation)
    path = os.path.join(d, f"svc-{i:04d}.yaml")
    with open(path + ".tmp", "w") as f:
        yaml.safe_dump_all([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}] if i == 0 else [], f)
        f.write("---\n")
        yaml.safe_dump_all([svc, *pods, eps], f)
    os.replace(path + ".tmp", path)


def reads(kube: KubeCluster) -> float:
    """LIST + WATCH + GET requests the API server has served (apiserver_request_total)."""
    total = 0.0
    for line in kube.call("GET", "/metrics")[1].splitlines():
        if line.startswith("apiserver_request_total{") and any(f'verb="{v}"' in line for v in ("LIST", "WATCH", "GET")):
            if re.search(r'[{,]resource=""', line):      # /metrics, /readyz: not the control plane's
                continue
            total += float(line.rsplit(" ", 1)[1])
    return total


def run_source(source: str, kube: KubeCluster, services: int, clients: int, seconds: int, procs: int,
               shapes: int) -> dict:
    import yaml
    out: dict = {"source": source, "loadavg_before": os.getloadavg()}
    with tempfile.TemporaryDirectory() as d:
        if source == "directory":
            write_directory(d, services)
            cp = ControlPlane(d, test_hooks=False, log_level="warning")
        else:
            cp = ControlPlane(None, kubeconfig=kube.kubeconfig, test_hooks=False, log_level="warning",
                              extra_args=["--no-status"])
        fleet = None
        try:
            reads0, t_start = reads(kube), time.time()
            cp.start(timeout=300)
            while not json.loads(cp.get("/healthz")[1])["config_loaded"]:
                assert time.time() - t_start < 300, cp.log_tail()
                time.sleep(0.05)
            out["ready_s"] = time.time() - t_start
            pid = cp.proc.pid
            t0 = time.time()
            fleet = Fleet(cp.address, clients, procs, shapes, "delta", 25)
            deadline = time.monotonic() + 300
            while (synced := fleet.synced())[0] < clients and time.monotonic() < deadline:
                time.sleep(0.05)
            count, done = synced
            out["initial"] = {"synced": count, "push_s": (done or time.time()) - t0, "total_s": (done or time.time()) - t_start,
                              "api_reads_per_s": (reads(kube) - reads0) / max(1e-9, time.time() - t_start),
                              "rss_mb": rss_mb(pid)["VmRSS"], "cp_cpu_s": cpu_s(pid)}
            print(f"  {source} initial: {out['initial']}", flush=True)
            churn = max(1, services // 100)
            changed_at: list[float] = []
            reads1, c1, w0 = reads(kube), cpu_s(pid), time.time()
            for second in range(seconds):
                time.sleep(max(0.0, w0 + second - time.time()))
                for k in range(churn):
                    i = (second * churn + k) % services
                    if source == "directory":
                        write_service(d, i, second + 1, yaml)
                    else:
                        _, _, eps = objects(i, second + 1)
                        kube.ok("PATCH", f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices/{eps['metadata']['name']}",
                                {"ports": eps["ports"]}, content_type="application/merge-patch+json")
                changed_at.append(time.time())
            time.sleep(max(0.0, w0 + seconds - time.time()) + 2.0)
            wall = time.time() - w0
            out["churn_reads_per_s"] = (reads(kube) - reads1) / wall
            out["churn_cp_cores"] = (cpu_s(pid) - c1) / wall
            out["rss_after_mb"] = rss_mb(pid)["VmRSS"]
        finally:
            records = fleet.stop() if fleet is not None else {}
            cp.close()
    lat, _, missing = churn_latencies(records, changed_at)
    out["churn"] = {"changes": len(changed_at), "per_change": max(1, services // 100), "samples": len(lat),
                    "missing": missing,
                    "p50_ms": 1e3 * statistics.median(lat) if lat else None,
                    "p99_ms": 1e3 * percentile(lat, 0.99) if lat else None,
                    "max_ms": 1e3 * max(lat) if lat else None}
    out["loadavg_after"] = os.getloadavg()
    return out


def main(argv: list[str]) -> int:
    api, _, why = binaries()
    if not api:
        print(f"bench kubernetes: {why}", file=sys.stderr)
        return 2
    services = env_int("KUBE_SERVICES", 1000)
    clients = env_int("KUBE_CLIENTS", 100)
    seconds = env_int("KUBE_SECONDS", 60)
    procs, shapes = env_int("KUBE_PROCS", 2), env_int("KUBE_SHAPES", 10)
    out: dict = {"config": {"services": services, "pods": 2 * services, "clients": clients, "seconds": seconds,
                            "procs": procs, "shapes": shapes}, "machine": {"cpus": os.cpu_count()}}
    with KubeCluster() as kube:
        kube.crds(stand_in_crds())
        out["populate_s"] = populate(kube, services)
        print(f"  {services} Services, {2 * services} Pods, {services} EndpointSlices stored in {out['populate_s']:.0f} s",
              flush=True)
        for source in ("kubernetes", "directory"):
            out[source] = run_source(source, kube, services, clients, seconds, procs, shapes)
        apiserver = next(p for p in kube.procs if "apiserver" in p.args[0])
        out["apiserver_rss_mb"] = rss_mb(apiserver.pid)["VmRSS"]
    os.makedirs(os.path.join(ROOT, "artifacts", "bench"), exist_ok=True)
    with open(os.path.join(ROOT, "artifacts", "bench", "kubernetes.json"), "w") as f:
        json.dump(out, f, indent=2)
    k, d = out["kubernetes"], out["directory"]
    ms = lambda v: "-" if v is None else f"{v:.0f}"        # noqa: E731
    rows = [("", "API server", "directory", "istiod (published)"),
            ("config", *[f"{services} svc, {2 * services} pods, {clients} clients"] * 2,
             f"{ISTIOD['services']} svc, {ISTIOD['sidecars']} sidecars"),
            ("start -> config loaded", f"{k['ready_s']:.1f} s", f"{d['ready_s']:.1f} s", ""),
            ("clients -> all ACKed", *[f"{x['initial']['push_s']:.1f} s ({x['initial']['synced']}/{clients})" for x in (k, d)], ""),
            ("RSS after sync / after churn", *[f"{x['initial']['rss_mb']:.0f} / {x['rss_after_mb']:.0f} MB" for x in (k, d)],
             f"{ISTIOD['memory_gb']} GB"),
            ("API-server reads/s: initial / churn", f"{k['initial']['api_reads_per_s']:.1f} / {k['churn_reads_per_s']:.2f}",
             f"{d['initial']['api_reads_per_s']:.1f} / {d['churn_reads_per_s']:.2f} (none: not a client)", ""),
            (f"churn {k['churn']['per_change']}/s x {seconds} s: change -> EDS p50/p99/max",
             *[f"{ms(x['churn']['p50_ms'])} / {ms(x['churn']['p99_ms'])} / {ms(x['churn']['max_ms'])} ms" for x in (k, d)], ""),
            ("  samples / never arrived", *[f"{x['churn']['samples']} / {x['churn']['missing']}" for x in (k, d)], ""),
            ("control plane cores in churn", *[f"{x['churn_cp_cores']:.2f}" for x in (k, d)], f"{ISTIOD['vcpu']} vCPU"),
            ("kube-apiserver RSS", f"{out['apiserver_rss_mb']:.0f} MB", "", ""),
            ("load average before / after", *[f"{x['loadavg_before'][0]:.1f} / {x['loadavg_after'][0]:.1f}" for x in (k, d)], "")]
    widths = [max(len(str(r[i])) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
