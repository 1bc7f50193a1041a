"""The decision loop's per-request upgrade through real Envoy: the control plane translates a
Gateway API route to an InferencePool (ext_proc to the pool's picker, asking Envoy for the
`source.address` attribute); `mcpctl epp serve --flow-marks PATH` reads the marks the loop's
own code wrote (the built-in policy over a flow record with RTT < 50 ms and payload > 1 MB,
the applier's mark writer). A request from the marked client address reaches the model server
(an echo upstream) with `x-mcp-qos-class: latency-critical`; one from another address, or from the
marked client's address on another port, does not. The gateway runs the header-contract filter
with the mesh's session key (it signs the class it sets, after Envoy assigned x-request-id); the
picker holds the same key, so the upgraded class arrives re-signed and the backend's own check
(mesh.session.verify_session) accepts it. (A forged signature is refused: tests/mesh/unit/test_session_resign.py.)"""
import asyncio
import http.client
import base64
import hashlib
import json
import os
import time

import pytest

from harness.endpoint_picker import PickerProcess
from mcp26.wasm import HEADER_CONTRACT_WASM as WASM
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.demo.stack.control_plane import ControlPlane, mesh_envoy, write_config
from mcp26.mesh import headers as H
from mcp26.mesh import session
from mcp26.scheduler.decisions import FlowSignals, Signals
from mcp26.scheduler.loop.actions import ActionApplier
from mcp26.scheduler.loop.builtin_policy import BuiltinPolicy

pytestmark = pytest.mark.e2e

NODE = "router~127.0.0.1~inference-gateway.inference~inference.svc.cluster.local"
LABELS = {"gateway.networking.k8s.io/gateway-name": "inference-gateway"}
REPLICA, MARKED, UNMARKED = "127.0.0.2", "127.0.0.7", "127.0.0.8"
KEY = b"flow-upgrade-session-key-0123456789"
IDLE = {"vllm:num_requests_waiting": 0, "vllm:num_requests_running": 0, "vllm:kv_cache_usage_perc": 0.1}


def _config(gw_port: int, replica_port: int, picker_port: int) -> str:
    return f"""apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: inference-gateway, namespace: inference}}
spec:
  gatewayClassName: istio
  listeners: [{{name: http, port: {gw_port}, protocol: HTTP}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: llm, namespace: inference}}
spec:
  parentRefs: [{{name: inference-gateway}}]
  rules: [{{backendRefs: [{{group: inference.networking.k8s.io, kind: InferencePool, name: decoders}}]}}]
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: decoder-0, namespace: inference}}
spec: {{address: {REPLICA}, labels: {{app: decoder}}}}
---
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {{name: decoders, namespace: inference}}
spec:
  selector: {{matchLabels: {{app: decoder}}}}
  targetPorts: [{{number: {replica_port}}}]
  endpointPickerRef: {{name: epp, port: {{number: 9002}}}}
---
apiVersion: v1
kind: Service
metadata: {{name: epp, namespace: inference}}
spec:
  ports: [{{name: grpc-ext-proc, port: 9002, appProtocol: http2}}]
---
apiVersion: v1
kind: Endpoints
metadata: {{name: epp, namespace: inference}}
subsets: [{{addresses: [{{ip: 127.0.0.1}}], ports: [{{name: grpc-ext-proc, port: {picker_port}}}]}}]
---
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {{name: header-contract, namespace: inference}}
spec:
  selector: {{matchLabels: {{gateway.networking.k8s.io/gateway-name: inference-gateway}}}}
  url: file://{WASM}
  sha256: "{hashlib.sha256(open(WASM, "rb").read()).hexdigest()}"
  phase: AUTHZ
  pluginName: mcp-header-contract
  failStrategy: FAIL_CLOSE
  pluginConfig: {{sessionKey: "{base64.b64encode(KEY).decode()}"}}
"""


def _send(gw_port: int, source: tuple, headers: dict | None = None) -> tuple[int, dict]:
    """One request from `source` (address, port): the flow the marks name."""
    conn = http.client.HTTPConnection("127.0.0.1", gw_port, timeout=10, source_address=source)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps({"model": "m", "prompt": "hi"}),
                     headers={"content-type": "application/json", "host": "llm.example.com", **(headers or {})})
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"{}")
    finally:
        conn.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    d = tmp_path_factory.mktemp("flow-upgrade")
    config_dir, marks, key_file = str(d / "config"), str(d / "marks.json"), str(d / "session.key")
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, KEY)
    os.close(fd)
    (d / "config").mkdir()
    replica = EchoUpstream("replica", host=REPLICA)
    replica.metrics = dict(IDLE)
    replica.start()
    gw_port, picker_port = free_port(), free_port()
    write_config(config_dir, "inference.yaml", _config(gw_port, replica.port, picker_port))
    cp = ControlPlane(config_dir)
    envoy = mesh_envoy(cp, node_id=NODE, namespace="inference", labels=LABELS)
    picker = None
    try:
        picker = PickerProcess(config_dir, "--metrics-interval-ms", "20", "--flow-marks", marks,
                               "--session-key-file", key_file, grpc_port=picker_port)
        cp.start()
        assert cp.configz().get("rejected") is None, cp.configz()
        envoy.start()
        cp.wait_synced(NODE, types=("CDS", "EDS", "LDS", "RDS"))
        deadline = time.monotonic() + 20
        while _send(gw_port, (UNMARKED, 0))[0] != 200:
            assert time.monotonic() < deadline, envoy.log_tail()
            time.sleep(0.1)
        yield {"gw": gw_port, "marks": marks, "cp": cp, "replica": replica}
    finally:
        envoy.stop()
        cp.close()
        if picker:
            picker.stop()
        replica.stop()


def _mark(stack, client: str, client_port: int) -> None:
    gw = stack["gw"]
    # the loop's own path: a kernel flow record -> the built-in policy -> the applier's mark writer
    flow = FlowSignals(flow=f"{client}:{client_port}->127.0.0.1:{gw}", rtt_ms=3.0, payload_bytes=2_000_000)
    actions = BuiltinPolicy().decide(Signals(now_s=time.time(), flows=(flow,)))
    assert [a.kind for a in actions if a.subject == flow.flow] == ["upgrade-flow"]
    applier = ActionApplier(f"127.0.0.1:{stack['cp'].admin_port}", marks_path=stack["marks"])
    asyncio.run(applier.apply(actions, time.time(), flow_hold_s=60.0))
    asyncio.run(applier.close())
    time.sleep(0.1)          # the picker looks at the marks file at most every 20 ms (FlowMarks.check_s)


def test_a_flow_the_loop_marked_reaches_the_model_server_critical(stack):
    gw = stack["gw"]
    client_port = free_port(MARKED)
    _mark(stack, MARKED, client_port)

    # a first x-forwarded-for entry of the client's own: only Envoy's source.address attribute can match
    status, seen = _send(gw, (MARKED, client_port), {"x-forwarded-for": "192.0.2.1"})
    assert status == 200 and seen["upstream"] == "replica", seen
    assert seen["headers"].get(H.QOS_CLASS) == "latency-critical", seen["headers"]
    # re-signed by the picker over what the filter signed: the backend's own check accepts it
    assert session.verify_session(seen["headers"], KEY, method="POST").qos_class == "latency-critical"
    # another client address is not marked, nor the marked address on another port (x-forwarded-for
    # naming the marked address changes nothing: only the connection's own address counts)
    for source, xff in (((UNMARKED, 0), None), ((MARKED, 0), MARKED)):
        status, seen = _send(gw, source, {"x-forwarded-for": xff} if xff else None)
        assert status == 200 and seen["headers"].get(H.QOS_CLASS) != "latency-critical", (source, seen["headers"])
        assert session.verify_session(seen["headers"], KEY, method="POST").qos_class == seen["headers"][H.QOS_CLASS]
