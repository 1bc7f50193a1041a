"""An L7SchedulingPolicy's routing fields through the control plane and a real Envoy: requests
whose headers match go to backendService, and the header-contract filter (Wasm, over ECDS)
signs the class the policy's priority maps to - read from the route's metadata, capped by the
caller's tier, over the client's X-LLM-Priority. The policy is the seed's example
(istio-manifests/examples/l7-routing.yaml), its backendService pointed at this test's upstream."""
import base64
import hashlib
import http.client
import json
import os
import tempfile
import time

import pytest
import yaml

from harness.manifests import documents, manifest, wasm_module
from mcp26.demo.stack.control_plane import GATEWAY_NODE, ControlPlane, mesh_envoy, write_config
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.tokens import Issuer
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.manifests import EXAMPLES
from mcp26.mesh import headers as H
from mcp26.mesh.l7_routing import class_for_priority
from mcp26.mesh.session import verify_session
from mcp26.wasm import HEADER_CONTRACT_WASM as WASM

pytestmark = pytest.mark.e2e

KEY = hashlib.sha256(b"l7 routing e2e").digest()
ISSUER, AUDIENCE = "https://issuer.l7.test", "mesh-gateway"
EXAMPLE = next(d for d in yaml.safe_load_all((EXAMPLES / "l7-routing.yaml").read_text())
               if d["kind"] == "L7SchedulingPolicy")
MATCH = {k: v for k, v in EXAMPLE["spec"]["matchHeaders"].items()}


def policy(priority: int) -> str:
    doc = json.loads(json.dumps(EXAMPLE))
    doc["metadata"]["namespace"] = "default"
    doc["spec"].update(priority=priority, backendService="premium.mesh.local")
    return yaml.safe_dump(doc)


@pytest.fixture(scope="module")
def stack():
    if not os.path.exists(WASM):
        pytest.skip("run `make wasm` first")
    s = type("Stack", (), {})()
    s.issuer = Issuer("l7-1", ISSUER, AUDIENCE)
    s.dir = tempfile.mkdtemp(prefix="mesh-l7-")
    s.gw_port = free_port()
    s.plain, s.premium = EchoUpstream("plain").start(), EchoUpstream("premium").start()
    plugin = {"sessionKey": base64.b64encode(KEY).decode(), "qos": {"tiers": {"free": "standard"}}}
    write_config(s.dir, "mesh.yaml", documents(
        manifest("gateway.yaml", gw_port=s.gw_port),
        manifest("service_entry.yaml", name="plain", number=80, port_name="http", protocol="HTTP", upstream=s.plain.port),
        manifest("service_entry.yaml", name="premium", number=80, port_name="http", protocol="HTTP",
                 upstream=s.premium.port),
        """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: all, namespace: default}
spec:
  hosts: ["*"]
  gateways: [gw]
  http: [{route: [{destination: {host: plain.mesh.local}}]}]
""",
        f"""apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{name: gateway-jwt, namespace: default}}
spec:
  selector: {{matchLabels: {{istio: ingressgateway}}}}
  jwtRules: [{{issuer: "{ISSUER}", audiences: [{AUDIENCE}], jwks: '{s.issuer.jwks}'}}]
""",
        manifest("header_contract_plugin.yaml", plugin_config=plugin, **wasm_module(WASM))))
    write_config(s.dir, "policy.yaml", policy(EXAMPLE["spec"]["priority"]))
    s.cp = ControlPlane(s.dir).start()
    s.envoy = mesh_envoy(s.cp, labels={"istio": "ingressgateway"}, namespace="default")
    try:
        s.envoy.start()
        s.cp.wait_synced(GATEWAY_NODE, types=("CDS", "LDS", "ECDS"))
        deadline = time.monotonic() + 20
        while get(s, {})[0] != 200:
            assert time.monotonic() < deadline, s.envoy.log_tail()
            time.sleep(0.1)
        yield s
    finally:
        s.envoy.stop()
        s.cp.close()
        s.plain.stop()
        s.premium.stop()


def get(s, headers: dict) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", s.gw_port, timeout=10)
    try:
        conn.request("GET", "/v1/chat", headers={"host": "llm.example.com", **headers})
        r = conn.getresponse()
        data = r.read()
        return r.status, (json.loads(data) if data else {})
    except OSError:
        return 0, {}
    finally:
        conn.close()


def test_matching_requests_go_to_the_backend_service_with_the_priority_class_signed(stack):
    status, seen = get(stack, MATCH)
    assert status == 200 and seen["upstream"] == "premium", seen
    want = class_for_priority(EXAMPLE["spec"]["priority"]).header_value
    assert seen["headers"][H.QOS_CLASS] == want == "latency-critical"
    assert verify_session(seen["headers"], KEY, method="GET").qos_class == want


def test_one_header_short_is_not_matched(stack):
    partial = dict(list(MATCH.items())[:1])
    status, seen = get(stack, {**partial, "x-llm-priority": "low"})
    assert status == 200 and seen["upstream"] == "plain"
    assert seen["headers"][H.QOS_CLASS] == "batch"           # the client's own ask, where no policy matched


def test_the_policys_class_wins_over_the_clients_and_the_tier_still_caps_it(stack):
    _, seen = get(stack, {**MATCH, "x-llm-priority": "low"})
    assert (seen["upstream"], seen["headers"][H.QOS_CLASS]) == ("premium", "latency-critical")
    free = {"authorization": "Bearer " + stack.issuer.token(sub="u", tier="free")}
    _, seen = get(stack, {**MATCH, **free})
    assert (seen["upstream"], seen["headers"][H.QOS_CLASS]) == ("premium", "standard")
    assert verify_session(seen["headers"], KEY, method="GET").qos_class == "standard"


def test_a_changed_priority_reaches_envoy_as_another_class(stack):
    try:
        write_config(stack.dir, "policy.yaml", policy(10))
        deadline = time.monotonic() + 20
        while get(stack, MATCH)[1].get("headers", {}).get(H.QOS_CLASS) != "batch":
            assert time.monotonic() < deadline, stack.cp.log_tail()
            time.sleep(0.2)
    finally:
        write_config(stack.dir, "policy.yaml", policy(EXAMPLE["spec"]["priority"]))
