"""Validators for RequestAuthentication (security.istio.io) and WasmPlugin
(extensions.istio.io), after istio/istio pkg/config/validation.

A WasmPlugin whose pluginName is the mesh's header contract gets its
pluginConfig checked by mesh.header_contract, so a bad whitelist, QoS class
or session key is rejected here, naming file:line and the field, before any
of it reaches Envoy.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Iterator
from urllib.parse import unquote, urlsplit

from mcp26.mesh import headers as H
from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.mesh.diagnostics import Diagnostic
from mcp26.mesh.header_contract import PLUGIN_NAME, ContractError, is_token, parse_plugin_config
from mcp26.mesh.validation import validator
from mcp26.mesh.validation.report import Report, schema_report
from mcp26.mesh.validation.schema import Enum, Map, Obj

SECURITY_VERSIONS = ("security.istio.io/v1", "security.istio.io/v1beta1")
EXTENSIONS_VERSIONS = ("extensions.istio.io/v1alpha1",)

SELECTOR = {"matchLabels": Map("string")}
TARGET_REF = Obj({"group": "string", "kind": "string", "name": "string", "namespace": "string"},
                 required=("kind", "name"))
JWT_HEADER = Obj({"name": "string", "prefix": "string"}, required=("name",))
CLAIM_TO_HEADER = Obj({"header": "string", "claim": "string"}, required=("header", "claim"))
JWT_RULE = Obj({
    "issuer": "string", "audiences": ["string"], "jwksUri": "string", "jwks": "string",
    "fromHeaders": [JWT_HEADER], "fromParams": ["string"], "fromCookies": ["string"],
    "outputPayloadToHeader": "string", "forwardOriginalToken": "bool",
    "outputClaimToHeaders": [CLAIM_TO_HEADER], "timeout": "duration",
    "spaceDelimitedClaims": ["string"],
}, required=("issuer",))
REQUEST_AUTHENTICATION = Obj({"selector": SELECTOR, "targetRef": TARGET_REF, "targetRefs": [TARGET_REF],
                              "jwtRules": [JWT_RULE]},
                             oneof=(("selector", "targetRef", "targetRefs"),))
WASM_PLUGIN = Obj({
    "selector": SELECTOR, "targetRef": TARGET_REF, "targetRefs": [TARGET_REF],
    "url": "string", "sha256": "string",
    "imagePullPolicy": Enum("UNSPECIFIED_POLICY", "IfNotPresent", "Always"),
    "imagePullSecret": "string", "verificationKey": "string",
    "pluginConfig": "any", "pluginName": "string",
    "phase": Enum("UNSPECIFIED_PHASE", "AUTHN", "AUTHZ", "STATS"),
    "priority": "int32",
    "failStrategy": Enum("FAIL_CLOSE", "FAIL_OPEN", "FAIL_RELOAD"),
    "vmConfig": {"env": [Obj({"name": "string", "valueFrom": Enum("INLINE", "HOST"), "value": "string"},
                             required=("name",))]},
    "match": [{"mode": Enum("UNDEFINED", "CLIENT", "SERVER", "CLIENT_AND_SERVER"),
               "ports": [{"number": "uint32"}]}],
    "type": Enum("UNSPECIFIED_PLUGIN_TYPE", "HTTP", "NETWORK"),
}, required=("url",), oneof=(("selector", "targetRef", "targetRefs"),))

# Headers the mesh itself sets; a claim may not be written into them by jwt_authn.
MESH_SET_HEADERS = (H.SESSION_SIG, H.QOS_CLASS, H.ERROR_CLASS, H.DOWNSTREAM_SERVICE_CLUSTER)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


# Istio's allowedTargetRefs (validatePolicyTargetReference), as Istio prints them.
ALLOWED_TARGET_REFS = (("core", "v1", "Service"), ("networking.istio.io", "v1", "ServiceEntry"),
                       ("gateway.networking.k8s.io", "v1", "Gateway"),
                       ("gateway.networking.k8s.io", "v1", "GatewayClass"))


def policy_target_ref(rep: Report, p: str, ref: dict) -> None:
    """Istio's validatePolicyTargetReference: a name, no namespace (no
    cross-namespace references), and a group/kind Istio can attach a policy to."""
    if not ref.get("name"):
        rep.error(f"{p}.name", "targetRef name must be set")
    if ref.get("namespace"):
        rep.error(f"{p}.namespace", "targetRef namespace must not be set; cross namespace referencing is not supported")
    group, kind = ref.get("group") or "", ref.get("kind") or ""
    if not any(kind == k and (group or "core") == g for g, _, k in ALLOWED_TARGET_REFS):
        allowed = " ".join(f"{g}/{v}/{k}" for g, v, k in ALLOWED_TARGET_REFS)
        rep.error(p, f"targetRef must be to one of [{allowed}] but was {group}/{kind}")


def _target_refs(rep: Report, spec: dict) -> None:
    if spec.get("targetRef"):
        policy_target_ref(rep, "spec.targetRef", spec["targetRef"])
    for i, ref in enumerate(spec.get("targetRefs") or []):
        policy_target_ref(rep, f"spec.targetRefs[{i}]", ref)
    for ref in ("targetRef", "targetRefs"):
        if spec.get(ref):
            rep.warn(f"spec.{ref}", f"{ref} is not translated by this control plane: the resource applies "
                                    "to no proxy (use selector.matchLabels)")


def _header_name(rep: Report, path: str, name) -> None:
    if not is_token(name):
        rep.error(path, f"invalid header name {name!r}: must be an RFC 7230 token")


@validator("RequestAuthentication")
def validate_request_authentication(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    rep, errs = schema_report(res, SECURITY_VERSIONS, REQUEST_AUTHENTICATION)
    ok = not errs.errors
    if ok:
        rep.workload_selector("spec.selector.matchLabels", (res.spec.get("selector") or {}).get("matchLabels"))
        _target_refs(rep, res.spec)
        for i, rule in enumerate(res.spec.get("jwtRules") or []):
            _jwt_rule(rep, f"spec.jwtRules[{i}]", rule)
    yield from rep.out


def _jwt_rule(rep: Report, p: str, rule: dict) -> None:
    if not rule.get("issuer"):
        rep.error(f"{p}.issuer", "issuer must be set")
    for j, a in enumerate(rule.get("audiences") or []):
        if not a:
            rep.error(f"{p}.audiences[{j}]", "audience must be non-empty string")
    uri, jwks = rule.get("jwksUri"), rule.get("jwks")
    if not uri and not jwks:
        rep.error(p, "one of jwks or jwksUri must be set: there is no other way to get the signing keys here")
    if uri:
        u = urlsplit(uri)
        if u.scheme not in ("http", "https") or not u.hostname:
            rep.error(f"{p}.jwksUri", f"invalid jwksUri {uri!r}: must be an http or https URL with a host")
        else:
            try:
                u.port
            except ValueError:
                rep.error(f"{p}.jwksUri", f"invalid port in jwksUri {uri!r}")
    if jwks:
        try:
            keys = json.loads(jwks).get("keys")
            if not isinstance(keys, list) or not keys:
                raise ValueError("no keys")
        except (ValueError, AttributeError):
            rep.error(f"{p}.jwks", "jwks must be a JSON Web Key Set ({\"keys\": [...]}) with at least one key")
    for j, h in enumerate(rule.get("fromHeaders") or []):
        _header_name(rep, f"{p}.fromHeaders[{j}].name", h.get("name"))
    for j, q in enumerate(rule.get("fromParams") or []):
        if not q:
            rep.error(f"{p}.fromParams[{j}]", "location query must be non-empty string")
    seen = set()
    for j, c in enumerate(rule.get("outputClaimToHeaders") or []):
        hp = f"{p}.outputClaimToHeaders[{j}]"
        name = c.get("header") or ""
        _header_name(rep, f"{hp}.header", name)
        if not c.get("claim"):
            rep.error(f"{hp}.claim", "claim must be non-empty string")
        if name.lower() in MESH_SET_HEADERS:
            rep.error(f"{hp}.header", f"{name} is set by the mesh itself; a claim cannot be written into it")
        if name.lower() in seen:
            rep.error(f"{hp}.header", f"duplicate header {name!r} in outputClaimToHeaders")
        seen.add(name.lower())
    if rule.get("outputPayloadToHeader"):
        _header_name(rep, f"{p}.outputPayloadToHeader", rule["outputPayloadToHeader"])
    if rule.get("timeout") is not None:
        rep.duration(f"{p}.timeout", rule["timeout"])
    if rule.get("spaceDelimitedClaims"):
        rep.warn(f"{p}.spaceDelimitedClaims", "spaceDelimitedClaims is not translated by this control plane: "
                                              "only Envoy's defaults (scope, permission) are split on spaces")


def _module_file(url: str) -> str | None:
    u = urlsplit(url)
    if u.scheme == "file":
        return unquote(u.path)
    return url if u.scheme == "" else None


@validator("WasmPlugin")
def validate_wasm_plugin(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    rep, errs = schema_report(res, EXTENSIONS_VERSIONS, WASM_PLUGIN)
    ok = not errs.errors
    if ok:
        _wasm_plugin(rep, res)
    yield from rep.out


def _read_module(rep: Report, path: str, sha: str | None) -> None:
    """This control plane reads the module itself (and sends it inline): it must be there."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        rep.error("spec.url", f"cannot read the Wasm module {path}: {e.strerror}")
        return
    if data[:4] != b"\0asm":
        rep.error("spec.url", f"{path} is not a WebAssembly module")
    elif sha and hashlib.sha256(data).hexdigest() != sha:
        rep.error("spec.sha256", f"does not match {path} (sha256 {hashlib.sha256(data).hexdigest()})")


def _wasm_plugin(rep: Report, res: Resource) -> None:
    spec = res.spec
    rep.workload_selector("spec.selector.matchLabels", (spec.get("selector") or {}).get("matchLabels"))
    _target_refs(rep, spec)
    url = spec.get("url") or ""
    sha = spec.get("sha256")
    if sha and not _SHA256.match(sha):     # "" is proto3's unset, as istiod reads it
        rep.error("spec.sha256", "sha256 must be 64 lower-case hex digits")
        sha = None
    path = _module_file(url)
    if not url:
        rep.error("spec.url", "url field needs to be set")
    elif urlsplit(url).scheme not in ("", "file", "http", "https", "oci"):
        rep.error("spec.url", f"url contains unsupported scheme: {urlsplit(url).scheme}")
    elif urlsplit(url).scheme == "":
        # Istio reads a url without a scheme as an OCI image reference (oci://); this control
        # plane reads it as a local path. Say so: on a cluster the two disagree, and with
        # FAIL_CLOSE Istio's reading blocks the workload until a registry serves that image.
        rep.warn("spec.url", f"url {url!r} has no scheme: Istio reads it as oci://{url}; "
                             "write file:// for a local module")
        _read_module(rep, path, sha)
    elif path is None:
        # Istio accepts it (the agent fetches the module): valid on a cluster,
        # so a warning, and the rest is still checked as Istio checks it.
        rep.warn("spec.url", f"url scheme {urlsplit(url).scheme!r} is not fetched here (use file://): "
                             "valid for Istio, and the mcp-mesh control plane rejects it")
    else:
        _read_module(rep, path, sha)
    if not spec.get("sha256"):          # (a malformed one is an error above, not this warning)
        rep.warn("spec.sha256", "no sha256: the module loaded is not pinned")
    # The CRD: imagePullSecret and pluginName at least 1 character when set.
    for k, most in (("imagePullSecret", 253), ("pluginName", 256)):
        if k in spec and not spec[k]:
            rep.error(f"spec.{k}", f"spec.{k} in body should be at least 1 chars long")
        elif len(spec.get(k) or "") > most:
            rep.error(f"spec.{k}", f"{k} field must be less than {most if k == 'imagePullSecret' else 255} "
                                   "characters long")
    names: set[str] = set()
    for i, env in enumerate((spec.get("vmConfig") or {}).get("env") or []):
        ep = f"spec.vmConfig.env[{i}]"
        name = env.get("name")
        if not name:
            rep.error(f"{ep}.name", "spec.vmConfig.env invalid")
        elif name in names:   # Istio's validateWasmPluginVMConfig
            rep.error(f"{ep}.name", "duplicate env")
        names.add(name)
        if (env.get("valueFrom") or "INLINE") != "INLINE" and env.get("value"):
            rep.error(f"{ep}.value", "value may only be set when valueFrom is INLINE")
    if (spec.get("type") or "HTTP") not in ("HTTP", "UNSPECIFIED_PLUGIN_TYPE"):
        rep.error("spec.type", "only HTTP plugins are translated by this control plane")
    if spec.get("pluginName") == PLUGIN_NAME:
        _header_contract(rep, res)


def _header_contract(rep: Report, res: Resource) -> None:
    spec = res.spec
    if (spec.get("phase") or "UNSPECIFIED_PHASE") == "AUTHN":
        rep.error("spec.phase", "the header contract reads the claims jwt_authn verified, so it must run after it "
                                "(phase AUTHZ, STATS or unset), not in AUTHN")
    if spec.get("failStrategy") == "FAIL_OPEN":
        rep.error("spec.failStrategy", "the header contract must fail closed: FAIL_OPEN would let spoofed "
                                       "session headers through when the module fails")
    try:
        contract = parse_plugin_config(spec.get("pluginConfig"), base="spec.pluginConfig")
    except ContractError as e:
        for field_path, message in e.problems:
            rep.error(field_path, message)
        return
    # sessionKeyFrom.env comes from Envoy's own environment (host_env_keys); an
    # inline vmConfig.env of that name would put a key in key_values, i.e. the dump.
    for i, env in enumerate((spec.get("vmConfig") or {}).get("env") or []):
        if (contract.session_key_env and isinstance(env, dict) and env.get("name") == contract.session_key_env
                and env.get("valueFrom") != "HOST"):
            rep.error(f"spec.vmConfig.env[{i}]", f"{env.get('name')} is spec.pluginConfig.sessionKeyFrom.env: it comes "
                                                 "from Envoy's environment (valueFrom: HOST), an inline value would "
                                                 "show in Envoy's config dump")


def module_sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()

