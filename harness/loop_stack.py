"""The decision loop's stack for real, for benchmarks (and tests): decoder replicas on
their own loopback addresses behind a control-plane-fed gateway with the header-contract
Wasm filter (ECDS), their InferencePool in a directory, and `mcpctl scheduler run`.

    with LoopStack(replica_args=("--kv-cache-mb", "1")) as st:   # replicas, echo, control plane, Envoy
        loop = st.start_loop("--remap-hold-s", "2")                # LoopProcess; .status(), .stop()
        st.qos_seen()                                              # the class the upstream got
        st.clear_remaps()

The configuration is the one tests/scheduler/e2e/test_decision_loop.py asserts on: `/v1/` routes to
the replicas (models.mesh.local), everything else to an echo upstream that shows the
headers Envoy forwarded (so `qos_seen` reads the class the filter gave).
"""
from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

from harness.endpoint_picker import pool_yaml
from mcp26.demo.stack.inference_server import InferenceServer
from mcp26.wasm import HEADER_CONTRACT_WASM as WASM
from mcp26.demo.stack.ports import free_port, port_free_on_all
from mcp26.demo.stack.processes import stop_process
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.demo.stack.control_plane import GATEWAY_NODE, ControlPlane, mesh_envoy, write_config

HOSTS = ("127.0.0.2", "127.0.0.3")
KEY = hashlib.sha256(b"decision loop key").digest()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the Wasm seed table (the loop's default policy) is built and compiled once into this cache,
# the one tests/scheduler/e2e/test_decision_loop.py and test_policy_plugins.py use; later loads ~0.3 s
POLICY_CACHE = os.path.join(ROOT, ".cache", "policy-tests")


def mesh_yaml(gw_port: int, echo_port: int, replica_port: int, hosts=HOSTS, key: bytes = KEY) -> str:
    sha = hashlib.sha256(open(WASM, "rb").read()).hexdigest()
    plugin = {"sessionKey": base64.b64encode(key).decode()}
    endpoints = "\n".join(f"  - {{address: {h}, ports: {{http: {replica_port}}}}}" for h in hosts)
    return f"""apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: gw, namespace: default}}
spec:
  selector: {{istio: ingressgateway}}
  servers: [{{port: {{number: {gw_port}, name: http, protocol: HTTP}}, hosts: ["*"]}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: echo, namespace: default}}
spec:
  hosts: [echo.mesh.local]
  location: MESH_INTERNAL
  ports: [{{number: 80, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints: [{{address: 127.0.0.1, ports: {{http: {echo_port}}}}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: models, namespace: default}}
spec:
  hosts: [models.mesh.local]
  location: MESH_INTERNAL
  ports: [{{number: 80, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints:
{endpoints}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: routes, namespace: default}}
spec:
  hosts: ["*"]
  gateways: [gw]
  http:
  - match: [{{uri: {{prefix: /v1/}}}}]
    route: [{{destination: {{host: models.mesh.local}}}}]
  - route: [{{destination: {{host: echo.mesh.local}}}}]
---
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {{name: header-contract, namespace: default}}
spec:
  selector: {{matchLabels: {{istio: ingressgateway}}}}
  url: file://{WASM}
  sha256: "{sha}"
  phase: AUTHZ
  pluginName: mcp-header-contract
  failStrategy: FAIL_CLOSE
  pluginConfig: {json.dumps(plugin)}
"""


class LoopProcess:
    """`mcpctl scheduler run` over the stack's pool; the ready line gives its admin port."""

    def __init__(self, pool_dir: str, cp_admin: str, *extra: str, period_ms: int = 200):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mcp26.mesh.cli", "scheduler", "run", "--config-dir", pool_dir,
             "--pool", "inference/decoders", "--control-plane", cp_admin, "--period-ms", str(period_ms),
             "--log-level", "WARNING", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "MCP_POLICY_CACHE": POLICY_CACHE})
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(self.proc.stderr.read())
        self.ready = json.loads(line)
        self.admin = f"127.0.0.1:{self.ready['admin_port']}"

    def status(self) -> dict:
        """GET /status directly (what `mcpctl scheduler status --json` prints, without a process)."""
        with urllib.request.urlopen(f"http://{self.admin}/status", timeout=10) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        stop_process(self.proc)


class LoopStack:
    def __init__(self, model: str = "builtin:tiny-decoder", replica_args=(), hosts=HOSTS):
        self.model, self.replica_args, self.hosts = model, tuple(replica_args), hosts
        self.replicas: list[InferenceServer] = []
        self.port = self.gw_port = None
        self.echo = self.cp = self.envoy = None

    def _replica(self, host: str) -> InferenceServer:
        r = InferenceServer(self.model, *self.replica_args, "--host", host)    # admin on 127.0.0.1
        r.http_port = self.port
        r.args[r.args.index("--http-port") + 1] = str(self.port)
        return r

    def start(self) -> "LoopStack":
        if not os.path.exists(WASM):
            raise RuntimeError("no header-contract filter: run `make wasm` first")
        self.port, self.gw_port = port_free_on_all(self.hosts), free_port()
        try:
            self.start_replicas()
            self.echo = EchoUpstream("echo").start()
            self.cp_dir = tempfile.mkdtemp(prefix="loop-cp-")
            self.pool_dir = tempfile.mkdtemp(prefix="loop-pool-")
            write_config(self.cp_dir, "mesh.yaml", mesh_yaml(self.gw_port, self.echo.port, self.port, self.hosts))
            write_config(self.pool_dir, "pool.yaml", pool_yaml(self.port, self.hosts))
            self.cp = ControlPlane(self.cp_dir).start()
            self.envoy = mesh_envoy(self.cp, labels={"istio": "ingressgateway"}, namespace="default")
            self.envoy.start()
            self.cp.wait_synced(GATEWAY_NODE, types=("CDS", "LDS", "ECDS"))
            deadline = time.monotonic() + 20
            while self.qos_seen() != "standard":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the gateway never served: {self.envoy.log_tail()}")
                time.sleep(0.1)
        except BaseException:
            self.close()
            raise
        return self

    def start_replicas(self) -> None:
        self.replicas = [self._replica(h).start() for h in self.hosts]

    def restart_replicas(self) -> None:
        """Fresh replicas (empty KV caches and queues) on the same addresses and port."""
        for r in self.replicas:
            r.stop()
        self.start_replicas()

    @property
    def endpoints(self) -> list[str]:
        return [f"{h}:{self.port}" for h in self.hosts]

    def start_loop(self, *extra: str, period_ms: int = 200) -> LoopProcess:
        return LoopProcess(self.pool_dir, f"127.0.0.1:{self.cp.admin_port}", *extra, period_ms=period_ms)

    def qos_seen(self, timeout: float = 5.0) -> str | None:
        """The QoS class the upstream behind the gateway received for an anonymous request."""
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.gw_port, timeout=timeout)
            conn.request("GET", "/echo", headers={"host": "echo.example.com"})
            doc = json.loads(conn.getresponse().read() or b"{}")
            conn.close()
            return doc.get("headers", {}).get("x-mcp-qos-class")
        except (OSError, ValueError):
            return None

    def clear_remaps(self, klass: str = "standard") -> None:
        req = urllib.request.Request(f"http://127.0.0.1:{self.cp.admin_port}/scheduler/class-remap?from={klass}",
                                     method="DELETE")
        urllib.request.urlopen(req, timeout=5).read()

    def close(self) -> None:
        for closer in (self.envoy and self.envoy.stop, self.cp and self.cp.close, self.echo and self.echo.stop,
                       *(r.stop for r in self.replicas)):
            if closer:
                try:
                    closer()
                except Exception:
                    pass

    def __enter__(self) -> "LoopStack":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
