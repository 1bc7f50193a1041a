"""WasmPlugin (extensions.istio.io/v1alpha1) -> envoy.filters.http.wasm via ECDS.

Each WasmPlugin that selects the proxy becomes an HttpFilter whose config is
discovered over ADS (`config_discovery`), plus a TypedExtensionConfig of the
same name in the snapshot: changing a pluginConfig then pushes one ECDS
resource, and no listener drains.

Order, as Istio: each plugin goes in its `phase` (http_filters.py places the
phases: AUTHN-phase plugins before jwt_authn, the others after it); within a
phase the higher `priority` first, then namespace/name.

The module's bytes are embedded inline: Envoy runs exactly the bytes that
were checked, wherever it runs. They were read from `url` and checked against
`sha256` when the config was loaded (xds.wasm_modules); translation takes
them from the Overlay it is given and reads no file. `failStrategy:
FAIL_OPEN` -> failure_policy FAIL_OPEN, otherwise FAIL_CLOSED.

A plugin named `mcp-header-contract` (pluginName) is the mesh's own filter:
its pluginConfig is validated and compiled by mesh.header_contract into the
JSON the C module reads, with RequestAuthentication outputClaimToHeaders
merged in, and the decision loop's class remaps (Overlay.class_remaps); any
other plugin gets its pluginConfig as JSON, verbatim.
"""
from __future__ import annotations

import json

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
from mcp26.xds.translate.overlay import Overlay
from mcp26.xds.translate.phases import Phase
from mcp26.xds.translate.policy_scope import output_claims, selects

KIND = "WasmPlugin"
WASM_TYPE_URL = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
RUNTIME = "envoy.wasm.runtime.v8"
PHASES = ("AUTHN", "AUTHZ", "STATS", "UNSPECIFIED_PHASE")      # the spec's `phase` values, in chain order

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


def plugin_configuration(res: Resource, config: MeshConfig, node: ProxyNode, overlay: Overlay) -> str:
    """The JSON the module gets in proxy_on_configure."""
    cfg = res.spec.get("pluginConfig") or {}
    if res.spec.get("pluginName") == PLUGIN_NAME:
        contract = parse_plugin_config(cfg).with_claims(output_claims(config, node))
        remaps = overlay.class_remaps
        return (contract.with_class_remaps(remaps) if remaps else contract).filter_json()
    return json.dumps(cfg, separators=(",", ":"), sort_keys=True)


def wasm_filter_config(res: Resource, config: MeshConfig, node: ProxyNode, overlay: Overlay) -> http_wasm.Wasm:
    spec = res.spec
    url = spec.get("url")
    module = overlay.wasm_modules.get(url) if isinstance(url, str) else None
    if module is None:
        raise ConfigError([res.diagnostic("spec.url", "cannot load the Wasm module: it was not read with the "
                                                      "config (xds.wasm_modules.WasmModuleStore.load)")])
    name = filter_name(res)
    plugin = wasm_pb2.PluginConfig(
        name=name, root_id=spec.get("pluginName") or name,
        failure_policy=wasm_pb2.FAIL_OPEN if spec.get("failStrategy") == "FAIL_OPEN" else wasm_pb2.FAIL_CLOSED)
    # One VM per plugin and module: plugins never share a VM's memory.
    plugin.vm_config.vm_id = f"{name}@{module.sha256[:12]}"
    plugin.vm_config.runtime = RUNTIME
    plugin.vm_config.code.local.inline_bytes = module.code
    for env in (spec.get("vmConfig") or {}).get("env") or []:
        if env.get("valueFrom") == "HOST":
            plugin.vm_config.environment_variables.host_env_keys.append(env["name"])
        else:
            plugin.vm_config.environment_variables.key_values[env["name"]] = str(env.get("value", ""))
    for name in host_env_keys(res):
        if name not in plugin.vm_config.environment_variables.host_env_keys:
            plugin.vm_config.environment_variables.host_env_keys.append(name)
    plugin.configuration.Pack(wrappers_pb2.StringValue(value=plugin_configuration(res, config, node, overlay)))
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


def typed_extension_config(res: Resource, config: MeshConfig, node: ProxyNode,
                           overlay: Overlay) -> extension_pb2.TypedExtensionConfig:
    tec = extension_pb2.TypedExtensionConfig(name=filter_name(res))
    tec.typed_config.Pack(wasm_filter_config(res, config, node, overlay))
    return tec


def static_http_filter(res: Resource, config: MeshConfig, node: ProxyNode, overlay: Overlay) -> hcm.HttpFilter:
    """The same filter inline (for a bootstrap without ADS)."""
    f = hcm.HttpFilter(name=filter_name(res))
    f.typed_config.Pack(wasm_filter_config(res, config, node, overlay))
    return f


def resources(config: MeshConfig, node: ProxyNode, overlay: Overlay) -> Snapshot:
    """The ECDS TypedExtensionConfig of every selected plugin."""
    out = {}
    for res in _ordered(config, node, None, PHASES):
        out[filter_name(res)] = typed_extension_config(res, config, node, overlay)
    return {type_urls.EXTENSION_CONFIG: out} if out else {}
