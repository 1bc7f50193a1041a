"""Translation of the mesh model into Envoy resources, as istiod does it.

`Translator` (translator.py) turns a MeshConfig and a proxy into every
resource that proxy should have, keyed by type URL (xds_server.type_urls)
then by name; it owns its cache. `translate()` is a one-off translation.
The HTTP filter chain and the contract of a filter module are in
http_filters.py; the per-config cache and incremental translation in
config_cache.py. This file only re-exports.
"""
from xds_server.translate.config_cache import ConfigTranslation, endpoint_only_change, same_cluster_inputs
from xds_server.translate.http_filters import CHAIN, FILTER_MODULES
from xds_server.translate.phases import Phase
from xds_server.translate.translator import TranslateOptions, Translator, routing_key, translate

__all__ = ["Translator", "TranslateOptions", "translate", "routing_key", "ConfigTranslation",
           "endpoint_only_change", "same_cluster_inputs", "CHAIN", "FILTER_MODULES", "Phase"]
