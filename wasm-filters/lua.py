"""The Lua equivalent of the header-contract module (for side-by-side benchmarks).

`lua_source(contract)` fills lua/header_contract.lua's CONFIG with the same
filter configuration the Wasm module gets, as a Lua table literal.
"""
from __future__ import annotations

import os

from mcp26.mesh.header_contract import JWT_AUTHN_FILTER, JWT_PAYLOAD_METADATA_KEY, HeaderContract

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lua", "header_contract.lua")


def lua_literal(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, (bytes, str)):
        b = v if isinstance(v, bytes) else v.encode()
        return '"' + "".join(chr(c) if 32 <= c < 127 and chr(c) not in '"\\' else f"\\{c:03d}" for c in b) + '"'
    if isinstance(v, (list, tuple)):
        return "{" + ", ".join(lua_literal(x) for x in v) + "}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"[{lua_literal(k)}] = {lua_literal(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} as Lua")


def lua_config(contract: HeaderContract) -> dict:
    f = contract.filter_config()
    q, t, e, s = f["qos"], f["tenant"], f["errors"], f["session"]
    return {
        "key": bytes.fromhex(s["key"]), "sig_header": s["header"], "signed": s["signed"],
        "payload_ns": JWT_AUTHN_FILTER, "payload_key": JWT_PAYLOAD_METADATA_KEY,
        "strip": f["strip"], "claims": f["claims"],
        "tenant_header": t["header"], "prefixes": t["scoped_prefixes"], "common": t["common"],
        "tenants": {x["name"]: {"allowed": x["allowed"], "strict": x["strict"]} for x in t["tenants"]},
        "qos_header": q["header"], "priority_header": q["priority_header"], "priority": q["priority"],
        "protocol": q["protocol"], "alpn_header": q.get("alpn_header", ""), "alpn": q.get("alpn", {}),
        "tier_claim": q["tier_claim"], "tiers": q["tiers"],
        "default": q["default"], "ceiling": q["ceiling"],
        "levels": {c["name"]: c["level"] for c in q["classes"]},
        "error_header": e["header"], "grpc": e["grpc"], "grpc_default": e["grpc_default"], "http": e["http"],
    }


def lua_source(contract: HeaderContract) -> str:
    with open(TEMPLATE) as fh:
        return fh.read().replace("__CONFIG__", lua_literal(lua_config(contract)), 1)
