"""Translation of the mesh model into Envoy resources, as istiod does it.

The one entry point is `translate(config, node) -> Snapshot`: every resource
this proxy should have, keyed by type URL (xds_server.types) then by name.
"""
