"""What translation reads besides the config, the node and the options: the overlay.

The control plane owns one `Overlay` and replaces it whole when any part of it
changes (server.py); translation only reads the one it is given, so two servers
in one process, or a test beside a server, never see each other's.

  class_remaps      the decision loop's QoS class remaps in force, in priority order
                    (folded into the header-contract plugin's configuration: wasm_plugins.py)
  endpoint_weights  {cluster: {ADDRESS:PORT: weight}}, the decision loop's, laid over EDS
                    (clusters.with_endpoint_weights)
  wasm_modules      {url: WasmModule}: the bytes of the Wasm modules the config's
                    WasmPlugins name, read and checked when the config was loaded
                    (xds.wasm_modules), never during translation

Expiry is not read here: the server drops what expired and installs a new
overlay (scheduler_actions.py), and the Wasm filter stops a remap at its
`expires_at` by its own clock.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from mcp26.mesh.header_contract import ClassRemap


@dataclass(frozen=True)
class WasmModule:
    """One module's bytes and their SHA-256 (hex)."""
    sha256: str
    code: bytes = field(repr=False)


def endpoint_key(address: str, port: int) -> str:
    """How an endpoint is named here and in the admin API: the assignment's socket address."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _frozen(mapping) -> Mapping:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class Overlay:
    """Immutable: the mappings given are copied into read-only views."""
    class_remaps: tuple[ClassRemap, ...] = ()
    endpoint_weights: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    wasm_modules: Mapping[str, WasmModule] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "class_remaps", tuple(self.class_remaps))
        object.__setattr__(self, "endpoint_weights",
                           MappingProxyType({c: _frozen(w) for c, w in (self.endpoint_weights or {}).items()}))
        object.__setattr__(self, "wasm_modules", _frozen(self.wasm_modules))


NO_OVERLAY = Overlay()
