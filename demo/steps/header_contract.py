"""The L6->L7 header contract on the reviews gateway.

Writes into the watched config dir, as one change, a RequestAuthentication
with an inline JWKS (an RS256 key made here) and the header-contract
WasmPlugin (the module `make wasm` builds, pinned by sha256, phase AUTHZ,
FAIL_CLOSE, a session key made here, per-tenant allowed headers) limited to
the reviews gateway's port; then mints tokens and shows what the upstreams saw:

- a valid token for sub jason -> v2 by the verified claim; end-user,
  x-mcp-tenant and an x-mcp-session-sig that mesh.session.verify_session accepts;
- a client's own `end-user: jason` without a token -> not v2, never seen upstream;
- an expired or forged token -> 401, nothing reaches an upstream;
- X-LLM-Priority: critical -> x-mcp-qos-class: latency-critical (signed; the document's four
  names map one to a class, mesh/qos.py: high is interactive);
- another tenant's x-tenant-other-* header -> removed.

Skipped, with the reason, when the Wasm module is not built.
"""
from __future__ import annotations

import base64
import hashlib
import os
import time
from pathlib import Path

import yaml

from mcp26.demo.framework import Check, Demo, Step
from mcp26.wasm import HEADER_CONTRACT_WASM as WASM
from mcp26.demo.stack.tokens import Issuer
from mcp26.demo.stack.control_plane import ADS_TYPES
from mcp26.mesh import headers as H
from mcp26.mesh.header_contract import PLUGIN_NAME
from mcp26.mesh.session import SessionError, verify_session

ISSUER = "https://issuer.demo.local"
AUDIENCE = "mcp-demo-gateway"
KID = "demo-1"
CONFIG_FILE = "header-contract.yaml"


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
                                 "other": {"allowedHeaders": ["x-tenant-other-*"]}},
                     # A safe default: only a token of a tier that allows it gets
                     # latency-critical; anyone else asking is capped at standard.
                     "qos": {"tierClaim": "tier", "tiers": {"gold": "latency-critical"},
                             "ceiling": "standard"}}},
    }
    return "# The L6->L7 header contract on the reviews gateway (written by the demo).\n" + \
        yaml.safe_dump_all([authn, plugin], sort_keys=False)


def _bearer(token: str) -> dict:
    return {"authorization": f"Bearer {token}"}


def _verify(headers: dict, key: bytes) -> str:
    """verify_session's verdict on what the upstream saw, in words."""
    try:
        s = verify_session(headers, key, method="GET")   # the demo's requests are GETs
    except SessionError as e:
        return f"invalid: {e.reason}"
    return "valid (" + ", ".join(f"{k}={v}" for k, v in s.signed.items()) + ")"


def run(demo: Demo) -> list[Check]:
    if not WASM.exists():
        print(f"  skipped: {WASM} is not built (run `make wasm` in a checkout)")
        return []
    started = time.monotonic()
    sha = hashlib.sha256(WASM.read_bytes()).hexdigest()
    issuer = Issuer(KID, ISSUER, AUDIENCE)
    forger = Issuer(KID, ISSUER, AUDIENCE)          # signs with another key under the same kid
    session_key = os.urandom(32)

    def get(headers: dict) -> tuple[int, dict]:
        """(status, what the upstream saw) on a fresh connection: the step replaces the listener."""
        with demo.gateway() as gw:
            status, _, seen = gw.get(headers=headers, timeout=10)
        return status, seen

    # The first routing back (end-user: jason -> v2, everyone else v1; no fault), then the contract.
    demo.apply("virtualservice.yaml", demo.manifest("config/virtualservice.yaml"))
    demo.apply(CONFIG_FILE, contract_config(issuer.jwks, session_key, WASM, sha, demo.gateway_port),
               types=ADS_TYPES + ("ECDS",))       # the Wasm filter comes over ECDS
    token = issuer.token(sub="jason", tenant="acme", tier="gold")
    # The listener is replaced (jwt_authn added) and the module loads: wait until the upstream sees a signature.
    demo.wait("the header contract to serve",
              lambda: H.SESSION_SIG in get(_bearer(token))[1].get("headers", {}), timeout=20)

    def received() -> int:
        return sum(len(u.requests) for u in demo.upstreams)

    # 1. a valid token for jason: routed by the verified claim, session headers signed.
    valid = [get(_bearer(token)) for _ in range(5)]
    where = sorted({d.get("upstream", f"HTTP {s}") for s, d in valid})
    seen = valid[-1][1].get("headers", {})
    verdict = _verify(seen, session_key)
    print(f"  token sub=jason tenant=acme x5 -> {', '.join(where)}; upstream saw {H.END_USER}: {seen.get(H.END_USER)},"
          f" {H.TENANT}: {seen.get(H.TENANT)}, {H.QOS_CLASS}: {seen.get(H.QOS_CLASS)}")
    print(f"    {H.SESSION_SIG}: {seen.get(H.SESSION_SIG, '-')[:60]}...; verify_session: {verdict}")

    # 2. the header without a token: not a claim.
    spoofed = [get({H.END_USER: "jason"}) for _ in range(5)]
    spoof_where = sorted({d.get("upstream", f"HTTP {s}") for s, d in spoofed})
    spoof_leaked = [d["headers"][H.END_USER] for _, d in spoofed if H.END_USER in d.get("headers", {})]
    print(f"  {H.END_USER}: jason, no token x5 -> {', '.join(spoof_where)};"
          f" upstream saw {H.END_USER}: {spoof_leaked[0] if spoof_leaked else 'absent'}")

    # 3. bad tokens: 401 at the gateway, nothing upstream.
    n0 = received()
    bad = {"expired": get({**_bearer(issuer.token(exp_in=-120, sub="jason", tenant="acme")), H.END_USER: "jason"})[0],
           "forged": get({**_bearer(forger.token(sub="jason", tenant="acme")), H.END_USER: "jason"})[0]}
    reached = received() - n0
    print(f"  expired token -> HTTP {bad['expired']}; forged token (same kid, other key) -> HTTP {bad['forged']};"
          f" requests that reached an upstream: {reached}")

    # 4. the QoS class asked for with X-LLM-Priority.
    _, hi = get({**_bearer(token), "X-LLM-Priority": "critical"})
    hi_h = hi.get("headers", {})
    hi_verdict = _verify(hi_h, session_key)
    print(f"  X-LLM-Priority: critical -> upstream saw {H.QOS_CLASS}: {hi_h.get(H.QOS_CLASS)}; verify_session: {hi_verdict}")
    _, anon = get({"X-LLM-Priority": "high"})              # no token: the ceiling applies
    anon_class = anon.get("headers", {}).get(H.QOS_CLASS)
    print(f"  X-LLM-Priority: high without a token -> upstream saw {H.QOS_CLASS}: {anon_class} (ceiling)")

    # 5. tenant isolation: acme's own x-tenant-acme-* passes, another tenant's is removed.
    _, tn = get({**_bearer(token), "x-tenant-acme-region": "eu", "x-tenant-other-plan": "gold"})
    tn_h = tn.get("headers", {})
    print(f"  tenant acme sends x-tenant-acme-region, x-tenant-other-plan -> upstream saw"
          f" {', '.join(k for k in sorted(tn_h) if k.startswith(H.TENANT_HEADER_PREFIX)) or 'none'}")
    saved = demo.workdir / "token-jason.jwt"      # for --serve: curl -H "authorization: Bearer $(cat ...)"
    saved.write_text(issuer.token(exp_in=3600, sub="jason", tenant="acme", tier="gold") + "\n")
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
        Check("X-LLM-Priority: critical", "x-mcp-qos-class latency-critical, signed",
              f"{hi_h.get(H.QOS_CLASS)}, {hi_verdict.split(' (')[0]}",
              hi_h.get(H.QOS_CLASS) == "latency-critical" and f"{H.QOS_CLASS}=latency-critical" in hi_verdict),
        Check("anonymous X-LLM-Priority: high", "capped at standard", str(anon_class), anon_class == "standard"),
        Check("cross-tenant header", "x-tenant-other-* removed, acme's kept",
              "removed" if "x-tenant-other-plan" not in tn_h else "passed",
              "x-tenant-other-plan" not in tn_h and tn_h.get("x-tenant-acme-region") == "eu"),
    ]


STEP = Step(70, "header contract: JWT session headers", run)
