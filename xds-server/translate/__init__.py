"""Translation of the mesh model into Envoy resources, as istiod does it.

The one entry point is `translate(config, node, options) -> Snapshot`: every
resource this proxy should have, keyed by type URL (xds_server.types) then by
name. It is pure (no I/O) and shares work between proxies of the same shape.

Seam protocol (other parts add HTTP filters and resources without editing
this package's core): each seam module -- `authn` (jwt_authn from
RequestAuthentication), `wasm_plugins` (the Wasm header-contract filter from
WasmPlugin, via ECDS) and `grpc_web` (the gRPC-Web filter) -- exposes

    http_filters(config: MeshConfig, node: ProxyNode, port: int) -> list[HttpFilter]
        HttpFilter messages (envoy.extensions.filters.network.
        http_connection_manager.v3.HttpFilter) for the HTTP connection manager
        serving `port` (a Gateway server port; for proxyless gRPC the
        service port of the API listener).
    resources(config: MeshConfig, node: ProxyNode) -> Snapshot
        extra resources merged into the node's snapshot (a JWKS cluster, the
        ECDS TypedExtensionConfig, ...). A name clash with a translated
        resource is an error, never a silent overwrite.

The HCM chain is, in order: authn, wasm_plugins, grpc_web, then cors, fault,
router (the router always last). Seams must be pure and deterministic
functions of (config, node, port): their output is cached with the rest.
"""
