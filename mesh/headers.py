"""Header names of the L1-L7 layer contract, defined once for every part.

All names are lower case, as HTTP/2 and Envoy's header maps carry them.
"""

# L4 -> L5: the caller's verified identity, set by Envoy (never the client).
DOWNSTREAM_SERVICE_CLUSTER = "x-envoy-downstream-service-cluster"

# L6 session headers: set from verified JWT claims, readable by L7 routing,
# never changeable by it (x-mcp-session-sig covers them).
END_USER = "end-user"
TENANT = "x-mcp-tenant"
SESSION_SIG = "x-mcp-session-sig"

# QoS: what the client may ask for, and the class the mesh computed.
LLM_PRIORITY = "x-llm-priority"
QOS_CLASS = "x-mcp-qos-class"

# L4 -> L7: the TLS ALPN protocol the client offered first among those in
# mesh.qos.ALPN_CLASSES. Set by Envoy only (a gateway HTTPS listener has one
# filter chain per ALPN, matched on application_protocols, whose early header
# mutation removes a client's copy and sets it); the header contract reads it
# for the QoS class and strips it, so no client value is ever trusted.
DOWNSTREAM_ALPN = "x-mcp-downstream-alpn"

# L5: the error class derived from a gRPC status on responses.
ERROR_CLASS = "x-mcp-error-class"

# Headers L7 routing may match on but never set, add or remove (VirtualService
# header operations on them are rejected by mesh validation and by the
# admission policy in istio-manifests/admission/).
L7_READ_ONLY_HEADERS = (END_USER, TENANT, SESSION_SIG, QOS_CLASS)

# Per-tenant headers; only a tenant's own whitelisted ones pass.
TENANT_HEADER_PREFIX = "x-tenant-"

# Server-side timing and load reported by the inference backend.
QUEUE_TIME_US = "x-mcp-queue-time-us"
COMPUTE_TIME_US = "x-mcp-compute-time-us"
ORCA_LOAD_REPORT = "endpoint-load-metrics"

# gRPC-Web from a browser on another origin: what a VirtualService corsPolicy
# must allow (request headers gRPC-Web clients send) and expose (a
# trailers-only error carries grpc-status/grpc-message as headers).
GRPC_WEB_ALLOW_HEADERS = ("content-type", "x-grpc-web", "x-user-agent", "grpc-timeout")
GRPC_WEB_EXPOSE_HEADERS = ("grpc-status", "grpc-message", "grpc-status-details-bin")
