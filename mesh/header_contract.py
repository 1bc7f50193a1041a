"""The header-contract filter's configuration: model, validation, and the JSON
the Wasm module reads.

Users write Istio `WasmPlugin.spec.pluginConfig` (camelCase, below); the
control plane turns it, with the mesh's own definitions (mesh.headers,
mesh.qos, mesh.error_classes), into the flat JSON the C filter parses
(`HeaderContract.filter_json()`), so the module itself hard-codes no header
name, class or map.

    pluginConfig:
      sessionKey: <base64, 16..64 bytes>        # HMAC key of x-mcp-session-sig
      # or, so that no config dump holds the key: Envoy's environment variable NAME
      # (`mcpctl envoy run --session-key-file`), passed into the VM by host_env_keys
      sessionKeyFrom: {env: MCP_SESSION_KEY}
      claims:                                   # extra claim -> header (defaults: sub -> end-user, tenant -> x-mcp-tenant)
        - {claim: email, header: x-mcp-email}
      tenantClaim: tenant                       # which claim names the tenant
      tenants:
        acme: {allowedHeaders: [x-tenant-acme-*, x-tenant-shared], strict: false}
      commonHeaders: [content-type, ...]        # what a strict tenant may still send
      qos:
        tierClaim: tier
        tiers: {free: standard, pro: interactive, enterprise: latency-critical}
        priority: {high: latency-critical}      # overrides of mesh.qos.LLM_PRIORITY_CLASSES
        defaultClass: standard
        ceiling: latency-critical               # cap when the token has no known tier
      errorClasses: {UNAVAILABLE: overload, "8": overload}   # gRPC status (name or code) -> class
      httpErrorClasses: {"429": overload}
"""
from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass, field

from mcp26.mesh import headers as H
from mcp26.mesh import qos as Q
from mcp26.mesh.error_classes import DEFAULT_ERROR_CLASS_MAP, ERROR_CLASSES, GRPC_STATUS
from mcp26.mesh.session import DEFAULT_SIGNED_HEADERS, MIN_KEY_BYTES

# WasmPlugin.spec.pluginName of the mesh's own header-contract filter.
PLUGIN_NAME = "mcp-header-contract"

# Where jwt_authn leaves the verified payload (provider.payload_in_metadata),
# and where the filter reads claims from: a client cannot write metadata.
JWT_AUTHN_FILTER = "envoy.filters.http.jwt_authn"
JWT_PAYLOAD_METADATA_KEY = "jwt_payload"
PAYLOAD_PROPERTY = ("metadata", "filter_metadata", JWT_AUTHN_FILTER, JWT_PAYLOAD_METADATA_KEY)

DEFAULT_CLAIMS = (("sub", H.END_USER), ("tenant", H.TENANT))
DEFAULT_TIER_CLAIM = "tier"
MAX_KEY_BYTES = 64
MAX_HEADER_NAME = 128   # the filter's bound on a configured header name
# sessionKeyFrom.env: the Envoy process's variable holding the key (lower-case hex,
# as `mcpctl envoy run --session-key-file` sets it); the filter's bound is 64.
DEFAULT_SESSION_KEY_ENV = "MCP_SESSION_KEY"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")

# Envoy exposes no downstream-ALPN attribute to Wasm: on TLS-terminating
# gateway listeners the control plane puts the client's ALPN in
# H.DOWNSTREAM_ALPN (xds.translate.listeners); without it (plaintext,
# h2c) the negotiated HTTP protocol (request.protocol) stands in for it.
PROTOCOL_PROPERTY = ("request", "protocol")
ALPN_PROTOCOLS = {"h2": "HTTP/2", "h3": "HTTP/3", "http/1.1": "HTTP/1.1"}
# The verified caller identity: the peer certificate's URI SAN (mTLS).
IDENTITY_PROPERTY = ("connection", "uri_san_peer_certificate")
# The class an L7SchedulingPolicy's route gives (mesh/l7_routing.py): the control plane
# writes it in the route's metadata, the filter takes it as the class asked for.
ROUTE_METADATA = "mcp-mesh"
ROUTE_CLASS_KEY = "qos_class"
ROUTE_CLASS_PROPERTY = ("xds", "route_metadata", "filter_metadata", ROUTE_METADATA, ROUTE_CLASS_KEY)

# Headers a strict tenant may always send.
DEFAULT_COMMON_HEADERS = ("content-type", "content-length", "accept", "accept-encoding", "user-agent",
                          "authorization", "te", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding",
                          "x-request-id", "x-forwarded-for", "x-forwarded-proto", "x-envoy-*",
                          "traceparent", "tracestate", "x-grpc-web", "x-user-agent", H.LLM_PRIORITY)

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9a-zA-Z]+$")
_KNOWN_KEYS = {"sessionKey", "sessionKeyHex", "sessionKeyFrom", "claims", "tenantClaim", "tenants", "commonHeaders",
               "qos", "errorClasses", "httpErrorClasses"}


def is_token(s: str) -> bool:
    """RFC 7230 `token` (what a header field name must be)."""
    return isinstance(s, str) and bool(_TOKEN.match(s))


def is_header_pattern(s: str) -> bool:
    base = s[:-1] if isinstance(s, str) and s.endswith("*") and len(s) > 1 else s
    return is_token(base) and base == base.lower() and len(base) <= MAX_HEADER_NAME


@dataclass
class TenantPolicy:
    allowed_headers: list[str] = field(default_factory=list)
    strict: bool = False


@dataclass(frozen=True)
class ClassRemap:
    """A decision loop's remap (scheduler/README.md "Decision loop"): requests the
    filter would give `from_class` get `to_class` until `expires_at` (unix seconds).
    Not user configuration: the control plane folds the loop's remaps in; the
    filter applies one only before its expiry, and signs the class it gives."""
    from_class: Q.QosClass
    to_class: Q.QosClass
    expires_at: float

    def as_json(self) -> dict:
        return {"from": self.from_class.header_value, "to": self.to_class.header_value,
                "until_ns": int(self.expires_at * 1e9)}


MAX_CLASS_REMAPS = 8   # the filter's bound


@dataclass
class HeaderContract:
    session_key: bytes                      # b"" when the key comes from session_key_env
    claims: list[tuple[str, str]] = field(default_factory=lambda: list(DEFAULT_CLAIMS))
    tenants: dict[str, TenantPolicy] = field(default_factory=dict)
    common_headers: list[str] = field(default_factory=lambda: list(DEFAULT_COMMON_HEADERS))
    tier_claim: str = DEFAULT_TIER_CLAIM
    tiers: dict[str, Q.QosClass] = field(default_factory=dict)
    priority: dict[str, Q.QosClass] = field(default_factory=lambda: dict(Q.LLM_PRIORITY_CLASSES))
    alpn: dict[str, Q.QosClass] = field(default_factory=lambda: dict(Q.ALPN_CLASSES))
    default_class: Q.QosClass = Q.DEFAULT_QOS_CLASS
    ceiling: Q.QosClass = Q.QosClass.LATENCY_CRITICAL
    error_classes: dict[int, str] = field(default_factory=dict)     # overrides of the mesh default
    http_error_classes: dict[int, str] = field(default_factory=dict)
    class_remaps: tuple[ClassRemap, ...] = ()
    session_key_env: str = ""               # sessionKeyFrom.env: the key is not in the filter JSON

    @property
    def host_env_keys(self) -> list[str]:
        """Envoy environment variables the VM must see (vm_config.environment_variables)."""
        return [self.session_key_env] if self.session_key_env else []

    @property
    def signed_headers(self) -> list[str]:
        extra = [h for _, h in self.claims if h not in DEFAULT_SIGNED_HEADERS]
        return list(DEFAULT_SIGNED_HEADERS) + extra

    @property
    def stripped_headers(self) -> list[str]:
        """Every header the mesh sets: a client's own copy never passes."""
        out = [H.END_USER, H.TENANT, H.SESSION_SIG, H.QOS_CLASS, H.DOWNSTREAM_SERVICE_CLUSTER, H.DOWNSTREAM_ALPN]
        return out + [h for _, h in self.claims if h not in out]

    def with_claims(self, extra: list[tuple[str, str]]) -> "HeaderContract":
        """Add claim -> header mappings (e.g. RequestAuthentication outputClaimToHeaders)."""
        have = {h for _, h in self.claims}
        merged = list(self.claims) + [(c, h) for c, h in extra if h not in have]
        return HeaderContract(**{**self.__dict__, "claims": merged})

    def with_class_remaps(self, remaps) -> "HeaderContract":
        """The decision loop's remaps laid over this contract (the first MAX_CLASS_REMAPS)."""
        return HeaderContract(**{**self.__dict__, "class_remaps": tuple(remaps)[:MAX_CLASS_REMAPS]})

    def filter_config(self) -> dict:
        grpc = {str(code): cls for code, cls in DEFAULT_ERROR_CLASS_MAP.items()}
        grpc.update({str(code): cls for code, cls in self.error_classes.items()})
        return {
            "v": 1,
            "strip": self.stripped_headers,
            "payload": list(PAYLOAD_PROPERTY),
            "claims": [{"claim": c, "header": h} for c, h in self.claims],
            "tenant": {
                "header": H.TENANT,
                "scoped_prefixes": [H.TENANT_HEADER_PREFIX + "*"],
                "common": list(self.common_headers),
                "tenants": [{"name": n, "allowed": list(p.allowed_headers), "strict": p.strict}
                            for n, p in sorted(self.tenants.items())],
            },
            "session": {"header": H.SESSION_SIG, "signed": self.signed_headers,
                        **({"key_env": self.session_key_env} if self.session_key_env
                           else {"key": self.session_key.hex()})},
            "qos": {
                "header": H.QOS_CLASS,
                "priority_header": H.LLM_PRIORITY,
                "classes": [{"name": c.header_value, "level": c.priority_level} for c in Q.QosClass],
                "priority": {v: c.header_value for v, c in self.priority.items()},
                "alpn_header": H.DOWNSTREAM_ALPN,
                "alpn": {a: c.header_value for a, c in self.alpn.items()},
                "protocol_property": list(PROTOCOL_PROPERTY),
                "route_class_property": list(ROUTE_CLASS_PROPERTY),
                "protocol": {ALPN_PROTOCOLS[a]: c.header_value for a, c in self.alpn.items() if a in ALPN_PROTOCOLS},
                "tier_claim": self.tier_claim,
                "tiers": {t: c.header_value for t, c in self.tiers.items()},
                "default": self.default_class.header_value,
                "ceiling": self.ceiling.header_value,
                **({"remap": [r.as_json() for r in self.class_remaps]} if self.class_remaps else {}),
            },
            "identity": {"header": H.DOWNSTREAM_SERVICE_CLUSTER, "property": list(IDENTITY_PROPERTY)},
            "errors": {
                "header": H.ERROR_CLASS, "grpc": grpc, "grpc_default": "server",
                "http": {str(k): v for k, v in self.http_error_classes.items()},
                "http_ok": "ok", "http_4xx": "client", "http_5xx": "server",
            },
        }

    def filter_json(self) -> str:
        return json.dumps(self.filter_config(), separators=(",", ":"), sort_keys=True)


class ContractError(ValueError):
    """pluginConfig problems: a list of (field path, message)."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{f}: {m}" for f, m in problems))


def _qos_class(value, path: str, problems: list) -> Q.QosClass | None:
    try:
        return Q.QosClass.parse(value) if isinstance(value, str) else Q.QosClass.parse(str(value))
    except ValueError as e:
        problems.append((path, str(e)))
        return None


def _header_name(value, path: str, problems: list, pattern: bool = False) -> str | None:
    ok = is_header_pattern(value) if pattern else (is_token(value) and value == value.lower()
                                                   and len(value) <= MAX_HEADER_NAME)
    if not ok:
        what = (f"a lower-case RFC 7230 token of at most {MAX_HEADER_NAME} characters"
                + (" (optionally ending in '*')" if pattern else ""))
        problems.append((path, f"header name {value!r} must be {what}"))
        return None
    return value


def _status_code(key, path: str, problems: list) -> int | None:
    k = str(key).strip()
    if k.upper() in GRPC_STATUS:
        return GRPC_STATUS[k.upper()]
    if k.isdigit() and int(k) in GRPC_STATUS.values():
        return int(k)
    problems.append((path, f"unknown gRPC status {key!r}; expected a name like UNAVAILABLE or a code 0..16"))
    return None


def _key_env(value, path: str, problems: list) -> str:
    """sessionKeyFrom: {env: NAME} -> NAME (an environment variable name)."""
    if not isinstance(value, dict) or set(value) != {"env"}:
        problems.append((path, "expected {env: NAME}: the Envoy environment variable holding the key"))
        return ""
    name = value["env"]
    if not isinstance(name, str) or not _ENV_NAME.match(name):
        problems.append((f"{path}.env", f"{name!r} is not an environment variable name "
                                        "([A-Za-z_][A-Za-z0-9_]*, at most 64 characters)"))
        return ""
    return name


def parse_plugin_config(cfg, base: str = "spec.pluginConfig") -> HeaderContract:
    """pluginConfig -> HeaderContract, or ContractError naming every bad field."""
    p: list[tuple[str, str]] = []
    if not isinstance(cfg, dict):
        raise ContractError([(base, "pluginConfig must be a mapping")])
    for k in cfg:
        if k not in _KNOWN_KEYS:
            p.append((f"{base}.{k}", f"unknown field; expected one of {', '.join(sorted(_KNOWN_KEYS))}"))

    key, key_env = b"", ""
    given = [k for k in ("sessionKey", "sessionKeyHex", "sessionKeyFrom") if k in cfg]
    if len(given) > 1:
        p.append((f"{base}.{given[1]}", "give one of sessionKey, sessionKeyHex, sessionKeyFrom"))
    if "sessionKeyFrom" in cfg:
        key_env = _key_env(cfg["sessionKeyFrom"], f"{base}.sessionKeyFrom", p)
    elif "sessionKey" in cfg:
        try:
            key = base64.b64decode(str(cfg["sessionKey"]), validate=True)
        except (binascii.Error, ValueError):
            p.append((f"{base}.sessionKey", "not valid base64"))
    elif "sessionKeyHex" in cfg:
        try:
            key = bytes.fromhex(str(cfg["sessionKeyHex"]))
        except ValueError:
            p.append((f"{base}.sessionKeyHex", "not valid hex"))
    else:
        p.append((f"{base}.sessionKey", "required: the HMAC key for x-mcp-session-sig (base64), "
                                          "or sessionKeyFrom: {env: NAME}"))
    if key and not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        p.append((f"{base}.sessionKey", f"key is {len(key)} bytes; expected {MIN_KEY_BYTES}..{MAX_KEY_BYTES}"))

    tenant_claim = cfg.get("tenantClaim", "tenant")
    if not isinstance(tenant_claim, str) or not tenant_claim:
        p.append((f"{base}.tenantClaim", "must be a claim name"))
        tenant_claim = "tenant"
    claims = [("sub", H.END_USER), (tenant_claim, H.TENANT)]
    for i, c in enumerate(cfg.get("claims") or []):
        path = f"{base}.claims[{i}]"
        if not isinstance(c, dict) or not isinstance(c.get("claim"), str) or not c.get("claim"):
            p.append((path, "expected {claim: <name>, header: <header>}"))
            continue
        h = _header_name(c.get("header"), f"{path}.header", p)
        if h in (H.SESSION_SIG, H.QOS_CLASS, H.DOWNSTREAM_SERVICE_CLUSTER, H.DOWNSTREAM_ALPN, H.ERROR_CLASS):
            p.append((f"{path}.header", f"{h} is set by the mesh itself, not from a claim"))
        elif h:
            claims = [(cl, hh) for cl, hh in claims if hh != h] + [(c["claim"], h)]
    if len(claims) > 16:
        p.append((f"{base}.claims", "at most 16 claim mappings"))

    tenants: dict[str, TenantPolicy] = {}
    raw_t = cfg.get("tenants") or {}
    if not isinstance(raw_t, dict):
        p.append((f"{base}.tenants", "expected a mapping tenant -> {allowedHeaders, strict}"))
        raw_t = {}
    if len(raw_t) > 64:
        p.append((f"{base}.tenants", "at most 64 tenants"))
    for name, pol in raw_t.items():
        path = f"{base}.tenants.{name}"
        if not isinstance(pol, dict):
            p.append((path, "expected {allowedHeaders: [...], strict: bool}"))
            continue
        for k in pol:
            if k not in ("allowedHeaders", "strict"):
                p.append((f"{path}.{k}", "unknown field; expected allowedHeaders, strict"))
        allowed = pol.get("allowedHeaders") or []
        if not isinstance(allowed, list) or len(allowed) > 32:
            p.append((f"{path}.allowedHeaders", "expected a list of at most 32 header names"))
            allowed = []
        good = [h for j, h in enumerate(allowed) if _header_name(h, f"{path}.allowedHeaders[{j}]", p, pattern=True)]
        for j, h in enumerate(good):
            if h.startswith(H.TENANT_HEADER_PREFIX) and h.rstrip("*") == H.TENANT_HEADER_PREFIX:
                p.append((f"{path}.allowedHeaders[{j}]", f"{h!r} would admit every tenant's headers"))
        strict = pol.get("strict", False)
        if not isinstance(strict, bool):
            p.append((f"{path}.strict", "expected true or false"))
        tenants[str(name)] = TenantPolicy(good, bool(strict))

    common = cfg.get("commonHeaders", list(DEFAULT_COMMON_HEADERS))
    if not isinstance(common, list) or len(common) > 64:
        p.append((f"{base}.commonHeaders", "expected a list of at most 64 header names"))
        common = []
    common = [h for j, h in enumerate(common) if _header_name(h, f"{base}.commonHeaders[{j}]", p, pattern=True)]

    q = cfg.get("qos") or {}
    contract_qos: dict = {}
    if not isinstance(q, dict):
        p.append((f"{base}.qos", "expected a mapping"))
        q = {}
    for k in q:
        if k not in ("tierClaim", "tiers", "priority", "defaultClass", "ceiling"):
            p.append((f"{base}.qos.{k}", "unknown field; expected tierClaim, tiers, priority, defaultClass, ceiling"))
    tiers = {}
    for t, c in (q.get("tiers") or {}).items():
        cls = _qos_class(c, f"{base}.qos.tiers.{t}", p)
        if cls:
            tiers[str(t)] = cls
    priority = dict(Q.LLM_PRIORITY_CLASSES)
    for v, c in (q.get("priority") or {}).items():
        cls = _qos_class(c, f"{base}.qos.priority.{v}", p)
        if cls:
            priority[str(v).lower()] = cls
    if len(tiers) > 16 or len(priority) > 16:
        p.append((f"{base}.qos", "at most 16 tiers and 16 priority values"))
    for k, attr in (("defaultClass", "default_class"), ("ceiling", "ceiling")):
        if k in q:
            cls = _qos_class(q[k], f"{base}.qos.{k}", p)
            if cls:
                contract_qos[attr] = cls
    tier_claim = q.get("tierClaim", DEFAULT_TIER_CLAIM)
    if not isinstance(tier_claim, str) or not tier_claim:
        p.append((f"{base}.qos.tierClaim", "must be a claim name"))

    errors = {}
    for k, v in (cfg.get("errorClasses") or {}).items():
        code = _status_code(k, f"{base}.errorClasses.{k}", p)
        if v not in ERROR_CLASSES:
            p.append((f"{base}.errorClasses.{k}", f"unknown error class {v!r}; expected one of {', '.join(ERROR_CLASSES)}"))
        elif code is not None:
            errors[code] = v
    http_errors = {}
    raw_http = cfg.get("httpErrorClasses") or {}
    if len(raw_http) > 16:
        p.append((f"{base}.httpErrorClasses", "at most 16 entries"))
    for k, v in raw_http.items():
        if not (str(k).isdigit() and 100 <= int(k) <= 599):
            p.append((f"{base}.httpErrorClasses.{k}", "expected an HTTP status code 100..599"))
        elif v not in ERROR_CLASSES:
            p.append((f"{base}.httpErrorClasses.{k}", f"unknown error class {v!r}; expected one of {', '.join(ERROR_CLASSES)}"))
        else:
            http_errors[int(k)] = v

    if p:
        raise ContractError(p)
    return HeaderContract(session_key=key, session_key_env=key_env, claims=claims, tenants=tenants, common_headers=common,
                          tier_claim=tier_claim, tiers=tiers, priority=priority, error_classes=errors,
                          http_error_classes=http_errors, **contract_qos)
