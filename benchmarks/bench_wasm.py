"""Per-request cost of the header contract in Envoy, side by side in one run.

One Envoy (one worker) serves six listeners that differ only in their HTTP
filters: none; jwt_authn alone; the Wasm contract alone; the Lua equivalent
alone; jwt_authn + Wasm (the full contract as the control plane pushes it);
jwt_authn + Lua. Each proxies to an origin listener of the same Envoy that
answers directly, so a request is a real proxy hop and what is measured is
Envoy and its filters, not a Python upstream. h2load (HTTP/2, the same
headers and a valid RS256 token on every request) drives each listener
unloaded (one client, sequential), at a fixed moderate rate, and closed-loop
at saturation; p50/p99 come from h2load's per-request log. Configurations
are interleaved round by round and the median is reported.

Also: the module's size, and Envoy's RSS with each configuration alone
(separate Envoys, after the same warm-up).

Run from the repo root: `python -m benchmarks wasm`; writes
artifacts/bench/wasm.json.
"""
from __future__ import annotations

import base64
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import jwt as pyjwt
from google.protobuf import json_format
from jwcrypto import jwk

from mcp26.mesh.resources import MeshConfig
from mcp26.mesh.parse import parse_documents
from mcp26.mesh.header_contract import parse_plugin_config
from mcp26.mesh.session import verify_session
from mcp26.demo.stack.envoy import Envoy
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.wasm.lua import lua_source
from mcp26.xds.translate import Overlay, Phase, authn, wasm_plugins
from mcp26.xds.wasm_modules import WasmModuleStore
from mcp26.xds.model.node import ProxyNode

ROOT = pathlib.Path(__file__).resolve().parent.parent

WASM = ROOT / "wasm-filters" / "build" / "header_contract.wasm"
OUT = ROOT / "artifacts" / "bench" / "wasm.json"
KEY = b"bench-session-key-0123456789abcd"
CONFIGS = ("none", "jwt_authn", "wasm", "lua", "jwt_authn+wasm", "jwt_authn+lua")
MODERATE = {"clients": 4, "rps_per_client": 250}     # 1000 req/s: far below saturation
SATURATED = {"clients": 16, "streams": 4}
DURATION_S, WARMUP_S = 3, 1
ROUNDS, LOADED_ROUNDS = 5, 2          # unloaded runs are cheap: more rounds against noise
UNLOADED_REQUESTS = 5000
ISSUER, AUD = "https://bench.issuer", "mesh"

ROUTER = {"name": "envoy.filters.http.router",
          "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}


def mesh_resources(jwks_public: str) -> MeshConfig:
    plugin = {"sessionKey": base64.b64encode(KEY).decode(),
              "tenants": {"acme": {"allowedHeaders": ["x-tenant-acme-*"]}},
              "qos": {"tiers": {"free": "standard", "gold": "latency-critical"}}}
    text = f"""apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{name: bench, namespace: default}}
spec:
  jwtRules:
  - issuer: {ISSUER}
    audiences: [{AUD}]
    jwks: '{jwks_public}'
---
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {{name: contract, namespace: default}}
spec:
  url: file://{WASM}
  phase: AUTHZ
  pluginName: mcp-header-contract
  pluginConfig: {json.dumps(plugin)}
"""
    return MeshConfig(parse_documents(text, file="bench.yaml"))


def filter_sets(config: MeshConfig) -> dict[str, list[dict]]:
    """Each configuration's HTTP filters, from the control plane's own translators."""
    node = ProxyNode(id="bench")
    as_json = lambda m: json.loads(json_format.MessageToJson(m))   # noqa: E731
    jwt_f = [as_json(f) for f in authn.http_filters(config, node, 0, Phase.AUTHN)]
    wasm_res = config.of_kind("WasmPlugin")[0]
    overlay = Overlay(wasm_modules=WasmModuleStore().load(config))     # read as the control plane loads a config
    wasm_f = [as_json(wasm_plugins.static_http_filter(wasm_res, config, node, overlay))]
    contract = parse_plugin_config(wasm_res.spec["pluginConfig"])
    lua_f = [{"name": "envoy.filters.http.lua", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
        "default_source_code": {"inline_string": lua_source(contract)}}}]
    return {"none": [], "jwt_authn": jwt_f, "wasm": wasm_f, "lua": lua_f,
            "jwt_authn+wasm": jwt_f + wasm_f, "jwt_authn+lua": jwt_f + lua_f}


def listener(name: str, port: int, filters: list[dict], origin: bool = False) -> dict:
    routes = [{"match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": "ok\n"}}}] if origin else [
        {"match": {"prefix": "/echo"}, "route": {"cluster": "echo"}},
        {"match": {"prefix": "/"}, "route": {"cluster": "origin"}}]
    return {"name": name, "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
            "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": name.replace("+", "_"), "codec_type": "AUTO",
                "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": routes}]},
                "http_filters": filters + [ROUTER]}}]}]}


def _cluster(name: str, port: int, h2: bool = False) -> dict:
    c = {"name": name, "type": "STATIC", "connect_timeout": "1s", "load_assignment": {
        "cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
            "address": "127.0.0.1", "port_value": port}}}}]}]}}
    if h2:
        c["typed_extension_protocol_options"] = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}}
    return c


def bootstrap(sets: dict[str, list[dict]], ports: dict[str, int], echo_port: int) -> dict:
    origin = free_port()
    return {"static_resources": {
        "listeners": [listener(n, ports[n], sets[n]) for n in ports] + [listener("origin", origin, [], origin=True)],
        "clusters": [_cluster("echo", echo_port), _cluster("origin", origin, h2=True)]}}


def request_headers(token: str) -> dict[str, str]:
    # a valid token, a spoofed session header, one own and one foreign tenant header, a priority
    return {"authorization": f"Bearer {token}", "end-user": "admin", "x-tenant-acme-region": "eu",
            "x-tenant-globex-plan": "gold", "x-llm-priority": "high", "content-type": "application/json"}


def check_equivalence(ports: dict[str, int], headers: dict[str, str], echo: EchoUpstream) -> dict:
    """Before timing anything: Wasm and Lua produce the same, verifiable headers."""
    seen = {}
    for name in ("wasm", "lua", "jwt_authn+wasm", "jwt_authn+lua"):
        req = urllib.request.Request(f"http://127.0.0.1:{ports[name]}/echo", headers=headers)
        with urllib.request.urlopen(req, timeout=5) as r:
            h = json.loads(r.read())["headers"]
            error_class = r.headers.get("x-mcp-error-class")
        contract = {k: v for k, v in h.items() if k.startswith(("x-mcp-", "end-user", "x-tenant-"))}
        session = verify_session(h, KEY, method="GET")
        # v2 binds each request's x-request-id and time: compare what was signed, not the MAC
        contract["x-mcp-session-sig"] = contract["x-mcp-session-sig"].split(";")[2]
        assert error_class == "ok", (name, error_class)
        seen[name] = contract
        assert "x-tenant-globex-plan" not in h, name
        if name.startswith("jwt"):
            assert session.end_user == "jane" and session.tenant == "acme", (name, contract)
        else:
            assert "end-user" not in h, name
    assert seen["wasm"] == seen["lua"] and seen["jwt_authn+wasm"] == seen["jwt_authn+lua"], seen
    return seen


def h2load(port: int, headers: dict[str, str], clients: int, streams: int = 1, rps: int | None = None,
           requests: int | None = None) -> dict:
    with tempfile.NamedTemporaryFile(prefix="h2load-", suffix=".log", delete=False) as log:
        path = log.name
    args = ["h2load", "-t", "1", "-c", str(clients), "-m", str(streams), "--log-file", path]
    args += ["-n", str(requests)] if requests else ["-D", str(DURATION_S), "--warm-up-time", str(WARMUP_S)]
    if rps:
        args += ["--rps", str(rps)]
    for k, v in headers.items():
        args += ["-H", f"{k}: {v}"]
    out = subprocess.run(args + [f"http://127.0.0.1:{port}/infer"], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(out.stdout + out.stderr)
    lat, statuses = [], {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3:
                statuses[parts[1]] = statuses.get(parts[1], 0) + 1
                lat.append(int(parts[2]))
    os.unlink(path)
    if set(statuses) != {"200"}:
        raise RuntimeError(f"non-200 answers from port {port}: {statuses}")
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]   # noqa: E731
    return {"requests": len(lat), "qps": len(lat) / DURATION_S if not requests else None,
            "p50_us": q(0.50), "p99_us": q(0.99)}


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def rss_alone(sets, headers, echo_port) -> dict[str, int]:
    """Envoy's RSS with each configuration alone, after the same short load."""
    out = {}
    for name in CONFIGS:
        port = free_port()
        with Envoy(bootstrap(sets, {name: port}, echo_port)) as e:
            subprocess.run(["h2load", "-t", "1", "-c", "4", "-n", "4000",
                            *sum((["-H", f"{k}: {v}"] for k, v in headers.items()), []),
                            f"http://127.0.0.1:{port}/"], capture_output=True, timeout=60)
            out[name] = rss_kib(e.proc.pid)
    return out


def main() -> int:
    if not WASM.exists():
        print("build the module first: make wasm", file=sys.stderr)
        return 1
    key = jwk.JWK.generate(kty="RSA", size=2048, kid="bench")
    public = json.dumps({"keys": [json.loads(key.export_public())]})
    token = pyjwt.encode({"iss": ISSUER, "aud": AUD, "sub": "jane", "tenant": "acme", "tier": "gold",
                          "exp": int(time.time()) + 3600}, key.export_to_pem(private_key=True, password=None),
                         algorithm="RS256", headers={"kid": "bench"})
    headers = request_headers(token)
    config = mesh_resources(public)
    sets = filter_sets(config)
    ports = {n: free_port() for n in CONFIGS}
    results: dict = {n: {"unloaded": [], "moderate": [], "saturated": []} for n in CONFIGS}
    with EchoUpstream("echo") as echo, Envoy(bootstrap(sets, ports, echo.port)) as envoy:
        check_equivalence(ports, headers, echo)
        for rnd in range(ROUNDS):
            order = CONFIGS if rnd % 2 == 0 else tuple(reversed(CONFIGS))
            for name in order:
                results[name]["unloaded"].append(h2load(ports[name], headers, 1, requests=UNLOADED_REQUESTS))
                if rnd < LOADED_ROUNDS:
                    results[name]["moderate"].append(h2load(ports[name], headers, MODERATE["clients"],
                                                            rps=MODERATE["rps_per_client"]))
                    results[name]["saturated"].append(h2load(ports[name], headers, SATURATED["clients"],
                                                             streams=SATURATED["streams"]))
        shared_rss = rss_kib(envoy.proc.pid)
    rss = rss_alone(sets, headers, echo.port)

    summary = {}
    for name in CONFIGS:
        mod, sat, unl = results[name]["moderate"], results[name]["saturated"], results[name]["unloaded"]
        summary[name] = {"unloaded_p50_us": statistics.median(r["p50_us"] for r in unl),
                         "unloaded_p99_us": statistics.median(r["p99_us"] for r in unl),
                         "p50_us": statistics.median(r["p50_us"] for r in mod),
                         "p99_us": statistics.median(r["p99_us"] for r in mod),
                         "qps_saturated": statistics.median(r["qps"] for r in sat),
                         "rss_kib_alone": rss[name]}
    base = summary["none"]
    print(f"\nHeader contract cost per request (Envoy 1 worker, h2load HTTP/2; moderate = "
          f"{MODERATE['clients'] * MODERATE['rps_per_client']} req/s, saturated = {SATURATED['clients']}x{SATURATED['streams']} streams)")
    print(f"{'filters':<16}{'idle p50':>9}{'x':>6}{'+us':>5}{'p50 us':>8}{'p50 x':>7}{'p99 us':>8}{'p99 x':>7}{'QPS sat':>9}{'QPS x':>7}{'RSS MiB':>9}")
    for name in CONFIGS:
        s = summary[name]
        print(f"{name:<16}{s['unloaded_p50_us']:>9}{s['unloaded_p50_us'] / base['unloaded_p50_us']:>6.2f}"
              f"{s['unloaded_p50_us'] - base['unloaded_p50_us']:>5.0f}{s['p50_us']:>8}{s['p50_us'] / base['p50_us']:>7.2f}{s['p99_us']:>8}"
              f"{s['p99_us'] / base['p99_us']:>7.2f}{s['qps_saturated']:>9.0f}{s['qps_saturated'] / base['qps_saturated']:>7.2f}"
              f"{s['rss_kib_alone'] / 1024:>9.1f}")
    w, l, j, jw, jl = (summary[n] for n in ("wasm", "lua", "jwt_authn", "jwt_authn+wasm", "jwt_authn+lua"))
    floors = {
        "wasm_adds_le_10pct_p50": w["p50_us"] <= 1.10 * base["p50_us"],
        "wasm_adds_le_10pct_p50_unloaded": w["unloaded_p50_us"] <= 1.10 * base["unloaded_p50_us"],
        "wasm_cheaper_than_lua_p50_unloaded": w["unloaded_p50_us"] <= l["unloaded_p50_us"],
        "wasm_cheaper_than_lua_p50": w["p50_us"] <= l["p50_us"],
        "wasm_more_qps_than_lua": w["qps_saturated"] >= l["qps_saturated"],
        "contract_over_jwt_authn_le_10pct_p50": jw["p50_us"] <= 1.10 * j["p50_us"],
    }
    size = WASM.stat().st_size
    print(f"\nmodule {size} bytes ({size / 1024:.1f} KiB); Lua source {len(lua_source(parse_plugin_config(config.of_kind('WasmPlugin')[0].spec['pluginConfig'])))} bytes; "
          f"shared-run Envoy RSS {shared_rss / 1024:.1f} MiB")
    print(f"wasm vs lua: p50 {w['p50_us'] / l['p50_us']:.2f}x, QPS {w['qps_saturated'] / l['qps_saturated']:.2f}x; "
          f"jwt_authn+wasm vs jwt_authn+lua: p50 {jw['p50_us'] / jl['p50_us']:.2f}x, QPS {jw['qps_saturated'] / jl['qps_saturated']:.2f}x")
    for k, ok in floors.items():
        print(f"  {'PASS' if ok else 'FAIL'} {k}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"summary": summary, "runs": results, "module_bytes": size,
                               "shared_envoy_rss_kib": shared_rss, "floors": floors,
                               "load": {"moderate": MODERATE, "saturated": SATURATED, "duration_s": DURATION_S,
                                        "warmup_s": WARMUP_S, "rounds": ROUNDS, "loaded_rounds": LOADED_ROUNDS,
                                        "unloaded_requests": UNLOADED_REQUESTS}}, indent=2))
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
