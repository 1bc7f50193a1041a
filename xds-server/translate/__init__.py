"""Translation of the mesh model into Envoy resources, as istiod does it.

`Translator` (translator.py) turns a MeshConfig and a proxy into every
resource that proxy should have, keyed by type URL (xds.model.type_urls)
then by name; it owns its cache. `translate()` is a one-off translation.
Everything translation reads is an argument: the config, the node, the
TranslateOptions (options.py) and the Overlay (overlay.py).
The HTTP filter chain and the contract of a filter module are in
http_filters.py; the per-config cache and incremental translation in
config_cache.py. This file only re-exports.
"""
from mcp26.xds.translate.config_cache import ConfigTranslation, endpoint_only_change, same_cluster_inputs
from mcp26.xds.translate.http_filters import CHAIN, FILTER_MODULES
from mcp26.xds.translate.phases import Phase
from mcp26.xds.translate.options import TranslateOptions
from mcp26.xds.translate.overlay import NO_OVERLAY, Overlay, WasmModule
from mcp26.xds.translate.translator import Translator, routing_key, translate

__all__ = ["Translator", "TranslateOptions", "Overlay", "NO_OVERLAY", "WasmModule", "translate", "routing_key",
           "ConfigTranslation", "endpoint_only_change", "same_cluster_inputs", "CHAIN", "FILTER_MODULES", "Phase"]
