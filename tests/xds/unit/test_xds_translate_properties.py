"""Properties of translate() over generated VirtualServices (hypothesis).

Whatever valid mix of matches and actions a VirtualService holds, Envoy must
get: one action per route, unique domains per route configuration, every
routed cluster defined (the destinations here all exist), weights kept, and
one Envoy route per applicable Istio match, in order.
"""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.xds.translate import translate
from mcp26.xds.model.type_urls import CLUSTER, ROUTE
from mcp26.xds.model.node import ProxyNode

SUBSETS = ["v1", "v2", "v3"]
names = st.text(alphabet="abcdefghij-", min_size=1, max_size=8).map(lambda s: "x" + s)
string_match = st.one_of(
    st.builds(lambda v: {"exact": v}, names), st.builds(lambda v: {"prefix": v}, names),
    st.builds(lambda v: {"regex": v + ".*"}, names))
uri = st.one_of(st.builds(lambda v: {"exact": "/" + v}, names), st.builds(lambda v: {"prefix": "/" + v}, names),
                st.builds(lambda v: {"regex": "/" + v + "/[0-9]+"}, names))
match = st.fixed_dictionaries({}, optional={
    "uri": uri, "method": string_match, "headers": st.dictionaries(names, string_match, max_size=2),
    "withoutHeaders": st.dictionaries(names, st.one_of(string_match, st.just({})), max_size=2),
    "queryParams": st.dictionaries(names, string_match, max_size=2), "port": st.sampled_from([8080, 9090]),
    "ignoreUriCase": st.booleans()})
destination = st.builds(lambda s: {"host": "svc.mesh.local", "subset": s, "port": {"number": 80}},
                        st.sampled_from(SUBSETS))
weighted = st.lists(destination, min_size=1, max_size=3).flatmap(
    lambda ds: st.just([{"destination": d} for d in ds]) if len(ds) == 1 else
    st.lists(st.integers(1, 100), min_size=len(ds), max_size=len(ds)).map(
        lambda ws: [{"destination": d, "weight": w} for d, w in zip(ds, ws)]))
action = st.one_of(
    st.builds(lambda r: {"route": r}, weighted),
    st.builds(lambda r, t: {"route": r, "timeout": f"{t}ms", "retries": {"attempts": t % 4}}, weighted, st.integers(1, 5000)),
    st.builds(lambda r, p: {"route": r, "fault": {"delay": {"fixedDelay": "1s", "percentage": {"value": p}}}},
              weighted, st.floats(0, 100)),
    st.builds(lambda u: {"redirect": {"uri": "/" + u}}, names),
    st.builds(lambda s: {"directResponse": {"status": s}}, st.integers(200, 599)))
http_route = st.tuples(st.lists(match, max_size=3), action).map(
    lambda t: {**t[1], **({"match": t[0]} if t[0] else {})})


def mesh(http: list[dict], hosts: list[str]) -> MeshConfig:
    def res(kind, name, spec):
        return Resource("networking.istio.io/v1", kind, name, "default", spec, file="gen.yaml")
    return MeshConfig([
        res("Gateway", "gw", {"servers": [{"port": {"number": p, "name": f"http-{p}", "protocol": "HTTP"},
                                           "hosts": ["*"]} for p in (8080, 9090)]}),
        res("ServiceEntry", "svc", {"hosts": ["svc.mesh.local"], "resolution": "STATIC",
                                    "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
                                    "endpoints": [{"address": "127.0.0.1", "labels": {"version": s}} for s in SUBSETS]}),
        res("DestinationRule", "svc", {"host": "svc.mesh.local",
                                       "subsets": [{"name": s, "labels": {"version": s}} for s in SUBSETS]}),
        res("VirtualService", "vs", {"hosts": hosts, "gateways": ["gw"], "http": http}),
    ])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(http_route, min_size=1, max_size=6),
       st.lists(st.sampled_from(["a.example.com", "A.example.com", "*.example.com", "b.example.org", "*"]),
                min_size=1, max_size=3, unique=True))
def test_generated_virtual_services_translate_to_consistent_routes(http, hosts):
    snap = translate(mesh(http, hosts), ProxyNode("router~1~gw~default"))
    clusters = set(snap[CLUSTER])
    for port in (8080, 9090):
        rc = snap[ROUTE][f"http.{port}"]
        domains = [d.lower() for vh in rc.virtual_hosts for d in vh.domains]   # Envoy ignores case
        assert len(domains) == len(set(domains)), domains          # Envoy NACKs duplicates
        for vh in rc.virtual_hosts:
            expected = sum(len([m for m in h.get("match", [None]) if m is None or m.get("port", port) == port])
                           for h in http)
            assert len(vh.routes) == expected
            for r in vh.routes:
                assert r.WhichOneof("action") in ("route", "redirect", "direct_response")
                if r.WhichOneof("action") == "route":
                    which = r.route.WhichOneof("cluster_specifier")
                    if which == "cluster":
                        assert r.route.cluster in clusters
                    else:
                        assert which == "weighted_clusters"
                        assert all(c.name in clusters and c.weight.value > 0 for c in r.route.weighted_clusters.clusters)
