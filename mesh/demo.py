"""`mcpctl demo` (`make demo`): the mesh end to end on this machine, then a summary.

Brings up the control plane (`mcpctl xds serve`, watching a copy of
istio-manifests/demo/config), three sample upstreams answering v1/v2/v3, and
a gateway Envoy (`mcpctl envoy run`) fed over ADS; then drives the routing
scenario by writing into the watched directory (no restarts): the header
end-user: jason -> v2, an 80/20 v1/v3 split over 1,000 requests, a fault
delay; then the header contract (mesh/demo_contract.py), gRPC-Web and the
console, the inference pool. Prints what went where and a table; exits 0 only
if every check held. Every process it started is stopped, whatever happens
(with --serve: after the checks, everything keeps running and the URLs are
printed until Ctrl-C / SIGTERM; then every process is stopped).

The demo is a list of steps (STEPS); a step is `Step(name, run)` where
`run(demo) -> list[Check]`. Add one by appending to STEPS (or inserting
where it belongs); `demo` gives it the ports, `demo.start(name, argv)` for
processes it needs, `demo.write_config(name, text)` and `demo.get(...)`.
mesh imports no other part: other parts are driven as subprocesses.
"""
from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

import yaml

from mesh.demo_contract import step_header_contract
from mesh.demo_grpcweb import step_grpc_web_console
from mesh.demo_inference import step_inference_pool
from mesh.headers import END_USER

MANIFESTS = Path(__file__).resolve().parent.parent / "istio-manifests" / "demo"
GATEWAY_NODE = "router~127.0.0.1~demo-gateway.default~default.svc.cluster.local"
VERSIONS = ("v1", "v2", "v3")


@dataclass
class Check:
    name: str
    expected: str
    observed: str
    ok: bool


@dataclass
class Step:
    name: str
    run: Callable[["Demo"], list[Check]]


# ---------------------------------------------------------------- processes, ports, config

def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pick(port: int, taken: set[int]) -> int:
    """The default port if it is free, else any free one (so the demo runs next to other things)."""
    if port not in taken and _port_free(port):
        taken.add(port)
        return port
    while True:
        p = _free_port()
        if p not in taken:
            taken.add(p)
            return p


class SampleUpstream:
    """An HTTP server answering its version: body {"upstream": v1, "path": ..., "headers": {what it saw}},
    header x-upstream; `requests` counts what reached it."""

    def __init__(self, version: str, port: int):
        self.version, self.port = version, port
        self.requests = 0
        self._lock = threading.Lock()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def do_GET(self):
                with upstream._lock:
                    upstream.requests += 1
                body = json.dumps({"upstream": upstream.version, "path": self.path,
                                   END_USER: self.headers.get(END_USER, ""),
                                   "headers": {k.lower(): v for k, v in self.headers.items()}}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.send_header("x-upstream", upstream.version)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Demo:
    def __init__(self, args):
        self.args = args
        self.bin = Path(sys.executable).parent
        taken: set[int] = set()
        self.xds_port = _pick(args.xds_port, taken)
        self.admin_port = _pick(args.admin_port, taken)
        self.gateway_port = _pick(args.gateway_port, taken)
        self.envoy_admin_port = _pick(args.envoy_admin_port, taken)
        self.upstream_ports = {v: _pick(args.upstream_port + i, taken) for i, v in enumerate(VERSIONS)}
        self.workdir = Path(tempfile.mkdtemp(prefix="mcp-demo-"))
        self.config_dir = self.workdir / "config"
        self.processes: list[tuple[str, subprocess.Popen, Path]] = []
        self.upstreams: list[SampleUpstream] = []
        self.urls: dict[str, str] = {}      # what a step serves, for --serve (name -> URL)
        self.manifests = Path(args.manifests)

    # -- processes
    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = self.workdir / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append((name, proc, log))
        return proc

    def log_tail(self, name: str, n: int = 20) -> str:
        for pname, _, log in self.processes:
            if pname == name:
                return "".join(log.read_text(errors="replace").splitlines(True)[-n:])
        return ""

    def stop_all(self) -> None:
        for name, proc, _ in reversed(self.processes):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc, _ in reversed(self.processes):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for u in self.upstreams:
            u.stop()
        if not self.args.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- config
    def render(self, text: str) -> str:
        """The manifest with this run's ports (the files carry the defaults)."""
        docs = [d for d in yaml.safe_load_all(text) if d]
        for doc in docs:
            spec = doc.get("spec") or {}
            if doc.get("kind") == "Gateway":
                for server in spec.get("servers", []):
                    server["port"]["number"] = self.gateway_port
            if doc.get("kind") == "ServiceEntry":
                for ep in spec.get("endpoints", []):
                    version = (ep.get("labels") or {}).get("version")
                    if version in self.upstream_ports:
                        ep["ports"] = {name: self.upstream_ports[version] for name in ep.get("ports", {"http": 0})}
        return yaml.safe_dump_all(docs, sort_keys=False)

    def write_config(self, name: str, text: str) -> None:
        """Atomically, as a GitOps sync would: the watcher never sees half a file."""
        tmp = self.config_dir / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.config_dir / name)

    # -- HTTP
    def admin(self, path: str) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}{path}", timeout=5) as r:
            return json.loads(r.read())

    def wait(self, what: str, predicate, timeout: float = 30.0):
        deadline = time.monotonic() + timeout
        last_error = None
        while time.monotonic() < deadline:
            try:
                value = predicate()
                if value:
                    return value
            except (OSError, ValueError, KeyError, http.client.HTTPException) as e:
                last_error = e
            time.sleep(0.05)
        raise RuntimeError(f"timed out waiting for {what}" + (f" (last error: {last_error})" if last_error else ""))

    def apply(self, manifest: str) -> str:
        """Write a step's manifest as virtualservice.yaml; wait until the gateway ACKed it."""
        before = self.admin("/debug/configz")["generation"]
        self.write_config("virtualservice.yaml", self.render((self.manifests / manifest).read_text()))
        status = self.wait("the change to be applied", lambda: (s := self.admin("/debug/configz"))
                           ["generation"] != before and s)
        if status.get("rejected"):
            raise RuntimeError(f"{manifest} rejected: {status['rejected']}")
        self.wait_synced()
        return status["generation"]

    def wait_synced(self) -> None:
        def synced():
            for n in self.admin("/debug/syncz"):
                if n["node"] == GATEWAY_NODE:
                    return all(n["types"].get(t, {}).get("status") == "SYNCED" for t in ("CDS", "EDS", "LDS", "RDS"))
            return False
        self.wait("the gateway to ACK", synced)


class Gateway:
    """Keep-alive HTTP/1.1 requests to the gateway Envoy; returns (status, upstream, seconds)."""

    def __init__(self, port: int):
        self.port = port
        self.conn: http.client.HTTPConnection | None = None

    def get(self, headers: dict | None = None) -> tuple[int, str, float]:
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            started = time.monotonic()
            try:
                self.conn.request("GET", "/reviews", headers={"host": "reviews.demo.local", **(headers or {})})
                resp = self.conn.getresponse()
                resp.read()
                return resp.status, resp.getheader("x-upstream") or "-", time.monotonic() - started
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def count(self, n: int, headers: dict | None = None) -> dict[str, int]:
        out: dict[str, int] = {}
        for _ in range(n):
            status, upstream, _ = self.get(headers)
            key = upstream if status == 200 else f"HTTP {status}"
            out[key] = out.get(key, 0) + 1
        return out

    def close(self) -> None:
        if self.conn:
            self.conn.close()
            self.conn = None


def _show(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "nothing"


# ---------------------------------------------------------------- the steps

def step_upstreams(demo: Demo) -> list[Check]:
    for v, port in demo.upstream_ports.items():
        demo.upstreams.append(SampleUpstream(v, port))
        print(f"  upstream {v} on 127.0.0.1:{port}")
    return []


def step_control_plane(demo: Demo) -> list[Check]:
    demo.config_dir.mkdir(parents=True)
    for f in sorted((demo.manifests / "config").glob("*.yaml")):
        demo.write_config(f.name, demo.render(f.read_text()))
    demo.start("control-plane", [str(demo.bin / "mcpctl"), "xds", "serve", "--config-dir", str(demo.config_dir),
                                 "--port", str(demo.xds_port), "--admin-port", str(demo.admin_port)])
    health = demo.wait("the control plane", lambda: demo.admin("/healthz"))
    print(f"  mcpctl xds serve: ADS 127.0.0.1:{demo.xds_port}, admin http://127.0.0.1:{demo.admin_port}/debug/syncz,"
          f" watching {demo.config_dir}")
    return [Check("config loaded", "a good config", health["generation"] or "none", bool(health["config_loaded"]))]


def step_gateway(demo: Demo) -> list[Check]:
    demo.start("envoy", [str(demo.bin / "mcpctl"), "envoy", "run", "--node-id", GATEWAY_NODE,
                         "--cluster", "demo-gateway", "--xds-address", f"127.0.0.1:{demo.xds_port}",
                         "--admin-port", str(demo.envoy_admin_port), "--label", "istio=ingressgateway",
                         "--bootstrap-path", str(demo.workdir / "envoy-bootstrap.yaml")]
               + (["--delta"] if demo.args.delta else []))

    def ready():
        with urllib.request.urlopen(f"http://127.0.0.1:{demo.envoy_admin_port}/ready", timeout=2) as r:
            return r.status == 200
    demo.wait("Envoy to be ready", ready)
    demo.wait_synced()
    print(f"  Envoy gateway on 127.0.0.1:{demo.gateway_port} ({'Delta' if demo.args.delta else 'SotW'} ADS),"
          f" admin http://127.0.0.1:{demo.envoy_admin_port}")
    return [Check("gateway synced", "CDS EDS LDS RDS SYNCED", "SYNCED", True)]


def step_header_routing(demo: Demo) -> list[Check]:
    gw = Gateway(demo.gateway_port)
    jason = gw.count(20, {END_USER: "jason"})
    others = gw.count(20)
    gw.close()
    print(f"  end-user: jason x20 -> {_show(jason)};  no header x20 -> {_show(others)}")
    return [Check("end-user: jason", "v2 20", _show(jason), jason == {"v2": 20}),
            Check("everyone else", "v1 20", _show(others), others == {"v1": 20})]


def step_split(demo: Demo) -> list[Check]:
    generation = demo.apply("steps/2-split-80-20.yaml")
    gw = Gateway(demo.gateway_port)
    counts = gw.count(1000)
    jason = gw.count(20, {END_USER: "jason"})
    gw.close()
    v1 = counts.get("v1", 0)
    print(f"  applied {generation} from the watched dir; 1000 requests -> {_show(counts)}; jason -> {_show(jason)}")
    # Binomial(1000, 0.8): 740..860 is beyond 4.7 standard deviations.
    return [Check("80/20 v1/v3 over 1000", "v1 740..860, rest v3", _show(counts),
                  740 <= v1 <= 860 and set(counts) == {"v1", "v3"}),
            Check("end-user: jason", "v2 20", _show(jason), jason == {"v2": 20})]


def step_fault_delay(demo: Demo) -> list[Check]:
    generation = demo.apply("steps/3-fault-delay.yaml")
    gw = Gateway(demo.gateway_port)
    delayed = [gw.get({END_USER: "jason"}) for _ in range(3)]
    plain = [gw.get() for _ in range(20)]
    gw.close()
    slowest_plain = max(t for _, _, t in plain)
    fastest_jason = min(t for _, _, t in delayed)
    print(f"  applied {generation}; jason: {', '.join(f'{u} {t * 1e3:.0f} ms' for _, u, t in delayed)};"
          f" others: max {slowest_plain * 1e3:.0f} ms")
    return [Check("jason delayed 0.5 s", ">= 480 ms, v2", f"min {fastest_jason * 1e3:.0f} ms",
                  fastest_jason >= 0.48 and all(u == "v2" for _, u, _ in delayed)),
            Check("others not delayed", "< 480 ms", f"max {slowest_plain * 1e3:.0f} ms", slowest_plain < 0.48)]


def step_proxy_status(demo: Demo) -> list[Check]:
    out = subprocess.run([str(demo.bin / "mcpctl"), "proxy-status", "--admin-address",
                          f"127.0.0.1:{demo.admin_port}"], capture_output=True, text=True, timeout=30)
    print("  " + out.stdout.strip().replace("\n", "\n  "))
    return [Check("proxy-status", "gateway SYNCED", "SYNCED" if "SYNCED" in out.stdout else out.stdout.strip()[:40],
                  out.returncode == 0 and GATEWAY_NODE in out.stdout and "NACKED" not in out.stdout)]


STEPS: list[Step] = [
    Step("sample upstreams v1 v2 v3", step_upstreams),
    Step("control plane", step_control_plane),
    Step("gateway Envoy over ADS", step_gateway),
    Step("header routing", step_header_routing),
    Step("80/20 split", step_split),
    Step("fault delay", step_fault_delay),
    Step("header contract: JWT session headers", step_header_contract),
    Step("gRPC-Web to the inference backend, console", step_grpc_web_console),
    Step("inference pool: two replicas through the gateway", step_inference_pool),
    Step("proxy-status", step_proxy_status),
]


def _urls(demo: Demo) -> list[tuple[str, str]]:
    return [("gateway (reviews)", f"http://127.0.0.1:{demo.gateway_port}/reviews"),
            *demo.urls.items(),
            ("xDS admin", f"http://127.0.0.1:{demo.admin_port}/debug/syncz"),
            ("Envoy admin", f"http://127.0.0.1:{demo.envoy_admin_port}/")]


def _serve(demo: Demo, stop: threading.Event) -> None:
    """--serve: keep every part running, print where to reach them, until Ctrl-C or SIGTERM."""
    print("\nserving (Ctrl-C or SIGTERM stops every process):")
    for name, url in _urls(demo):
        print(f"  {name:<22} {url}")
    print(f"  work dir {demo.workdir} (logs, watched config: {demo.config_dir})", flush=True)
    reported: set[str] = set()
    while not stop.wait(1.0):
        for name, proc, _ in demo.processes:
            if proc.poll() is not None and name not in reported:
                reported.add(name)
                print(f"  {name} exited {proc.returncode}:\n{demo.log_tail(name)}", flush=True)
    print("stopping...", flush=True)


def run(args) -> int:
    demo = Demo(args)
    checks: list[tuple[str, Check]] = []
    failed_step = None
    stop = threading.Event()

    def on_signal(signum, frame):
        if getattr(args, "serve", False) and serving:
            stop.set()                     # --serve: leave the wait, then stop everything
        else:
            raise KeyboardInterrupt        # during the steps: stop everything (finally) and exit
    serving = False
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, on_signal)
        except ValueError:                 # not the main thread: leave the handlers alone
            pass
    try:
        try:
            for i, step in enumerate(STEPS, 1):
                print(f"[{i}/{len(STEPS)}] {step.name}", flush=True)
                try:
                    results = step.run(demo)
                except Exception as e:  # a step that cannot run fails the demo, with its reason
                    failed_step = step.name
                    checks.append((step.name, Check(step.name, "runs", f"{type(e).__name__}: {e}", False)))
                    for name, proc, _ in demo.processes:
                        if proc.poll() is not None:
                            print(f"  {name} exited {proc.returncode}:\n{demo.log_tail(name)}")
                    break
                checks.extend((step.name, c) for c in results)
            rows = [("step", "check", "expected", "observed", "")] + [
                (s, c.name, c.expected, c.observed, "ok" if c.ok else "FAIL") for s, c in checks]
            widths = [max(len(r[i]) for r in rows) for i in range(5)]
            print()
            for r in rows:
                print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
            ok = all(c.ok for _, c in checks) and failed_step is None
            print(f"\ndemo {'passed' if ok else 'FAILED'}: {sum(c.ok for _, c in checks)}/{len(checks)} checks"
                  + (f" (stopped at: {failed_step})" if failed_step else ""), flush=True)
            if getattr(args, "serve", False):
                serving = True
                _serve(demo, stop)
        except KeyboardInterrupt:
            print("\ninterrupted: stopping every process", flush=True)
            return 130
        finally:
            demo.stop_all()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0 if ok else 1


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="run the mesh end to end and show what went where")
    p.add_argument("--manifests", default=str(MANIFESTS), help="the demo's manifests (config/ and steps/)")
    p.add_argument("--delta", action="store_true", help="the gateway uses Delta xDS")
    p.add_argument("--xds-port", type=int, default=18000)
    p.add_argument("--admin-port", type=int, default=18001)
    p.add_argument("--gateway-port", type=int, default=18080)
    p.add_argument("--envoy-admin-port", type=int, default=15000)
    p.add_argument("--upstream-port", type=int, default=18081, help="v1's port; v2 and v3 follow")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, config)")
    p.add_argument("--serve", action="store_true",
                   help="after the checks keep everything running (control plane, Envoy, backend, console) and "
                        "print the URLs, until Ctrl-C / SIGTERM")
    p.set_defaults(func=run)
