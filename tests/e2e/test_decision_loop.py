"""The decision loop for real: two decoder replicas behind a gateway the control plane
feeds (the header-contract filter over ECDS), `mcpctl scheduler run` over their
InferencePool. Long generations fill one replica's KV-cache budget (--kv-cache-mb 1)
past 90 %; the built-in policy remaps standard -> batch; the class the upstream
receives behind the gateway changes within a couple of periods, and comes back
after the hold. A policy that raises or is slow keeps the last decision."""
import base64
import hashlib
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from harness.inference_server import InferenceServer
from harness.paths import HEADER_CONTRACT_WASM as WASM
from harness.ports import free_port, port_is_free
from harness.processes import stop_process
from harness.upstreams import EchoUpstream
from harness.xds import GATEWAY_NODE, ControlPlane, mesh_envoy, write_config

pytestmark = pytest.mark.e2e

HOSTS = ("127.0.0.2", "127.0.0.3")
KEY = hashlib.sha256(b"decision loop key").digest()
PERIOD_MS, HOLD_S = 200, 2.0
# the Wasm seed table is the default policy: its component is built (componentize-py) and compiled
# once into the same cache tests/e2e/test_policy_plugins.py uses; later runs load it in ~0.3 s
POLICY_CACHE = os.path.join(os.path.dirname(__file__), "..", "..", ".cache", "policy-tests")


def _shared_port() -> int:
    for _ in range(50):
        port = free_port(HOSTS[0])
        if all(port_is_free(port, h) for h in HOSTS):
            return port
    raise RuntimeError("no port free on every replica address")


def _mesh_yaml(gw_port, echo_port, replica_port) -> str:
    sha = hashlib.sha256(open(WASM, "rb").read()).hexdigest()
    plugin = {"sessionKey": base64.b64encode(KEY).decode()}
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
  - {{address: {HOSTS[0]}, ports: {{http: {replica_port}}}}}
  - {{address: {HOSTS[1]}, ports: {{http: {replica_port}}}}}
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


def _pool_yaml(port) -> str:
    return "---\n".join([f"""apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {{name: decoders, namespace: inference}}
spec:
  selector: {{matchLabels: {{app: decoder}}}}
  targetPorts: [{{number: {port}}}]
  endpointPickerRef: {{name: epp, port: {{number: 9002}}}}
"""] + [f"""apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: decoder-{i}, namespace: inference}}
spec: {{address: {h}, labels: {{app: decoder}}}}
""" for i, h in enumerate(HOSTS)])


class Loop:
    def __init__(self, pool_dir, cp_admin, *extra):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mesh.cli", "scheduler", "run", "--config-dir", pool_dir,
             "--pool", "inference/decoders", "--control-plane-admin", cp_admin, "--period-ms", str(PERIOD_MS),
             "--remap-hold-s", str(HOLD_S), "--log-level", "WARNING", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "MCP_POLICY_CACHE": POLICY_CACHE})   # the seed plugin, built/compiled once
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(self.proc.stderr.read())
        self.ready = json.loads(line)
        self.admin = f"127.0.0.1:{self.ready['admin_port']}"

    def status(self) -> dict:
        out = subprocess.run([sys.executable, "-m", "mesh.cli", "scheduler", "status", "--admin", self.admin, "--json"],
                             capture_output=True, text=True, timeout=20)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def stop(self):
        stop_process(self.proc)


@pytest.fixture(scope="module")
def stack():
    if not os.path.exists(WASM):
        pytest.skip("run `make wasm` first")
    port, gw_port = _shared_port(), free_port()
    replicas = []
    for h in HOSTS:
        r = InferenceServer("builtin:tiny-decoder", "--kv-cache-mb", "1", "--host", h, admin=False)
        r.http_port = port
        r.args[r.args.index("--http-port") + 1] = str(port)
        replicas.append(r.start())
    echo = EchoUpstream("echo").start()
    cp_dir, pool_dir = tempfile.mkdtemp(prefix="loop-cp-"), tempfile.mkdtemp(prefix="loop-pool-")
    write_config(cp_dir, "mesh.yaml", _mesh_yaml(gw_port, echo.port, port))
    write_config(pool_dir, "pool.yaml", _pool_yaml(port))
    cp = ControlPlane(cp_dir).start()
    envoy = mesh_envoy(cp, labels={"istio": "ingressgateway"}, namespace="default")
    try:
        envoy.start()
        cp.wait_synced(GATEWAY_NODE, types=("CDS", "LDS", "ECDS"))
        deadline = time.monotonic() + 20
        while _qos_seen(gw_port) != "standard":
            assert time.monotonic() < deadline, envoy.log_tail()
            time.sleep(0.1)
        yield {"gw": gw_port, "cp": cp, "pool_dir": pool_dir, "replicas": replicas, "port": port}
    finally:
        envoy.stop()
        cp.close()
        echo.stop()
        for r in replicas:
            r.stop()


def _qos_seen(gw_port) -> str | None:
    """The QoS class the upstream behind the gateway received for an anonymous request."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", gw_port, timeout=5)
        conn.request("GET", "/echo", headers={"host": "echo.example.com"})
        r = conn.getresponse()
        doc = json.loads(r.read() or b"{}")
        conn.close()
        return doc.get("headers", {}).get("x-mcp-qos-class")
    except (OSError, ValueError):
        return None


def _fill_kv(gw_port, n=8):
    """Long generations through the gateway: each holds KV blocks of a 1 MB budget."""
    def one(i):
        body = json.dumps({"model": "tiny-decoder", "prompt": f"{i} " + "x" * 600, "max_tokens": 160})
        try:
            conn = http.client.HTTPConnection("127.0.0.1", gw_port, timeout=60)
            conn.request("POST", "/v1/completions", body=body,
                         headers={"host": "models.example.com", "content-type": "application/json"})
            conn.getresponse().read()
        except OSError:
            pass
    ts = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in ts:
        t.start()
    return ts


def _wait(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_memory_over_90_percent_remaps_standard_to_batch_then_restores(stack):
    loop = Loop(stack["pool_dir"], f"127.0.0.1:{stack['cp'].admin_port}")
    try:
        _wait(lambda: loop.status()["cycles"] > 3, 10, "the loop never cycled")
        assert _qos_seen(stack["gw"]) == "standard"
        threads = _fill_kv(stack["gw"])
        # the loop sees a replica over 90 % (from the KV budget: no GPU, no cgroup limit here) ...
        over_at = None
        deadline = time.monotonic() + 20
        while over_at is None:
            st = loop.status()
            reps = (st.get("latest") or {}).get("inputs", {}).get("replicas", [])
            if any(r["memory_fraction"] > 0.9 for r in reps):
                over_at = time.monotonic()
                assert {r["memory_source"] for r in reps} == {"kv-budget"}
            assert time.monotonic() < deadline, json.dumps(st["latest"]["inputs"])
            time.sleep(0.02)
        # ... and within a couple of periods Envoy gives standard traffic the batch class
        _wait(lambda: _qos_seen(stack["gw"]) == "batch", 2.0, "standard traffic never served as batch")
        took = time.monotonic() - over_at
        assert took < 2 * PERIOD_MS / 1e3 + 0.6, took
        st = loop.status()
        remaps = st["in_force"]["class_remaps"]
        assert [(r["from"], r["to"]) for r in remaps] == [("standard", "batch")]
        assert 0 < remaps[0]["expires_in_s"] <= HOLD_S
        remap_decision = next(d for d in st["decisions"] for a in d.get("actions", []) if a["kind"] == "remap-class")
        assert "memory > 90%" in next(a["reason"] for a in remap_decision["actions"] if a["kind"] == "remap-class")
        assert remap_decision["call_ms"] >= 0 and remap_decision["inputs"]["replicas"]
        # the control plane serves it too
        code, text = stack["cp"].get("/scheduler")
        assert code == 200 and json.loads(text)["class_remaps"][0]["to"] == "batch"
        # the human-readable status names the memory source and the remap's expiry
        out = subprocess.run([sys.executable, "-m", "mesh.cli", "scheduler", "status", "--admin", loop.admin],
                             capture_output=True, text=True, timeout=20).stdout
        assert "kv-budget" in out and "standard -> batch" in out, out
        # the default policy is the seed table as a Wasm plugin, its calls and cost in the status
        assert st["policy"].startswith("wasm:seed table"), st["policy"]
        assert st["plugin"]["calls"]["decide"] >= st["cycles"] - 1 and st["plugin"]["failures"] == {}
        assert st["plugin"]["cost_us"]["decide"]["p50"] > 0 and "plugin " in out and "decide p50/p99" in out, out
        for t in threads:
            t.join(60)
        # memory drops (idle KV blocks go after 5 s) and the hold runs out: standard again
        _wait(lambda: _qos_seen(stack["gw"]) == "standard", 5 + HOLD_S + 6, "never restored to standard")
    finally:
        loop.stop()


def test_a_policy_that_raises_or_is_slow_keeps_the_last_decision(stack, tmp_path):
    flag = tmp_path / "mode"
    flag.write_text("ok")
    policy = tmp_path / "policy.py"
    policy.write_text(f"""
import time
from scheduler.decisions import Action
def decide(signals):
    mode = open({str(flag)!r}).read().strip()
    if mode == "raise":
        raise RuntimeError("policy bug")
    if mode == "slow":
        time.sleep(1.0)
    return [Action("remap-class", "standard", "batch", hold_s=4.0, reason="test policy")]
""")
    loop = Loop(stack["pool_dir"], f"127.0.0.1:{stack['cp'].admin_port}", "--policy", f"python:{policy}",
                "--budget-ms", "50")
    try:
        _wait(lambda: _qos_seen(stack["gw"]) == "batch", 3, "the policy's remap never applied")
        decided = loop.status()["in_force"]["decided_in_cycle"]
        flag.write_text("raise")
        st = _wait(lambda: (lambda s: s if s["failures"]["raised"] >= 2 else None)(loop.status()), 3, "never raised")
        assert st["last_failure"]["reason"] == "raised" and "policy bug" in st["last_failure"]["detail"]
        assert st["in_force"]["class_remaps"][0]["to"] == "batch"     # the last decision stands ...
        assert _qos_seen(stack["gw"]) == "batch"                      # ... and Envoy still applies it
        flag.write_text("slow")
        st = _wait(lambda: (lambda s: s if s["failures"]["over_budget"] >= 1 else None)(loop.status()), 4, "never slow")
        assert st["last_failure"]["reason"] == "over_budget"
        assert st["in_force"]["decided_in_cycle"] >= decided
        failed = [d for d in st["decisions"] if "failure" in d]
        assert failed and all(d["call_ms"] >= 0 for d in failed)
        assert failed[-1]["call_ms"] >= 45       # the budget was spent waiting
        assert _qos_seen(stack["gw"]) == "batch"
    finally:
        loop.stop()
        flag.write_text("ok")
        # leave no remap behind for another test
        import urllib.request
        req = urllib.request.Request(f"http://127.0.0.1:{stack['cp'].admin_port}/scheduler/class-remap?from=standard",
                                     method="DELETE")
        urllib.request.urlopen(req, timeout=5).read()
