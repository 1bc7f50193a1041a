"""Keep secrets out of what the control plane shows (admin and debug output).

The header-contract session key is the HMAC key of x-mcp-session-sig: with it
anyone can sign `end-user: admin` at any QoS class. The control plane must put
it in the WasmPlugin's configuration it sends to Envoy (mesh.header_contract
`filter_config()["session"]["key"]`, hex), so every JSON view of a snapshot
would show it. Three layers, so a view added later is covered too:

- `redact(obj)`: structurally, in an Envoy-JSON dict: a Wasm plugin
  `configuration` (a JSON string) loses `session.key`, and a VM's
  `environmentVariables.keyValues` lose their values;
- `redact_text(text, secrets)`: in the serialized text, any `"key":"<hex>"`
  of 16 bytes or more (also inside an escaped JSON string, as Envoy quotes
  configs in NACK messages), and every literal secret in `secrets`;
- `known_secrets(config)`: the keys of the config being served, in the forms a
  text could carry them (as written, hex, base64).
"""
from __future__ import annotations

import base64
import binascii
import json
import re

from mcp26.mesh.header_contract import PLUGIN_NAME

REDACTED = "[redacted]"
STRING_VALUE = "type.googleapis.com/google.protobuf.StringValue"
# "key":"<32+ hex>", the quotes possibly escaped once or more (JSON in JSON).
_HEX_KEY = re.compile(r'((?:\\*")key(?:\\*")\s*:\s*(?:\\*"))[0-9a-fA-F]{32,}(?=\\*")')


def _redact_plugin_configuration(value: str) -> str:
    try:
        cfg = json.loads(value)
    except ValueError:
        return value
    session = cfg.get("session") if isinstance(cfg, dict) else None
    if isinstance(session, dict) and "key" in session:
        session["key"] = REDACTED
        return json.dumps(cfg, separators=(",", ":"), sort_keys=True)
    return value


def redact(obj):
    """A copy of an Envoy-JSON (MessageToDict) structure without the secrets it can hold."""
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    out = {}
    for k, v in obj.items():
        if k == "configuration" and isinstance(v, dict) and v.get("@type") == STRING_VALUE \
                and isinstance(v.get("value"), str):
            v = {**v, "value": _redact_plugin_configuration(v["value"])}
        elif k in ("keyValues", "key_values") and isinstance(v, dict):
            v = {name: REDACTED for name in v}       # a Wasm VM's environment: often a secret
        out[k] = redact(v)
    return out


def redact_text(text: str, secrets=()) -> str:
    text = _HEX_KEY.sub(lambda m: m.group(1) + REDACTED, text)
    for s in sorted(secrets, key=len, reverse=True):
        text = text.replace(s, REDACTED)
    return text


def key_forms(key: bytes) -> set[str]:
    return {key.hex(), key.hex().upper(), base64.b64encode(key).decode()} if key else set()


def known_secrets(config) -> set[str]:
    """Every header-contract session key in `config` (a MeshConfig, or None), as it may appear."""
    out: set[str] = set()
    if config is None:
        return out
    for res in config.of_kind("WasmPlugin"):
        cfg = res.spec.get("pluginConfig")
        if res.spec.get("pluginName") != PLUGIN_NAME or not isinstance(cfg, dict):
            continue
        for field, decode in (("sessionKey", lambda s: base64.b64decode(s, validate=True)),
                              ("sessionKeyHex", bytes.fromhex)):
            raw = cfg.get(field)
            if isinstance(raw, str) and len(raw) >= 8:
                out.add(raw)
                try:
                    out |= key_forms(decode(raw))
                except (binascii.Error, ValueError):
                    pass
    return out
