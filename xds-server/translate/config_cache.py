"""What a Translator keeps per MeshConfig (ConfigTranslation), and how two
configs compare for incremental translation: an endpoint-only change
re-translates only EDS; equal cluster inputs keep CDS and EDS."""
from __future__ import annotations

import threading

from mcp26.mesh.resources import MeshConfig, same_except_endpoints
from mcp26.xds.translate.clusters import reassign
from mcp26.xds.translate.index import EXPORTABLE, MeshIndex, build_index, exported_to
from mcp26.xds.translate.route_configs import gateway_route_config, scheduling_policies
from mcp26.xds.translate.routes import RouteContext


# Endpoint data: what feeds only EDS (ClusterLoadAssignments). WorkloadEntries
# reach translation only as endpoints of the ServiceEntries selecting them.
_ENDPOINT_KINDS = ("WorkloadEntry",)


# What clusters and assignments are built from (build_clusters reads only the
# index's services and DestinationRules): with these unchanged, CDS and EDS are too.
_CLUSTER_KINDS = ("ServiceEntry", "DestinationRule", "WorkloadEntry")


def same_cluster_inputs(old: MeshConfig, new: MeshConfig) -> bool:
    """Whether every resource clusters are built from is equal (in order) in both."""
    a, b = old.of_kind(*_CLUSTER_KINDS), new.of_kind(*_CLUSTER_KINDS)
    return len(a) == len(b) and all(
        x is y or (same_except_endpoints(x, y) and (x.kind != "ServiceEntry" or x.spec == y.spec))
        for x, y in zip(a, b))


def endpoint_only_change(old: MeshConfig, new: MeshConfig) -> bool:
    """Whether `new` differs from `old` at most in endpoint data: WorkloadEntries
    (added, removed, changed) and ServiceEntries' spec.endpoints, every other
    resource equal and in the same order (the first ServiceEntry of a host
    keeps its ports and resolution). Whether the changed endpoints feed only
    EDS is decided per service by clusters.reassign (STATIC services only)."""
    a = [r for r in old if r.kind not in _ENDPOINT_KINDS]
    b = [r for r in new if r.kind not in _ENDPOINT_KINDS]
    return len(a) == len(b) and all(same_except_endpoints(x, y) for x, y in zip(a, b))


class ConfigTranslation:
    """Everything derived from one MeshConfig, shared by all its proxies:
    its index, the namespace views, clusters per (options, view), route
    configurations per routing key, listeners per (routing key, bind, filters).
    Built from the previous config's translation where an endpoint-only
    change or equal cluster inputs allow (incremental EDS, as istiod)."""

    def __init__(self, config: MeshConfig, previous: "ConfigTranslation | None" = None):
        self.config = config           # held while cached: its id() cannot be reused meanwhile
        self.index: MeshIndex = build_index(config)
        # exportTo, and DestinationRules for one host in several namespaces,
        # make what a proxy sees depend on its namespace; without them (the
        # usual case) every namespace shares the one full view.
        self.per_namespace = (any(r.spec.get("exportTo") is not None for r in config.of_kind(*EXPORTABLE))
                              or self.index.destination_rules_by_namespace)
        self.views: dict = {}          # namespace -> MeshIndex of what it sees
        self.clusters: dict = {}       # (ClusterOptions, view) -> (clusters, assignments)
        self.routes: dict = {}         # routing key -> (route configs, listener plan)
        self.listeners: dict = {}      # (routing key, bind, HTTP filters) -> listeners
        self.lock = threading.Lock()
        # gateway route configuration key -> (the resources it was built from, RouteConfiguration)
        self.gateway_routes: dict = {}
        self.previous_routes: dict = {}   # `previous`'s, reused where those resources are equal
        self.derived = False           # True: built from `previous` by an endpoint-only change
        self.clusters_reused = False   # True: clusters and assignments are `previous`'s
        if previous is not None and previous.per_namespace == self.per_namespace:
            if endpoint_only_change(previous.config, config):
                self.derived = self._derive(previous)
            if not self.derived and same_cluster_inputs(previous.config, config):
                # e.g. only VirtualServices or Gateways changed: CDS and EDS are kept
                # (the same messages); route configurations are built again, but a
                # gateway's is reused when nothing it reads changed (gateway_route_config).
                with previous.lock:
                    self.clusters = dict(previous.clusters)
                    self.previous_routes = dict(previous.gateway_routes)
                self.clusters_reused = True

    def gateway_route_config(self, idx: MeshIndex, port: int, servers: list, base: RouteContext,
                             name: str = ""):
        """route_configs.gateway_route_config, reused from the previous config when
        everything it reads is equal there: the services and DestinationRules
        (same_cluster_inputs, else there is nothing to reuse from), the servers'
        Gateways, the VirtualServices bound to them (in order) and the ones they
        delegate to; the proxy's labels and namespace are in the key."""
        key = (idx.proxy_namespace, port, name, tuple((s.gateway.namespace, s.gateway.name, s.index) for s in servers),
               tuple(sorted(base.labels.items())), base.namespace)
        found = self.gateway_routes.get(key)
        if found is not None:
            return found[1]
        deps = _route_inputs(idx, servers, base.namespace)
        before = self.previous_routes.get(key)
        if before is not None and len(before[0]) == len(deps) and all(
                a is b or (a is not None and b is not None and same_except_endpoints(a, b))
                for a, b in zip(before[0], deps)):
            rc = before[1]
        else:
            rc = gateway_route_config(idx, port, servers, base, name=name)
        self.gateway_routes[key] = (deps, rc)
        return rc

    def _derive(self, previous: "ConfigTranslation") -> bool:
        """Incremental EDS, as istiod pushes it: after an endpoint-only change keep
        `previous`'s clusters, route configurations and listeners (the same
        message objects, so their versions do not change and Delta sends only
        the changed assignments) and rebuild only the assignments of services
        whose endpoints changed. Everything or nothing: False (and nothing
        kept) when some changed endpoints feed more than EDS."""
        with previous.lock:
            clusters = dict(previous.clusters)
            routes, listeners = dict(previous.routes), dict(previous.listeners)
            views = dict(previous.views)
            gateway_routes = dict(previous.gateway_routes)
        derived = {}
        for (copts, view), (by_name, assignments) in clusters.items():
            old_idx = previous.index if view is None else views.get(view)
            if old_idx is None:
                return False
            new_idx = self.view(view)[0] if view is not None else self.index
            new_assignments = reassign(old_idx, new_idx, assignments)
            if new_assignments is None:
                self.views.clear()
                return False
            derived[(copts, view)] = (by_name, new_assignments)
        self.clusters, self.routes, self.listeners = derived, routes, listeners
        self.gateway_routes = gateway_routes      # built from Gateways and VirtualServices: unchanged
        return True


    def view(self, namespace: str) -> tuple[MeshIndex, str | None]:
        """The index of what a proxy in `namespace` sees, and its cache key."""
        if not self.per_namespace:
            return self.index, None
        idx = self.views.get(namespace)
        if idx is None:
            visible = [r for r in self.config if exported_to(r, namespace)]
            idx = self.views[namespace] = build_index(MeshConfig(visible), proxy_namespace=namespace)
        return idx, namespace


def _route_inputs(idx: MeshIndex, servers: list, namespace: str) -> list:
    """The resources a gateway's route configuration is built from, besides the
    services and DestinationRules: the servers' Gateways, then each bound
    VirtualService followed by the VirtualServices (or None) its routes delegate to,
    then the proxy namespace's L7SchedulingPolicies (their routing fields)."""
    out, refs = list(scheduling_policies(idx, namespace)), set()
    for s in servers:
        refs.add(f"{s.gateway.namespace}/{s.gateway.name}")
        if not any(g is s.gateway for g in out):
            out.append(s.gateway)
    for vs in idx.virtual_services:
        if not refs & idx.vs_gateways(vs):
            continue
        out.append(vs)
        for http in vs.spec.get("http") or []:
            if isinstance(http, dict) and http.get("delegate"):
                ref = http["delegate"] if isinstance(http["delegate"], dict) else {}
                out.append(idx.virtual_service(str(ref.get("namespace") or vs.namespace), str(ref.get("name") or "")))
    return out
