"""A change next to a large config costs what the change costs: the control
plane's loader re-validates only the resources of re-parsed files, and an
endpoint-only change re-translates only the ClusterLoadAssignments. Both must
give exactly what the full path gives."""
import os

import pytest

from mcp26.mesh.diagnostics import ConfigError
from mcp26.mesh.change_set import load_config
from mcp26.demo.stack.control_plane import remove_config, write_config
from mcp26.xds.incremental_load import IncrementalLoader

SERVICE = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: {name}, namespace: default}}
spec:
  hosts: [{name}.mesh.local]
  ports: [{{number: 80, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints:
  - {{address: 127.0.0.1, ports: {{http: {p1}}}, labels: {{version: v1}}}}
  - {{address: 127.0.0.1, ports: {{http: {p2}}}, labels: {{version: {v2}}}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: {name}, namespace: default}}
spec:
  host: {name}.mesh.local
  subsets:
  - {{name: v1, labels: {{version: v1}}}}
  - {{name: v2, labels: {{version: v2}}}}
"""

VIRTUAL_SERVICE = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: {name}, namespace: default}}
spec:
  hosts: [{name}.example.com]
  gateways: [gw]
  http:
  - match: [{{uri: {{regex: "{regex}"}}}}]
    {fault}route:
    - {{destination: {{host: {host}, subset: {subset}}}}}
"""

GATEWAY = """apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: gw, namespace: default}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8080, name: http, protocol: HTTP}
    hosts: ["*"]
"""


def service(name, p1=9001, p2=9002, v2="v2"):
    return SERVICE.format(name=name, p1=p1, p2=p2, v2=v2)


def route(name, host=None, subset="v1", regex="/a.*", fault=""):
    return VIRTUAL_SERVICE.format(name=name, host=host or f"{name}.mesh.local", subset=subset, regex=regex, fault=fault)


def outcome(load, directory):
    """What a load gives, comparably: the resources and warnings, or the errors."""
    try:
        config = load(directory)
    except ConfigError as e:
        return "rejected", list(e.diagnostics)
    return "ok", [(r.ref, r.file, r.line, r.spec, r.lines) for r in config], list(config.warnings)


def edit_matches_a_full_load(loader, directory, name, text, what):
    """Write `name` (None: remove it); what the loader gives must be what a full load gives."""
    if text is None:
        remove_config(directory, name)
    else:
        write_config(directory, name, text)
    got = outcome(loader, directory)
    assert got == outcome(load_config, directory), what
    return got


# (what the edit does, file, text or None to remove)
EDITS = [
    ("an endpoint port", "svc-a.yaml", service("svc-a", p1=9101)),
    ("a subset that selects nothing: a warning", "svc-b.yaml", service("svc-b", v2="v9")),
    ("an invalid regex: a validation error", "route-a.yaml", route("svc-a", regex="(unclosed")),
    ("an unrelated good file while the set is bad", "svc-c.yaml", service("svc-c", p1=9201)),
    ("the regex fixed", "route-a.yaml", route("svc-a")),
    ("a fault without an error type: a warning", "route-c.yaml",
     route("svc-c", fault="fault: {abort: {percentage: {value: 1}}}\n    ")),
    ("a missing subset: an analyzer error", "route-b.yaml", route("svc-b", subset="v7")),
    ("that subset fixed", "route-b.yaml", route("svc-b")),
    ("malformed YAML", "svc-a.yaml", "kind: [unclosed\n"),
    ("an endpoint port, YAML fixed", "svc-a.yaml", service("svc-a", p1=9102)),
    ("a duplicate host in a second file", "dup.yaml", service("svc-a", p1=9103).replace("name: svc-a", "name: dup")),
    ("the duplicate removed", "dup.yaml", None),
    ("an unknown kind", "odd.yaml", "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: s}\nspec: {}\n"),
    ("the unknown kind removed", "odd.yaml", None),
    ("lines shift above an unchanged resource", "route-c.yaml",
     "# a comment\n\n" + route("svc-c", fault="fault: {abort: {percentage: {value: 1}}}\n    ")),
]


def test_incremental_validation_matches_a_full_load_over_a_sequence_of_edits(tmp_path):
    d = str(tmp_path)
    write_config(d, "gateway.yaml", GATEWAY)
    for name in ("svc-a", "svc-b", "svc-c"):
        write_config(d, f"{name}.yaml", service(name))
        write_config(d, f"route-{name[-1]}.yaml", route(name))
    loader = IncrementalLoader()
    first = outcome(loader, d)
    assert first[0] == "ok" and first == outcome(load_config, d)
    assert loader.validation.validated == 10         # everything, the first time
    seen = set()
    for what, name, text in EDITS:
        got = edit_matches_a_full_load(loader, d, name, text, what)
        seen.add(got[0] if got[0] == "rejected" else ("ok", bool(got[2])))
        if loader.parsed and got[0] == "ok":
            # only what was re-parsed is validated again
            assert loader.validation.validated <= 2 * loader.parsed, what
    assert seen == {"rejected", ("ok", True), ("ok", False)}   # the sequence covered all three


WORKLOAD_ENTRY = """apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: vm-1, namespace: default}}
spec:
  address: {address}
  labels: {{app: vm, version: v1}}
"""


def test_an_endpoint_change_reruns_only_the_analyzers_that_read_endpoints(tmp_path):
    """mesh.analyze.AnalysisCache: what the analyzers that read no endpoints found is kept
    across an endpoint-only change, never across any other; the outcome equals a full load."""
    from mcp26.mesh.analyze import ANALYZERS, READS_ENDPOINTS
    d = str(tmp_path)
    write_config(d, "gateway.yaml", GATEWAY)
    for name in ("svc-a", "svc-b"):
        write_config(d, f"{name}.yaml", service(name))
        write_config(d, f"route-{name[-1]}.yaml", route(name))
    write_config(d, "we.yaml", WORKLOAD_ENTRY.format(address="10.0.0.7"))
    loader = IncrementalLoader()
    loader(d)
    kept = len(ANALYZERS) - len(READS_ENDPOINTS)
    for what, name, text, reused in [
            ("an endpoint port", "svc-a.yaml", service("svc-a", p1=9101), kept),
            ("endpoint labels: the v2 subset now selects nothing", "svc-b.yaml", service("svc-b", v2="v9"), kept),
            ("a route to an unknown host", "route-a.yaml", route("svc-a", host="nowhere.mesh.local"), 0),
            ("endpoint labels back", "svc-b.yaml", service("svc-b"), kept),
            ("a WorkloadEntry's address", "we.yaml", WORKLOAD_ENTRY.format(address="10.0.0.8"), kept),
            ("a comment shifts the lines of a service", "svc-a.yaml", "# moved\n" + service("svc-a", p1=9101), 0)]:
        got = edit_matches_a_full_load(loader, d, name, text, what)
        assert loader.analysis.reused == reused, what
        if "selects nothing" in what:
            assert any(w.code == "IST0173" for w in got[2]), got[2]


def test_a_route_edit_reruns_the_per_route_analyzers_on_that_route_only(tmp_path):
    """mesh.analyze.PER_VIRTUAL_SERVICE: while only VirtualServices change, the findings on
    the routes left as they were are kept; a change to anything else (a rule, the gateway,
    a service) runs them on every route again. Each outcome equals a full load's."""
    from mcp26.mesh.analyze import ANALYZERS, PER_VIRTUAL_SERVICE, READS_ENDPOINTS
    assert PER_VIRTUAL_SERVICE and not PER_VIRTUAL_SERVICE & READS_ENDPOINTS
    per = len(PER_VIRTUAL_SERVICE)
    whole = len(ANALYZERS) - len(READS_ENDPOINTS)     # an endpoint-only change keeps these whole
    d = str(tmp_path)
    write_config(d, "gateway.yaml", GATEWAY)
    for name in ("svc-a", "svc-b", "svc-c"):
        write_config(d, f"{name}.yaml", service(name))
        write_config(d, f"route-{name[-1]}.yaml", route(name, subset="v7" if name == "svc-c" else "v1"))
    loader = IncrementalLoader()
    assert outcome(loader, d)[0] == "rejected"       # route-c's subset v7: found on the first load
    for what, name, text, kept in [
            ("another route edited: route-c's finding kept, not found again", "route-a.yaml",
             route("svc-a", regex="/b.*"), 2 * per),
            ("the bad route fixed", "route-c.yaml", route("svc-c"), 2 * per),
            ("a route to an unknown host: a warning", "route-b.yaml", route("svc-b", host="nowhere.mesh.local"), 2 * per),
            ("a route added", "route-d.yaml", route("svc-a", subset="v2").replace("name: svc-a", "name: svc-d"), 3 * per),
            ("a route removed", "route-d.yaml", None, 3 * per),
            ("the rule's v1 subset renamed: every route again", "svc-a.yaml",
             service("svc-a").replace("- {name: v1,", "- {name: v1b,"), 0),
            ("an endpoint port: analyzers kept whole", "svc-b.yaml", service("svc-b", p1=9301), -whole),
            ("then a route: the per-route findings carried across", "route-b.yaml", route("svc-b"), 2 * per),
            ("the gateway gone: every route again", "gateway.yaml", None, 0)]:
        got = edit_matches_a_full_load(loader, d, name, text, what)
        if kept < 0:
            assert (loader.analysis.reused, loader.analysis.reused_vs) == (-kept, 0), what
        else:
            assert (loader.analysis.reused, loader.analysis.reused_vs) == (0, kept), what
        if "finding kept" in what:
            assert got[0] == "rejected" and any(x.resource == "VirtualService/default/svc-c" for x in got[1])
        if "every route again" in what:
            assert got[0] == "rejected", what          # a route to the old subset / gateway: IST0101


def test_only_changed_resources_are_validated_again(tmp_path):
    d = str(tmp_path)
    write_config(d, "gateway.yaml", GATEWAY)
    for i in range(20):
        write_config(d, f"svc-{i}.yaml", service(f"svc-{i}"))
    loader = IncrementalLoader()
    loader(d)
    assert loader.validation.validated == 41
    loader(d)
    assert loader.validation.validated == 0
    write_config(d, "svc-3.yaml", service("svc-3", p1=9300))
    loader(d)
    assert (loader.parsed, loader.validation.validated) == (1, 2)     # that file's ServiceEntry and rule


def test_a_resource_made_invalid_is_caught_after_caching(tmp_path):
    """The cache must not keep a resource's old (clean) result once its file changes."""
    d = str(tmp_path)
    write_config(d, "gateway.yaml", GATEWAY)
    write_config(d, "svc-a.yaml", service("svc-a"))
    write_config(d, "route-a.yaml", route("svc-a"))
    loader = IncrementalLoader()
    loader(d)
    write_config(d, "route-a.yaml", route("svc-a", regex="(unclosed"))
    with pytest.raises(ConfigError) as e:
        loader(d)
    [diag] = e.value.diagnostics
    assert (os.path.basename(diag.file), diag.resource) == ("route-a.yaml", "VirtualService/default/svc-a")
    assert diag.field.startswith("spec.http[0].match[0].uri") and diag.line > 0


# -- translation: an endpoint-only change re-translates only EDS ---------------

from mcp26.mesh.resources import MeshConfig
from mcp26.mesh.parse import parse_documents  # noqa: E402
from mcp26.xds.translate import Translator  # noqa: E402
from mcp26.xds.cache import SnapshotCache  # noqa: E402
from mcp26.xds.model.type_urls import CLUSTER, ENDPOINT, LISTENER, ROUTE
from mcp26.xds.model.node import ProxyNode  # noqa: E402

GW_NODE = ProxyNode("router~1~gw~default", labels={"istio": "ingressgateway"})
SIDECAR = ProxyNode("sidecar~10.0.0.1~app.default~default.svc.cluster.local", labels={"app": "client"})
GRPC = ProxyNode("grpc-client", kind="grpc")
NODES = (GW_NODE, SIDECAR, GRPC)

SELECTED = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: pool, namespace: default}
spec:
  hosts: [pool.mesh.local]
  ports: [{number: 81, name: http, protocol: HTTP}]
  resolution: STATIC
  workloadSelector: {labels: {app: pool}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: pool, namespace: default}
spec:
  host: pool.mesh.local
  subsets:
  - {name: fast, labels: {tier: fast}}
"""
WORKLOAD = """apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: {name}, namespace: default, labels: {{app: pool}}}}
spec: {{address: {address}, labels: {{tier: {tier}}}, ports: {{http: 9500}}}}
"""
DNS = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: ext, namespace: default}}
spec:
  hosts: [ext.example.org]
  ports: [{{number: 443, name: tls, protocol: TLS}}]
  resolution: DNS
  endpoints: [{{address: {address}}}]
"""


def _files(**override):
    files = {"gateway.yaml": GATEWAY, "svc-a.yaml": service("svc-a"), "svc-b.yaml": service("svc-b"),
             "route-a.yaml": route("svc-a"), "route-b.yaml": route("svc-b"), "pool.yaml": SELECTED,
             "we-1.yaml": WORKLOAD.format(name="we-1", address="10.1.0.1", tier="fast"),
             "we-2.yaml": WORKLOAD.format(name="we-2", address="10.1.0.2", tier="slow"),
             "dns.yaml": DNS.format(address="a.example.org")}
    files.update(override)
    return MeshConfig([r for name, text in files.items() if text is not None
                       for r in parse_documents(text, name)])


def _serialized(snapshot) -> dict:
    return {t: {n: m.SerializeToString(deterministic=True) for n, m in by.items()} for t, by in snapshot.items()}


def _derived(translator, config) -> bool:
    return translator.cached(config).derived


def _translate_after(before, after):
    """Translate `before` then `after` (as the control plane does, one change
    set after the other) and, from nothing, `after` alone."""
    incremental, fresh = Translator(), Translator()
    old = {n.id: incremental.translate(before, n) for n in NODES}
    new = {n.id: incremental.translate(after, n) for n in NODES}
    derived = _derived(incremental, after)
    full = {n.id: fresh.translate(after, n) for n in NODES}
    assert not _derived(fresh, after)
    return old, new, full, derived


ENDPOINT_ONLY = {
    "a STATIC ServiceEntry's endpoint port": {"svc-a.yaml": service("svc-a", p1=9901)},
    "an endpoint's labels move it out of a subset": {"svc-b.yaml": service("svc-b", v2="v1")},
    "a WorkloadEntry's address": {"we-1.yaml": WORKLOAD.format(name="we-1", address="10.1.0.9", tier="fast")},
    "a WorkloadEntry's labels move it into a subset": {"we-2.yaml": WORKLOAD.format(name="we-2", address="10.1.0.2", tier="fast")},
    "a WorkloadEntry added": {"we-3.yaml": WORKLOAD.format(name="we-3", address="10.1.0.3", tier="fast")},
    "a WorkloadEntry removed": {"we-1.yaml": None},
}


@pytest.mark.parametrize("what", sorted(ENDPOINT_ONLY))
def test_an_endpoint_only_change_rebuilds_only_the_assignments(what):
    before, after = _files(), _files(**ENDPOINT_ONLY[what])
    old, new, full, derived = _translate_after(before, after)
    assert derived, what
    for node in NODES:
        assert _serialized(new[node.id]) == _serialized(full[node.id]), (what, node.kind)
        # everything but EDS is the very same message: same bytes, same versions
        for t in (CLUSTER, LISTENER, ROUTE):
            assert new[node.id][t].keys() == old[node.id][t].keys()
            assert all(new[node.id][t][n] is m for n, m in old[node.id][t].items()), (what, node.kind, t)
        changed = {n for n, m in new[node.id][ENDPOINT].items()
                   if m.SerializeToString(deterministic=True) != old[node.id][ENDPOINT][n].SerializeToString(deterministic=True)}
        assert changed, (what, node.kind)      # and the assignments did change
        # the assignments of every other service are the very same messages
        hosts = {n.rsplit("|", 1)[-1] for n in changed}
        untouched = [n for n in new[node.id][ENDPOINT] if n.rsplit("|", 1)[-1] not in hosts]
        assert untouched and all(new[node.id][ENDPOINT][n] is old[node.id][ENDPOINT][n] for n in untouched)


NOT_ENDPOINT_ONLY = {
    "a service port": {"svc-a.yaml": service("svc-a").replace("number: 80", "number: 82")},
    "a subset's labels": {"svc-b.yaml": service("svc-b").replace("{version: v2}}\n", "{version: v3}}\n")},
    "a DNS service's endpoints (inline in its Cluster)": {"dns.yaml": DNS.format(address="b.example.org")},
    "an endpoint change together with a route change": {"svc-a.yaml": service("svc-a", p1=9901),
                                                         "route-a.yaml": route("svc-a", regex="/b.*")},
    "a WorkloadEntry moving a NONE service's endpoints": {
        "pool.yaml": SELECTED.replace("resolution: STATIC", "resolution: NONE"),
        "we-1.yaml": None},
}


@pytest.mark.parametrize("what", sorted(NOT_ENDPOINT_ONLY))
def test_a_change_that_feeds_more_than_eds_takes_the_full_path(what):
    before, after = _files(), _files(**NOT_ENDPOINT_ONLY[what])
    old, new, full, derived = _translate_after(before, after)
    assert not derived, what
    for node in NODES:
        assert _serialized(new[node.id]) == _serialized(full[node.id]), (what, node.kind)


def test_after_an_endpoint_change_only_eds_versions_change_and_delta_sends_only_that_assignment():
    translator = Translator()
    cache = SnapshotCache(translator.translate)
    before = _files()
    cache.install(before, "g1", cache.build(before, "g1", NODES))
    old = cache.peek(GW_NODE)
    after = _files(**{"svc-a.yaml": service("svc-a", p1=9901)})
    cache.install(after, "g2", cache.build(after, "g2", NODES))
    new = cache.peek(GW_NODE)
    assert _derived(translator, after)
    for t in old.type_urls():
        versions = {n: r.version for n, r in old.of_type(t).items()}
        now = {n: r.version for n, r in new.of_type(t).items()}
        differ = {n for n in now if now[n] != versions.get(n)}
        if t == ENDPOINT:
            assert differ == {"outbound|80||svc-a.mesh.local", "outbound|80|v1|svc-a.mesh.local"}
        else:
            assert differ == set(), t
            assert all(new.of_type(t)[n] is r for n, r in old.of_type(t).items())   # packed once
    held = old.selection(ENDPOINT, True, set(), ("*",))
    send, removed = new.diff(held, new.selection(ENDPOINT, True, set(), ("*",)))
    assert {r.name for r in send} == {"outbound|80||svc-a.mesh.local", "outbound|80|v1|svc-a.mesh.local"}
    assert removed == []
    held = old.selection(CLUSTER, True, set(), ("*",))
    assert new.diff(held, new.selection(CLUSTER, True, set(), ("*",))) == ([], [])


def _reused(translator, config) -> bool:
    return translator.cached(config).clusters_reused


ROUTES_ONLY = {
    "a VirtualService's match": {"route-a.yaml": route("svc-a", regex="/b.*")},
    "a VirtualService added": {"route-c.yaml": route("svc-c", host="svc-b.mesh.local")},
    "a Gateway's port": {"gateway.yaml": GATEWAY.replace("8080", "8081")},
}
CLUSTERS_TOO = {
    "a DestinationRule's traffic policy": {"svc-a.yaml": service("svc-a") + "  trafficPolicy: {loadBalancer: {simple: RANDOM}}\n"},
    "a route and an endpoint": {"route-a.yaml": route("svc-a", regex="/b.*"), "svc-a.yaml": service("svc-a", p1=9901)},
    "a WorkloadEntry and a route": {"route-a.yaml": route("svc-a", regex="/b.*"), "we-1.yaml": None},
}


@pytest.mark.parametrize("what", sorted(ROUTES_ONLY) + sorted(CLUSTERS_TOO))
def test_clusters_are_kept_when_nothing_they_are_built_from_changed(what):
    before, after = _files(), _files(**{**ROUTES_ONLY, **CLUSTERS_TOO}[what])
    old, new, full, derived = _translate_after(before, after)
    translator = Translator()
    translator.translate(before, GW_NODE)
    translator.translate(after, GW_NODE)
    reused = _reused(translator, after)
    assert not derived and reused == (what in ROUTES_ONLY), what
    for node in NODES:
        assert _serialized(new[node.id]) == _serialized(full[node.id]), (what, node.kind)
        for t in (CLUSTER, ENDPOINT):
            same = all(new[node.id][t].get(n) is m for n, m in old[node.id][t].items())
            assert same == (what in ROUTES_ONLY), (what, node.kind, t)
    if what in ROUTES_ONLY:                  # and the gateway's routes or listeners did change
        assert _serialized(new[GW_NODE.id])[ROUTE] != _serialized(old[GW_NODE.id])[ROUTE] \
            or _serialized(new[GW_NODE.id])[LISTENER] != _serialized(old[GW_NODE.id])[LISTENER], what


GATEWAY_2 = GATEWAY.replace("name: gw,", "name: gw2,").replace("8080", "9090")
ROOT = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: root, namespace: default}
spec:
  hosts: [root.example.com]
  gateways: [gw2]
  http:
  - match: [{uri: {prefix: /api}}]
    delegate: {name: child, namespace: default}
"""
CHILD = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: child, namespace: default}}
spec:
  http:
  - match: [{{uri: {{prefix: /api/{path}}}}}]
    route:
    - {{destination: {{host: svc-b.mesh.local, subset: {subset}}}}}
"""


def _two_gateways(**override):
    files = {"gateway-2.yaml": GATEWAY_2, "root.yaml": ROOT, "child.yaml": CHILD.format(path="x", subset="v1")}
    files.update(override)
    return _files(**files)


@pytest.mark.parametrize("what, change, rebuilt", [
    ("a route on gw", {"route-a.yaml": route("svc-a", regex="/b.*")}, {"http.8080"}),
    ("the child gw2's root delegates to", {"child.yaml": CHILD.format(path="y", subset="v2")}, {"http.9090"}),
    ("gw2 itself", {"gateway-2.yaml": GATEWAY_2.replace('"*"', '"other.example.net"')}, {"http.9090"}),
    ("a DestinationRule both read", {"svc-b.yaml": service("svc-b") + "  trafficPolicy: {loadBalancer: "
                                     "{consistentHash: {httpHeaderName: x-user}}}\n"}, {"http.8080", "http.9090"}),
])
def test_a_gateway_route_configuration_is_rebuilt_only_when_what_it_reads_changed(what, change, rebuilt):
    before, after = _two_gateways(), _two_gateways(**change)
    translator = Translator()
    old = translator.translate(before, GW_NODE)
    new = translator.translate(after, GW_NODE)
    full = Translator().translate(after, GW_NODE)
    assert _serialized(new) == _serialized(full), what
    assert set(old[ROUTE]) == {"http.8080", "http.9090"}
    fresh = {n for n, rc in new[ROUTE].items() if rc is not old[ROUTE][n]}
    assert fresh == rebuilt, what
    assert all(_serialized(new)[ROUTE][n] != _serialized({ROUTE: old[ROUTE]})[ROUTE][n] for n in rebuilt), what
