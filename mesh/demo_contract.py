"""The demo's header-contract step: the L6->L7 contract on the reviews gateway.

Runs after the routing steps of mesh.demo (it needs the control plane, the
gateway Envoy and the sample upstreams, which answer with the headers they
saw). Writes into the watched config dir, as one change, a
RequestAuthentication with an inline JWKS (an RS256 key generated here) and
the header-contract WasmPlugin (wasm-filters/build/header_contract.wasm from
`make wasm`, pinned by sha256, phase AUTHZ, FAIL_CLOSE, a session key made
here, per-tenant allowed headers) limited to the reviews gateway's port; then
mints tokens and shows what the upstreams saw:

- a valid token for sub jason -> v2 by the verified claim; end-user,
  x-mcp-tenant and an x-mcp-session-sig that mesh.session.verify_session accepts;
- a client's own `end-user: jason` without a token -> not v2, never seen upstream;
- an expired or forged token -> 401, nothing reaches an upstream;
- X-LLM-Priority: high -> x-mcp-qos-class: latency-critical (signed);
- another tenant's x-tenant-other-* header -> removed.

Skipped, with the reason, when the Wasm module is not built. Like the rest of
the demo it speaks to the other parts only over the wire (and the files).
"""
from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import time
from pathlib import Path

import jwt as pyjwt
import yaml
from cryptography.hazmat.primitives.asymmetric import rsa

from mesh import headers as H
from mesh.header_contract import PLUGIN_NAME
from mesh.session import SessionError, verify_session

WASM = Path(__file__).resolve().parent.parent / "wasm-filters" / "build" / "header_contract.wasm"
ISSUER = "https://issuer.demo.local"
AUDIENCE = "mcp-demo-gateway"
KID = "demo-1"
CONFIG_FILE = "header-contract.yaml"


class Issuer:
    """An RS256 key pair: its public JWKS and tokens signed with it."""

    def __init__(self, kid: str = KID):
        self.kid = kid
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        public = json.loads(pyjwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        self.jwks = json.dumps({"keys": [{**public, "kid": kid, "alg": "RS256", "use": "sig"}]})

    def token(self, exp_in: int = 600, **claims) -> str:
        now = int(time.time())
        body = {"iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + exp_in, **claims}
        return pyjwt.encode(body, self.key, algorithm="RS256", headers={"kid": self.kid})


def contract_config(jwks: str, session_key: bytes, module: Path, sha256: str, port: int) -> str:
    """The RequestAuthentication + WasmPlugin this step writes (one file, one change)."""
    authn = {
        "apiVersion": "security.istio.io/v1", "kind": "RequestAuthentication",
        "metadata": {"name": "demo-jwt", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"istio": "ingressgateway"}},
                 "jwtRules": [{"issuer": ISSUER, "audiences": [AUDIENCE], "jwks": jwks}]},
    }
    plugin = {
        "apiVersion": "extensions.istio.io/v1alpha1", "kind": "WasmPlugin",
        "metadata": {"name": "header-contract", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"istio": "ingressgateway"}},
                 "match": [{"ports": [{"number": port}]}],     # the reviews gateway only
                 "url": module.as_uri(), "sha256": sha256,
                 "phase": "AUTHZ", "pluginName": PLUGIN_NAME, "failStrategy": "FAIL_CLOSE",
                 "pluginConfig": {
                     "sessionKey": base64.b64encode(session_key).decode(),
                     "tenantClaim": "tenant",
                     "tenants": {"acme": {"allowedHeaders": ["x-tenant-acme-*"]},
                                 "other": {"allowedHeaders": ["x-tenant-other-*"]}}}},
    }
    return "# The L6->L7 header contract on the reviews gateway (written by the demo).\n" + \
        yaml.safe_dump_all([authn, plugin], sort_keys=False)


def _get(port: int, headers: dict) -> tuple[int, dict]:
    """(status, the upstream's answer: {upstream, headers}) on a fresh connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/reviews", headers={"host": "reviews.demo.local", **headers})
        r = conn.getresponse()
        data = r.read()
        try:
            doc = json.loads(data) if r.status == 200 else {}
        except ValueError:
            doc = {}
        return r.status, doc
    finally:
        conn.close()


def _bearer(token: str) -> dict:
    return {"authorization": f"Bearer {token}"}


def _verify(headers: dict, key: bytes) -> str:
    """verify_session's verdict on what the upstream saw, in words."""
    try:
        s = verify_session(headers, key)
    except SessionError as e:
        return f"invalid: {e.reason}"
    return "valid (" + ", ".join(f"{k}={v}" for k, v in s.signed.items()) + ")"


def step_header_contract(demo) -> list:
    from mesh.demo import Check   # here, not at import: mesh.demo imports this module
    if not WASM.exists():
        print(f"  skipped: {WASM.relative_to(WASM.parents[2])} is not built (run `make wasm`)")
        return []
    started = time.monotonic()
    sha = hashlib.sha256(WASM.read_bytes()).hexdigest()
    issuer, forger = Issuer(), Issuer(KID)          # the forger signs with another key under the same kid
    session_key = os.urandom(32)

    # Routing as in step 1 (end-user: jason -> v2, everyone else v1; no fault), then the contract.
    demo.apply("config/virtualservice.yaml")
    before = demo.admin("/debug/configz")["generation"]
    demo.write_config(CONFIG_FILE, contract_config(issuer.jwks, session_key, WASM, sha, demo.gateway_port))
    status = demo.wait("the header contract config", lambda: (s := demo.admin("/debug/configz"))
                       ["generation"] != before and s)
    if status.get("rejected"):
        raise RuntimeError(f"{CONFIG_FILE} rejected: {status['rejected']}")
    demo.wait_synced()

    def ecds_synced():
        from mesh.demo import GATEWAY_NODE
        return any(n["node"] == GATEWAY_NODE and n["types"].get("ECDS", {}).get("status") == "SYNCED"
                   for n in demo.admin("/debug/syncz"))
    demo.wait("the gateway to ACK the Wasm filter (ECDS)", ecds_synced)
    token = issuer.token(sub="jason", tenant="acme")
    # The listener is replaced (jwt_authn added) and the module loads: wait until the upstream sees a signature.
    demo.wait("the header contract to serve",
              lambda: H.SESSION_SIG in _get(demo.gateway_port, _bearer(token))[1].get("headers", {}), timeout=20)

    def received() -> int:
        return sum(u.requests for u in demo.upstreams)

    # 1. a valid token for jason: routed by the verified claim, session headers signed.
    valid = [_get(demo.gateway_port, _bearer(token)) for _ in range(5)]
    where = sorted({d.get("upstream", f"HTTP {s}") for s, d in valid})
    seen = valid[-1][1].get("headers", {})
    verdict = _verify(seen, session_key)
    print(f"  token sub=jason tenant=acme x5 -> {', '.join(where)}; upstream saw {H.END_USER}: {seen.get(H.END_USER)},"
          f" {H.TENANT}: {seen.get(H.TENANT)}, {H.QOS_CLASS}: {seen.get(H.QOS_CLASS)}")
    print(f"    {H.SESSION_SIG}: {seen.get(H.SESSION_SIG, '-')[:60]}...; verify_session: {verdict}")

    # 2. the header without a token: not a claim.
    spoofed = [_get(demo.gateway_port, {H.END_USER: "jason"}) for _ in range(5)]
    spoof_where = sorted({d.get("upstream", f"HTTP {s}") for s, d in spoofed})
    spoof_leaked = [d["headers"][H.END_USER] for _, d in spoofed if H.END_USER in d.get("headers", {})]
    print(f"  {H.END_USER}: jason, no token x5 -> {', '.join(spoof_where)};"
          f" upstream saw {H.END_USER}: {spoof_leaked[0] if spoof_leaked else 'absent'}")

    # 3. bad tokens: 401 at the gateway, nothing upstream.
    n0 = received()
    bad = {"expired": _get(demo.gateway_port, {**_bearer(issuer.token(exp_in=-120, sub="jason", tenant="acme")),
                                               H.END_USER: "jason"})[0],
           "forged": _get(demo.gateway_port, {**_bearer(forger.token(sub="jason", tenant="acme")),
                                              H.END_USER: "jason"})[0]}
    reached = received() - n0
    print(f"  expired token -> HTTP {bad['expired']}; forged token (same kid, other key) -> HTTP {bad['forged']};"
          f" requests that reached an upstream: {reached}")

    # 4. the QoS class asked for with X-LLM-Priority.
    _, hi = _get(demo.gateway_port, {**_bearer(token), "X-LLM-Priority": "high"})
    hi_h = hi.get("headers", {})
    hi_verdict = _verify(hi_h, session_key)
    print(f"  X-LLM-Priority: high -> upstream saw {H.QOS_CLASS}: {hi_h.get(H.QOS_CLASS)}; verify_session: {hi_verdict}")

    # 5. tenant isolation: acme's own x-tenant-acme-* passes, another tenant's is removed.
    _, tn = _get(demo.gateway_port, {**_bearer(token), "x-tenant-acme-region": "eu", "x-tenant-other-plan": "gold"})
    tn_h = tn.get("headers", {})
    print(f"  tenant acme sends x-tenant-acme-region, x-tenant-other-plan -> upstream saw"
          f" {', '.join(k for k in sorted(tn_h) if k.startswith(H.TENANT_HEADER_PREFIX)) or 'none'}")
    saved = demo.workdir / "token-jason.jwt"      # for --serve: curl -H "authorization: Bearer $(cat ...)"
    saved.write_text(issuer.token(exp_in=3600, sub="jason", tenant="acme") + "\n")
    demo.urls["token sub=jason (1 h)"] = str(saved)
    print(f"  (module {WASM.name} sha256 {sha[:12]}…, step took {time.monotonic() - started:.1f} s)")

    return [
        Check("token sub=jason", "v2 x5, end-user jason, tenant acme",
              f"{','.join(where)}, {seen.get(H.END_USER)}, {seen.get(H.TENANT)}",
              where == ["v2"] and all(s == 200 for s, _ in valid)
              and seen.get(H.END_USER) == "jason" and seen.get(H.TENANT) == "acme"),
        Check("session signature", "verify_session valid", verdict.split(" (")[0],
              verdict.startswith("valid") and f"{H.END_USER}=jason" in verdict and f"{H.TENANT}=acme" in verdict),
        Check("end-user: jason, no token", "not v2, header not upstream",
              f"{','.join(spoof_where)}, {'seen' if spoof_leaked else 'not seen'}",
              "v2" not in spoof_where and all(s == 200 for s, _ in spoofed) and not spoof_leaked),
        Check("expired / forged token", "401 / 401, 0 upstream",
              f"{bad['expired']} / {bad['forged']}, {reached} upstream",
              bad == {"expired": 401, "forged": 401} and reached == 0),
        Check("X-LLM-Priority: high", "x-mcp-qos-class latency-critical, signed",
              f"{hi_h.get(H.QOS_CLASS)}, {hi_verdict.split(' (')[0]}",
              hi_h.get(H.QOS_CLASS) == "latency-critical" and f"{H.QOS_CLASS}=latency-critical" in hi_verdict),
        Check("cross-tenant header", "x-tenant-other-* removed, acme's kept",
              "removed" if "x-tenant-other-plan" not in tn_h else "passed",
              "x-tenant-other-plan" not in tn_h and tn_h.get("x-tenant-acme-region") == "eu"),
    ]
