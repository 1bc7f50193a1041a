"""WasmPlugin (extensions.istio.io/v1alpha1) -> envoy.filters.http.wasm via ECDS.

Each WasmPlugin that selects the proxy becomes an HttpFilter whose config is
discovered over ADS (`config_discovery`), plus a TypedExtensionConfig of the
same name in the snapshot: changing a pluginConfig then pushes one ECDS
resource, and no listener drains.

Order, as Istio: each plugin goes in its `phase` (http_filters.py places the
phases: AUTHN-phase plugins before jwt_authn, the others after it); within a
phase the higher `priority` first, then namespace/name.

The module is read from `url` (file:// or a plain path), its SHA-256 checked
against `sha256`, and embedded inline: Envoy runs exactly the bytes that were
checked, wherever it runs. `failStrategy: FAIL_OPEN` -> failure_policy
FAIL_OPEN, otherwise FAIL_CLOSED.

A plugin named `mcp-header-contract` (pluginName) is the mesh's own filter:
its pluginConfig is validated and compiled by mesh.header_contract into the
JSON the C module reads, with RequestAuthentication outputClaimToHeaders
merged in; any other plugin gets its pluginConfig as JSON, verbatim.
"""
from __future__ import annotations

import hashlib
import json
import os
from urllib.parse import unquote, urlsplit

from google.protobuf import wrappers_pb2
from envoy.config.core.v3 import config_source_pb2, extension_pb2
from envoy.extensions.filters.http.wasm.v3 import wasm_pb2 as http_wasm
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm
from envoy.extensions.wasm.v3 import wasm_pb2

from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.mesh.diagnostics import ConfigError
from mcp26.mesh.header_contract import PLUGIN_NAME, parse_plugin_config
from mcp26.xds.model import type_urls
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.model.type_urls import Snapshot
from mcp26.xds.translate.phases import Phase
from mcp26.xds.translate.policy_scope import output_claims, selects

KIND = "WasmPlugin"
WASM_TYPE_URL = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
RUNTIME = "envoy.wasm.runtime.v8"
PHASES = ("AUTHN", "AUTHZ", "STATS", "UNSPECIFIED_PHASE")      # the spec's `phase` values, in chain order

_module_cache: dict[tuple, bytes] = {}


def module_path(url: str) -> str:
    """The local file a WasmPlugin url names (file:// or a path); other schemes are not fetched."""
    u = urlsplit(url)
    if u.scheme == "file":
        return unquote(u.path)
    if u.scheme == "":
        return url
    raise ValueError(f"url scheme {u.scheme!r} is not supported here (use file://)")


def read_module(url: str, sha256: str | None) -> bytes:
    """The module's bytes, checked against sha256 (cached by path, size, mtime)."""
    path = module_path(url)
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns, sha256)
    if key not in _module_cache:
        with open(path, "rb") as f:
            data = f.read()
        if sha256 and hashlib.sha256(data).hexdigest() != str(sha256).lower():
            raise ValueError(f"{path}: sha256 {hashlib.sha256(data).hexdigest()} does not match {sha256}")
        _module_cache[key] = data
    return _module_cache[key]


def applies(res: Resource, node: ProxyNode, port: int | None = None) -> bool:
    if (res.spec.get("type") or "HTTP") != "HTTP" or not selects(res, node):
        return False
    matches = res.spec.get("match") or []
    if port is not None and matches:
        ports = {p.get("number") for m in matches for p in (m.get("ports") or [])}
        if ports and port not in ports:
            return False
    return True


def _ordered(config: MeshConfig, node: ProxyNode, port: int | None, phases) -> list[Resource]:
    found = [r for r in config.of_kind(KIND) if applies(r, node, port)
             and (r.spec.get("phase") or "UNSPECIFIED_PHASE") in phases]
    return sorted(found, key=lambda r: (PHASES.index(r.spec.get("phase") or "UNSPECIFIED_PHASE"),
                                        -int(r.spec.get("priority") or 0), r.namespace, r.name))


def filter_name(res: Resource) -> str:
    return f"{res.namespace}.{res.name}"


def host_env_keys(res: Resource) -> list[str]:
    """Envoy environment variables the plugin's VM reads: the header contract's
    sessionKeyFrom.env (the key never enters the configuration, so no dump shows it)."""
    if res.spec.get("pluginName") != PLUGIN_NAME:
        return []
    return parse_plugin_config(res.spec.get("pluginConfig") or {}).host_env_keys


def plugin_configuration(res: Resource, config: MeshConfig, node: ProxyNode) -> str:
    """The JSON the module gets in proxy_on_configure."""
    cfg = res.spec.get("pluginConfig") or {}
    if res.spec.get("pluginName") == PLUGIN_NAME:
        contract = parse_plugin_config(cfg).with_claims(output_claims(config, node))
        from mcp26.xds.scheduler_actions import REMAPS     # the decision loop's remaps, with expiry
        remaps = REMAPS.active()
        return (contract.with_class_remaps(remaps) if remaps else contract).filter_json()
    return json.dumps(cfg, separators=(",", ":"), sort_keys=True)


def wasm_filter_config(res: Resource, config: MeshConfig, node: ProxyNode) -> http_wasm.Wasm:
    spec = res.spec
    try:
        code = read_module(spec["url"], spec.get("sha256"))
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError([res.diagnostic("spec.url", f"cannot load the Wasm module: {e}")]) from None
    name = filter_name(res)
    plugin = wasm_pb2.PluginConfig(
        name=name, root_id=spec.get("pluginName") or name,
        failure_policy=wasm_pb2.FAIL_OPEN if spec.get("failStrategy") == "FAIL_OPEN" else wasm_pb2.FAIL_CLOSED)
    # One VM per plugin and module: plugins never share a VM's memory.
    plugin.vm_config.vm_id = f"{name}@{hashlib.sha256(code).hexdigest()[:12]}"
    plugin.vm_config.runtime = RUNTIME
    plugin.vm_config.code.local.inline_bytes = code
    for env in (spec.get("vmConfig") or {}).get("env") or []:
        if env.get("valueFrom") == "HOST":
            plugin.vm_config.environment_variables.host_env_keys.append(env["name"])
        else:
            plugin.vm_config.environment_variables.key_values[env["name"]] = str(env.get("value", ""))
    for name in host_env_keys(res):
        if name not in plugin.vm_config.environment_variables.host_env_keys:
            plugin.vm_config.environment_variables.host_env_keys.append(name)
    plugin.configuration.Pack(wrappers_pb2.StringValue(value=plugin_configuration(res, config, node)))
    return http_wasm.Wasm(config=plugin)


def _ecds_filter(res: Resource) -> hcm.HttpFilter:
    f = hcm.HttpFilter(name=filter_name(res))
    cd = f.config_discovery
    cd.config_source.ads.SetInParent()
    cd.config_source.resource_api_version = config_source_pb2.V3
    cd.type_urls.append(WASM_TYPE_URL)
    return f


def http_filters(config: MeshConfig, node: ProxyNode, port: int, phase: Phase) -> list:
    """The ECDS-discovered Wasm filters of the plugins in `phase`, by priority."""
    if phase is Phase.PROTOCOL:
        return []
    return [_ecds_filter(r) for r in _ordered(config, node, port, (phase.value,))]


def typed_extension_config(res: Resource, config: MeshConfig, node: ProxyNode) -> extension_pb2.TypedExtensionConfig:
    tec = extension_pb2.TypedExtensionConfig(name=filter_name(res))
    tec.typed_config.Pack(wasm_filter_config(res, config, node))
    return tec


def static_http_filter(res: Resource, config: MeshConfig, node: ProxyNode) -> hcm.HttpFilter:
    """The same filter inline (for a bootstrap without ADS)."""
    f = hcm.HttpFilter(name=filter_name(res))
    f.typed_config.Pack(wasm_filter_config(res, config, node))
    return f


def resources(config: MeshConfig, node: ProxyNode) -> Snapshot:
    """The ECDS TypedExtensionConfig of every selected plugin."""
    out = {}
    for res in _ordered(config, node, None, PHASES):
        out[filter_name(res)] = typed_extension_config(res, config, node)
    return {type_urls.EXTENSION_CONFIG: out} if out else {}
