"""The L6->L7 header contract end to end, as the control plane pushes it.

`mcpctl xds serve` translates a Gateway, VirtualService, RequestAuthentication
(inline jwks + a jwksUri served here) and the header-contract WasmPlugin; a
real Envoy gets them over ADS (the Wasm filter over ECDS) and proxies to echo
upstreams and to a real `mcpctl serve` inference backend that checks the
session signature. Tokens are minted here (RS256, PyJWT + jwcrypto).
"""
import base64
import hashlib
import http.client
import json
import os
import tempfile
import time

import pytest

from mcp26.mesh import headers as H
from mcp26.mesh.session import SessionError, verify_session
from mcp26.demo.stack.inference_server import InferenceServer
from mcp26.wasm import HEADER_CONTRACT_WASM as WASM
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.tokens import Issuer
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.demo.stack.control_plane import GATEWAY_NODE, ControlPlane, mesh_envoy, write_config
from harness.manifests import documents, manifest, wasm_module

pytestmark = pytest.mark.e2e

KEY = hashlib.sha256(b"e2e session key").digest()
ISSUER, ISSUER2, AUDIENCE = "https://issuer.mesh.test", "https://remote-issuer.mesh.test", "mesh-gateway"
GW_LABELS = {"istio": "ingressgateway"}


def mesh_yaml(gw_port, v1, v2, backend, remote_jwks, local_jwks, tenants=None, backend_grpc=0) -> dict[str, str]:
    tenants = tenants or {"acme": {"allowedHeaders": ["x-tenant-acme-*"]}, "globex": {"allowedHeaders": ["x-tenant-globex-*"]}}
    plugin = {"sessionKey": base64.b64encode(KEY).decode(), "tenants": tenants,
              "qos": {"tiers": {"free": "standard", "gold": "latency-critical"}}}
    return {
        "mesh.yaml": documents(
            manifest("gateway.yaml", gw_port=gw_port),
            manifest("service_entry.yaml", name="models", number=80, port_name="http", protocol="HTTP",
                     upstream=backend),
            manifest("service_entry.yaml", name="models-grpc", number=81, port_name="grpc", protocol="GRPC",
                     upstream=backend_grpc),
            f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: reviews, namespace: default}}
spec:
  hosts: [reviews.mesh.local]
  location: MESH_INTERNAL
  ports: [{{number: 80, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints:
  - {{address: 127.0.0.1, ports: {{http: {v1}}}, labels: {{version: v1}}}}
  - {{address: 127.0.0.1, ports: {{http: {v2}}}, labels: {{version: v2}}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: reviews, namespace: default}}
spec:
  host: reviews.mesh.local
  subsets:
  - {{name: v1, labels: {{version: v1}}}}
  - {{name: v2, labels: {{version: v2}}}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: reviews, namespace: default}}
spec:
  hosts: ["*"]
  gateways: [gw]
  http:
  - match: [{{uri: {{prefix: /v2/}}}}]
    route: [{{destination: {{host: models.mesh.local}}}}]
  - match: [{{uri: {{prefix: /inference.GRPCInferenceService/}}}}]
    route: [{{destination: {{host: models-grpc.mesh.local}}}}]
  - match:
    - headers:
        end-user: {{exact: jane}}
    route: [{{destination: {{host: reviews.mesh.local, subset: v2}}}}]
  - route: [{{destination: {{host: reviews.mesh.local, subset: v1}}}}]
"""),
        "authn.yaml": f"""apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{name: gateway-jwt, namespace: default}}
spec:
  selector: {{matchLabels: {{istio: ingressgateway}}}}
  jwtRules:
  - issuer: {ISSUER}
    audiences: [{AUDIENCE}]
    jwks: '{local_jwks.jwks}'
    outputClaimToHeaders:
    - {{header: x-mcp-email, claim: email}}
  - issuer: {ISSUER2}
    audiences: [{AUDIENCE}]
    jwksUri: http://127.0.0.1:{remote_jwks.port}/jwks.json
    fromHeaders: [{{name: x-remote-token}}]
""",
        "wasm.yaml": manifest("header_contract_plugin.yaml", plugin_config=plugin, **wasm_module(WASM)),
    }


class Stack:
    pass


@pytest.fixture(scope="module")
def stack():
    if not os.path.exists(WASM):
        pytest.skip("run `make wasm` first")
    s = Stack()
    s.local, s.remote = Issuer("local-1", ISSUER, AUDIENCE), Issuer("remote-1", ISSUER2, AUDIENCE).serve()
    s.dir = tempfile.mkdtemp(prefix="mesh-wasm-")
    fd, key_file = tempfile.mkstemp(prefix="mesh-session-", suffix=".key")
    with os.fdopen(fd, "wb") as f:
        f.write(KEY)
    s.gw_port = free_port()
    s.v1, s.v2 = EchoUpstream("v1").start(), EchoUpstream("v2").start()
    s.backend = InferenceServer("builtin:mlp", "--session-key-file", key_file, admin=False).start()
    s.texts = mesh_yaml(s.gw_port, s.v1.port, s.v2.port, s.backend.http_port, s.remote, s.local,
                        backend_grpc=s.backend.grpc_port)
    for name, text in s.texts.items():
        write_config(s.dir, name, text)
    s.cp = ControlPlane(s.dir).start()
    s.envoy = mesh_envoy(s.cp, labels=GW_LABELS, namespace="default")
    try:
        s.envoy.start()
        s.cp.wait_synced(GATEWAY_NODE, types=("CDS", "LDS", "ECDS"))
        wait_until_serving(s)
        yield s
    finally:
        s.envoy.stop()
        s.cp.close()
        s.backend.stop()
        s.v1.stop(); s.v2.stop(); s.remote.stop()
        os.remove(key_file)


def wait_until_serving(s, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            status, _, _ = get(s, "/")
            if status == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"gateway not serving:\n{s.envoy.log_tail()}\n{s.cp.log_tail()}")
        time.sleep(0.1)


def get(s, path="/", headers=None, method="GET", body=None):
    """(status, response headers, JSON body) through the gateway."""
    conn = http.client.HTTPConnection("127.0.0.1", s.gw_port, timeout=10)
    try:
        conn.request(method, path, body=body, headers={"host": "reviews.example.com", **(headers or {})})
        r = conn.getresponse()
        data = r.read()
        hdrs = {k.lower(): v for k, v in r.getheaders()}
        try:
            doc = json.loads(data) if data else {}
        except ValueError:
            doc = {"raw": data.decode(errors="replace")}
        return r.status, hdrs, doc
    finally:
        conn.close()


def bearer(tok):
    if isinstance(tok, bytes):
        tok = tok.decode()
    return {"authorization": f"Bearer {tok}"}


def test_valid_token_claims_reach_the_upstream_signed(stack):
    tok = stack.local.token(sub="alice", tenant="acme", email="alice@acme.test")
    status, hdrs, seen = get(stack, "/reviews", bearer(tok))
    assert status == 200 and seen["upstream"] == "v1", seen
    h = seen["headers"]
    assert (h[H.END_USER], h[H.TENANT], h["x-mcp-email"]) == ("alice", "acme", "alice@acme.test")
    session = verify_session(h, KEY, method="GET")
    assert session.signed[H.END_USER] == "alice" and session.signed[H.QOS_CLASS] == "standard"
    assert hdrs[H.ERROR_CLASS] == "ok"   # the response path of the filter ran too


@pytest.mark.parametrize("case", ["forged", "expired", "wrong-audience", "wrong-issuer", "garbage"])
def test_bad_tokens_get_401_and_nothing_reaches_the_upstream(stack, case):
    tok = {
        "forged": lambda: Issuer("local-1", ISSUER, AUDIENCE).token(sub="jane"),        # same kid, another key
        "expired": lambda: stack.local.token(sub="jane", exp_in=-120),
        "wrong-audience": lambda: stack.local.token(sub="jane", aud="someone-else"),
        "wrong-issuer": lambda: stack.local.token(iss="https://evil.test", sub="jane"),
        "garbage": lambda: "a.b.c",
    }[case]()
    before = len(stack.v1.requests) + len(stack.v2.requests)
    status, _, body = get(stack, "/reviews", {**bearer(tok), "end-user": "jane"})
    # jwt_authn's own 403 for another audience is mapped to 401 too (HCM local_reply_config)
    assert status == 401, body
    assert len(stack.v1.requests) + len(stack.v2.requests) == before


def test_client_sent_session_headers_without_a_token_never_reach_the_upstream(stack):
    spoof = {"end-user": "admin", H.TENANT: "globex", H.QOS_CLASS: "latency-critical", "x-mcp-email": "ceo@x",
             H.SESSION_SIG: "v1;h=end-user;s=" + "0" * 64, H.DOWNSTREAM_SERVICE_CLUSTER: "billing"}
    status, _, seen = get(stack, "/reviews", spoof)
    assert status == 200
    h = seen["headers"]
    for name in ("end-user", H.TENANT, "x-mcp-email", H.DOWNSTREAM_SERVICE_CLUSTER):
        assert name not in h, name
    assert h[H.QOS_CLASS] == "standard"
    assert verify_session(h, KEY, method="GET").signed == {H.QOS_CLASS: "standard"}


def test_claim_based_routing_selects_v2_only_for_a_verified_jane(stack):
    assert get(stack, "/r", bearer(stack.local.token(sub="jane", tenant="acme")))[2]["upstream"] == "v2"
    assert get(stack, "/r", {"end-user": "jane"})[2]["upstream"] == "v1"       # a header is not a claim
    assert get(stack, "/r", bearer(stack.local.token(sub="john")))[2]["upstream"] == "v1"


def test_other_tenants_headers_are_removed(stack):
    tok = stack.local.token(sub="alice", tenant="acme")
    _, _, seen = get(stack, "/r", {**bearer(tok), "x-tenant-acme-region": "eu", "x-tenant-globex-plan": "gold"})
    assert seen["headers"].get("x-tenant-acme-region") == "eu"
    assert "x-tenant-globex-plan" not in seen["headers"]


@pytest.mark.parametrize("tier, want", [(None, "latency-critical"), ("gold", "latency-critical"), ("free", "standard")])
def test_llm_priority_critical_gets_the_latency_critical_class_within_the_tier(stack, tier, want):
    claims = {"sub": "alice", **({"tier": tier} if tier else {})}
    _, _, seen = get(stack, "/r", {**bearer(stack.local.token(**claims)), "x-llm-priority": "critical"})
    assert seen["headers"][H.QOS_CLASS] == want
    assert verify_session(seen["headers"], KEY, method="GET").qos_class == want


def test_jwks_uri_is_fetched_through_the_translated_cluster(stack):
    tok = stack.remote.token(sub="remote-user")
    status, _, seen = get(stack, "/r", {"x-remote-token": tok})
    assert status == 200 and seen["headers"][H.END_USER] == "remote-user"
    assert stack.remote.fetches >= 1
    assert get(stack, "/r", {"x-remote-token": stack.local.token(iss=ISSUER2, sub="x")})[0] == 401


INFER = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]})


def _backend_post(stack, path, headers):
    conn = http.client.HTTPConnection("127.0.0.1", stack.backend.http_port, timeout=10)
    try:
        conn.request("POST", path, body=INFER, headers=headers)
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


def test_backend_accepts_the_signed_session_and_rejects_a_changed_one(stack):
    tok = bearer(stack.local.token(sub="alice", tenant="acme"))
    path = "/v2/models/mlp/infer"
    status, _, body = get(stack, path, tok, method="POST", body=INFER)
    assert status == 200, body                      # through Envoy: signed by the filter, checked by the backend
    # The headers the filter produced for a POST (as an upstream saw them, with the x-request-id
    # the signature binds), sent on to the backend: untouched they pass; with a session header
    # changed after signing, or on another request (another id), they do not.
    seen = get(stack, "/r", tok, method="POST", body=INFER)[2]["headers"]
    signed = {k: v for k, v in seen.items() if k in (H.END_USER, H.TENANT, H.QOS_CLASS, H.SESSION_SIG, "x-request-id")}
    assert _backend_post(stack, path, signed)[0] == 200
    for name, value in ((H.END_USER, "admin"), (H.TENANT, "globex"), (H.QOS_CLASS, "latency-critical"),
                        ("x-request-id", "another-request")):
        status, text = _backend_post(stack, path, {**signed, name: value})
        assert status == 403 and "session" in text, (name, status, text)
    status, text = _backend_post(stack, path, {H.END_USER: "alice"})   # unsigned session header
    assert status == 403, text


def test_a_plugin_config_change_arrives_over_ecds_without_draining_the_listener(stack):
    tok = bearer(stack.local.token(sub="alice", tenant="acme"))
    assert "x-tenant-acme-region" in get(stack, "/r", {**tok, "x-tenant-acme-region": "eu"})[2]["headers"]
    before = stack.envoy.stats("listener_manager")
    gen = stack.cp.configz()["generation"]
    texts = mesh_yaml(stack.gw_port, stack.v1.port, stack.v2.port, stack.backend.http_port, stack.remote, stack.local,
                      tenants={"acme": {"allowedHeaders": ["x-tenant-acme-plan"]}}, backend_grpc=stack.backend.grpc_port)
    try:
        write_config(stack.dir, "wasm.yaml", texts["wasm.yaml"])
        stack.cp.wait_generation_change(gen)
        deadline = time.monotonic() + 15
        while "x-tenant-acme-region" in get(stack, "/r", {**tok, "x-tenant-acme-region": "eu"})[2]["headers"]:
            assert time.monotonic() < deadline, stack.envoy.log_tail()
            time.sleep(0.1)
        after = stack.envoy.stats("listener_manager")
        assert after.get("listener_manager.listener_modified") == before.get("listener_manager.listener_modified")
        assert after.get("listener_manager.total_listeners_draining", 0) == 0
        ecds = stack.envoy.stats("extension_config_discovery")
        assert any(k.endswith("config_reload") and v >= 2 for k, v in ecds.items()), ecds
    finally:
        write_config(stack.dir, "wasm.yaml", stack.texts["wasm.yaml"])


def test_an_invalid_plugin_config_is_rejected_by_the_control_plane_and_nothing_changes(stack):
    tok = bearer(stack.local.token(sub="alice", tenant="acme"))
    since = time.time()
    bad = stack.texts["wasm.yaml"].replace('"gold": "latency-critical"', '"gold": "platinum"')
    assert bad != stack.texts["wasm.yaml"]
    try:
        write_config(stack.dir, "wasm.yaml", bad)
        rejected = stack.cp.wait_rejected(since)
        text = json.dumps(rejected)
        assert "wasm.yaml" in text and "spec.pluginConfig.qos.tiers.gold" in text, text
        _, _, seen = get(stack, "/r", {**tok, "x-llm-priority": "high"})
        assert seen["headers"][H.END_USER] == "alice"   # the old contract keeps serving
    finally:
        write_config(stack.dir, "wasm.yaml", stack.texts["wasm.yaml"])


def test_session_headers_changed_on_the_wire_fail_verify_session(stack):
    _, _, seen = get(stack, "/r", bearer(stack.local.token(sub="alice", tenant="acme")))
    h = dict(seen["headers"], **{H.TENANT: "globex"})
    with pytest.raises(SessionError):
        verify_session(h, KEY, method="GET")


def test_grpc_status_becomes_the_error_class_in_trailers(stack):
    """A real gRPC call through the gateway to the backend (raw KServe v2 methods)."""
    import grpc
    ident = lambda b: b   # noqa: E731  (raw protobuf bytes both ways)
    with grpc.insecure_channel(f"127.0.0.1:{stack.gw_port}") as ch:
        live = ch.unary_unary("/inference.GRPCInferenceService/ServerLive", request_serializer=ident,
                              response_deserializer=ident)
        _, call = live.with_call(b"", timeout=10, metadata=[("end-user", "admin")])
        assert dict(call.trailing_metadata())[H.ERROR_CLASS] == "ok"
        meta = ch.unary_unary("/inference.GRPCInferenceService/ModelMetadata", request_serializer=ident,
                              response_deserializer=ident)
        with pytest.raises(grpc.RpcError) as e:
            meta(b"\x0a\x07missing", timeout=10)          # ModelMetadataRequest{name: "missing"}
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        md = dict(e.value.trailing_metadata() or ()) | dict(e.value.initial_metadata() or ())
        assert md[H.ERROR_CLASS] == "client"                 # mesh.error_classes: NOT_FOUND -> client
