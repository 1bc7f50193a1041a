"""xDS type URLs, the order they are pushed in, and the snapshot shape (type URL -> name -> message)."""
from __future__ import annotations

LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"
ROUTE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
ENDPOINT = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
EXTENSION_CONFIG = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"  # ECDS
SECRET = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"

# Make-before-break: clusters and their endpoints before the listeners and
# routes that point at them.
PUSH_ORDER = (CLUSTER, ENDPOINT, EXTENSION_CONFIG, LISTENER, ROUTE, SECRET)

# A snapshot for one proxy: type URL -> resource name -> protobuf message.
Snapshot = dict  # dict[str, dict[str, google.protobuf.message.Message]]
