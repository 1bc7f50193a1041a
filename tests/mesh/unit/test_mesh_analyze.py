"""Cross-resource analysis (istioctl analyze codes): what blocks a push, what only warns."""
import os

import pytest

from mcp26.mesh.diagnostics import ConfigError
from mcp26.mesh.change_set import load_config, load_texts
from mcp26.manifests import EXAMPLES
from harness.paths import checkout_examples

EXAMPLES = str(EXAMPLES)


def vs(name, hosts, routes, gateways=None, namespace="bookinfo"):
    gw = f"  gateways: {gateways}\n" if gateways else ""
    return (f"apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata:\n  name: {name}\n"
            f"  namespace: {namespace}\nspec:\n  hosts: {hosts}\n{gw}  http:\n{routes}")


def dr(name, host, subsets, namespace="bookinfo"):
    subs = "".join(f"  - {{name: {s}, labels: {{version: {s}}}}}\n" for s in subsets)
    return (f"apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata:\n  name: {name}\n"
            f"  namespace: {namespace}\nspec:\n  host: {host}\n  subsets:\n{subs}")


def gateway(name, hosts, port=80, namespace="bookinfo", selector="ingressgateway"):
    return (f"apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata:\n  name: {name}\n"
            f"  namespace: {namespace}\nspec:\n  selector: {{istio: {selector}}}\n  servers:\n"
            f"  - port: {{number: {port}, name: http-{name}, protocol: HTTP}}\n    hosts: {hosts}\n")


def se(name, host, versions, namespace="bookinfo"):
    eps = "".join(f"  - {{address: 10.0.0.{i + 1}, labels: {{version: {v}}}}}\n" for i, v in enumerate(versions))
    return (f"apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata:\n  name: {name}\n"
            f"  namespace: {namespace}\nspec:\n  hosts: [{host}]\n  location: MESH_INTERNAL\n"
            f"  resolution: STATIC\n  ports: [{{number: 9080, name: http, protocol: HTTP}}]\n  endpoints:\n{eps}")


ROUTE_V3 = "  - route:\n    - destination: {host: reviews, subset: v3}\n"
REVIEWS_SE = se("reviews", "reviews.bookinfo.svc.cluster.local", ["v1", "v2", "v3"])


def errors_of(texts):
    with pytest.raises(ConfigError) as exc:
        load_texts(texts)
    return exc.value.diagnostics


def test_bookinfo_example_is_clean(tmp_path):
    config = load_config(str(checkout_examples(tmp_path)))
    kinds = {r.kind for r in config}
    assert {"DestinationRule", "Gateway", "ServiceEntry", "VirtualService", "WorkloadEntry"} <= kinds
    assert [str(d) for d in config.warnings] == []
    # end-user: jason -> v2 is what the reviews VirtualService says.
    reviews = next(r for r in config if r.kind == "VirtualService" and r.name == "reviews")
    first = reviews.spec["http"][0]
    assert first["match"][0]["headers"]["end-user"] == {"exact": "jason"}
    assert first["route"][0]["destination"]["subset"] == "v2"


def test_subset_no_destination_rule_defines_blocks_the_push():
    diags = errors_of({"a.yaml": vs("reviews", "[reviews]", ROUTE_V3) + "---\n" + dr("reviews", "reviews", ["v1", "v2"])
                       + "---\n" + REVIEWS_SE})
    assert len(diags) == 1
    d = diags[0]
    assert (d.code, d.file, d.line, d.resource, d.field) == (
        "IST0101", "a.yaml", 10, "VirtualService/bookinfo/reviews", "spec.http[0].route[0].destination.subset")
    assert d.message == 'Referenced host+subset in destinationrule not found: "reviews+v3"'
    assert str(d) == ("a.yaml:10: error IST0101: VirtualService/bookinfo/reviews: spec.http[0].route[0].destination.subset: "
                      'Referenced host+subset in destinationrule not found: "reviews+v3"')


def test_subset_with_no_destination_rule_at_all():
    diags = errors_of({"a.yaml": vs("reviews", "[reviews]", ROUTE_V3) + "---\n" + REVIEWS_SE})
    assert [d.code for d in diags] == ["IST0101"]


def test_short_and_full_host_names_resolve_alike():
    # The DestinationRule names the FQDN, the VirtualService the short name: the same service.
    config = load_texts({"a.yaml": vs("reviews", "[reviews]", ROUTE_V3) + "---\n"
                         + dr("reviews", "reviews.bookinfo.svc.cluster.local", ["v3"]) + "---\n" + REVIEWS_SE})
    assert [d for d in config.warnings if d.severity != "info"] == []


def test_short_name_in_another_namespace_is_another_service():
    # `reviews` in namespace other means reviews.other.svc.cluster.local.
    diags = errors_of({"a.yaml": vs("reviews", "[reviews]", ROUTE_V3) + "---\n"
                       + dr("reviews", "reviews", ["v3"], namespace="other") + "---\n" + REVIEWS_SE})
    assert [d.code for d in diags] == ["IST0101"]


def test_mirror_subset_is_checked_too():
    routes = ("  - route:\n    - destination: {host: reviews, subset: v1}\n"
              "    mirror: {host: reviews, subset: v9}\n")
    diags = errors_of({"a.yaml": vs("reviews", "[reviews]", routes) + "---\n" + dr("reviews", "reviews", ["v1"])
                       + "---\n" + REVIEWS_SE})
    assert [(d.code, d.field) for d in diags] == [("IST0101", "spec.http[0].mirror.subset")]


def test_wildcard_destination_rule_supplies_subsets():
    config = load_texts({"a.yaml": vs("reviews", "[reviews]", ROUTE_V3) + "---\n"
                         + dr("all", "\"*.bookinfo.svc.cluster.local\"", ["v3"]) + "---\n" + REVIEWS_SE})
    assert all(d.code != "IST0101" for d in config.warnings)


@pytest.mark.parametrize("ref", ["bookinfo-gw", "bookinfo/bookinfo-gw", "bookinfo-gw.bookinfo.svc.cluster.local"])
def test_gateway_reference_forms_resolve(ref):
    texts = {"a.yaml": vs("front", "[bookinfo.example.com]", "  - route:\n    - destination: {host: reviews}\n",
                          gateways=f"[{ref}]")
             + "---\n" + gateway("bookinfo-gw", '["bookinfo.example.com"]') + "---\n" + REVIEWS_SE}
    config = load_texts(texts)
    assert not [d for d in config.warnings if d.code == "IST0101"]


@pytest.mark.parametrize("ref", ["missing-gw", "other/bookinfo-gw"])
def test_gateway_not_found_blocks_the_push(ref):
    texts = {"a.yaml": vs("front", "[bookinfo.example.com]", "  - route:\n    - destination: {host: reviews}\n",
                          gateways=f"[{ref}]")
             + "---\n" + gateway("bookinfo-gw", '["bookinfo.example.com"]') + "---\n" + REVIEWS_SE}
    diags = errors_of(texts)
    assert [(d.code, d.field, d.line) for d in diags] == [("IST0101", "spec.gateways[0]", 8)]
    assert diags[0].message == f'Referenced gateway not found: "{ref}"'


def test_two_virtual_services_for_one_host_on_the_mesh_block_the_push():
    route = "  - route:\n    - destination: {host: reviews, subset: v1}\n"
    texts = {"a.yaml": vs("reviews-a", "[reviews]", route), "b.yaml": vs("reviews-b", "[reviews.bookinfo.svc.cluster.local]", route),
             "c.yaml": dr("reviews", "reviews", ["v1"]) + "---\n" + REVIEWS_SE}
    diags = errors_of(texts)
    assert sorted((d.code, d.file, d.field) for d in diags) == [
        ("IST0109", "a.yaml", "spec.hosts[0]"), ("IST0109", "b.yaml", "spec.hosts[0]")]
    assert "The VirtualServices bookinfo/reviews-a,bookinfo/reviews-b associated with mesh gateway define the " \
           "same host reviews.bookinfo.svc.cluster.local" in diags[0].message


def test_same_host_on_the_same_gateway_blocks_but_on_different_gateways_does_not():
    route = "  - route:\n    - destination: {host: reviews}\n"
    gws = gateway("gw-a", '["*.example.com"]') + "---\n" + gateway("gw-b", '["*.example.com"]', port=8080)
    same = {"a.yaml": vs("a", "[shop.example.com]", route, gateways="[gw-a]"),
            "b.yaml": vs("b", "[shop.example.com]", route, gateways="[gw-a]"), "g.yaml": gws + "---\n" + REVIEWS_SE}
    assert {d.code for d in errors_of(same)} == {"IST0109"}
    apart = dict(same, **{"b.yaml": vs("b", "[shop.example.com]", route, gateways="[gw-b]")})
    assert load_texts(apart)


def test_host_unknown_to_the_registry_warns_but_loads():
    config = load_texts({"a.yaml": vs("ratings", "[ratings]", "  - route:\n    - destination: {host: ratings}\n")})
    [w] = [d for d in config.warnings if d.code == "IST0101"]
    assert (w.severity, w.field, w.line) == ("warning", "spec.http[0].route[0].destination.host", 10)
    assert w.message == 'Referenced host not found: "ratings"'


def test_virtual_service_host_the_gateway_does_not_serve_warns():
    texts = {"a.yaml": vs("front", "[shop.example.com]", "  - route:\n    - destination: {host: reviews}\n",
                          gateways="[gw]") + "---\n" + gateway("gw", '["bookinfo.example.com"]') + "---\n" + REVIEWS_SE}
    config = load_texts(texts)
    assert [(d.code, d.severity) for d in config.warnings] == [("IST0132", "warning")]


def test_gateways_on_one_workload_and_port_with_overlapping_hosts_conflict():
    texts = {"g.yaml": gateway("gw-a", '["*.example.com"]') + "---\n" + gateway("gw-b", '["shop.example.com"]')}
    diags = errors_of(texts)
    assert sorted((d.code, d.resource) for d in diags) == [
        ("IST0145", "Gateway/bookinfo/gw-a"), ("IST0145", "Gateway/bookinfo/gw-b")]
    # Another selector or another port is another listener: no conflict.
    assert load_texts({"g.yaml": gateway("gw-a", '["*.example.com"]') + "---\n"
                       + gateway("gw-b", '["shop.example.com"]', selector="egressgateway")})
    assert load_texts({"g.yaml": gateway("gw-a", '["*.example.com"]') + "---\n"
                       + gateway("gw-b", '["shop.example.com"]', port=8080)})


def test_subset_selecting_no_endpoint_warns():
    texts = {"a.yaml": dr("reviews", "reviews", ["v1", "v4"]) + "---\n" + REVIEWS_SE}
    config = load_texts(texts)
    [w] = [d for d in config.warnings if d.code == "IST0173"]
    assert (w.severity, w.field, w.resource) == ("warning", "spec.subsets[1].labels", "DestinationRule/bookinfo/reviews")


def test_workload_entries_picked_by_selector_are_endpoints():
    we = ("apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {name: r4, namespace: bookinfo}\n"
          "spec: {address: 10.0.0.9, labels: {app: reviews, version: v4}}\n")
    sel = ("apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: reviews, namespace: bookinfo}\n"
           "spec:\n  hosts: [reviews.bookinfo.svc.cluster.local]\n  resolution: STATIC\n"
           "  ports: [{number: 9080, name: http, protocol: HTTP}]\n  workloadSelector: {labels: {app: reviews}}\n")
    config = load_texts({"a.yaml": dr("reviews", "reviews", ["v4"]) + "---\n" + sel + "---\n" + we})
    assert not [d for d in config.warnings if d.code == "IST0173"]


def test_analysis_waits_for_valid_resources():
    # A broken VirtualService reports its validation error, not a cascade of analysis findings.
    bad = vs("reviews", "[reviews]", "  - route:\n    - destination: {host: reviews, subset: v9}\n      weight: -1\n")
    diags = errors_of({"a.yaml": bad})
    assert [d.field for d in diags] == ["spec.http[0].route[0].weight"]


def test_one_name_defined_twice_blocks_the_push():
    route = "  - route:\n    - destination: {host: reviews}\n"
    diags = errors_of({"a.yaml": vs("reviews", "[reviews]", route), "b.yaml": vs("reviews", "[ratings]", route)})
    [d] = diags
    assert (d.file, d.line, d.field, d.resource) == ("b.yaml", 4, "metadata.name", "VirtualService/bookinfo/reviews")
    assert d.message == "duplicate VirtualService bookinfo/reviews: also defined at a.yaml:1"


def test_only_the_first_destination_rule_for_a_host_applies():
    texts = {"a.yaml": dr("reviews-a", "reviews", ["v1"]), "b.yaml": dr("reviews-b", "reviews.bookinfo.svc.cluster.local", ["v3"]),
             "c.yaml": REVIEWS_SE + "---\n" + vs("reviews", "[reviews]", ROUTE_V3)}
    diags = errors_of(texts)
    assert [(d.code, d.file) for d in diags] == [("IST0101", "c.yaml")]   # v3 is only in the ignored rule
    ok = load_texts(dict(texts, **{"c.yaml": REVIEWS_SE}))
    [w] = [d for d in ok.warnings if d.field == "spec.host"]
    assert (w.file, w.severity) == ("b.yaml", "warning") and "already applies to host reviews.bookinfo" in w.message


def test_delegate_to_a_missing_virtual_service_blocks_the_push():
    root = vs("root", "[reviews]", "  - match: [{uri: {prefix: /r}}]\n    delegate: {name: reviews-routes}\n")
    child = ("apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews-routes, namespace: bookinfo}\n"
             "spec:\n  http:\n  - route: [{destination: {host: reviews, subset: v1}}]\n")
    texts = {"root.yaml": root, "dr.yaml": dr("reviews", "reviews", ["v1"]) + "---\n" + REVIEWS_SE}
    diags = errors_of(texts)
    assert [(d.code, d.field, d.message) for d in diags] == [
        ("IST0101", "spec.http[0].delegate", 'Referenced virtualservice not found: "bookinfo/reviews-routes"')]
    assert load_texts(dict(texts, **{"child.yaml": child}))


def test_destination_port_the_service_does_not_expose_blocks_the_push():
    route = "  - route:\n    - destination: {host: reviews, port: {number: 9999}}\n"
    diags = errors_of({"a.yaml": vs("reviews", "[reviews]", route) + "---\n" + REVIEWS_SE})
    assert [(d.code, d.field, d.message) for d in diags] == [
        ("IST0101", "spec.http[0].route[0].destination.port.number", 'Referenced host:port not found: "reviews:9999"')]


def test_gateway_route_to_a_multi_port_service_must_name_the_port():
    two_ports = REVIEWS_SE.replace("ports: [{number: 9080, name: http, protocol: HTTP}]",
                                   "ports: [{number: 9080, name: http, protocol: HTTP}, {number: 9090, name: grpc, protocol: GRPC}]")
    route = "  - route:\n    - destination: {host: reviews}\n"
    texts = {"a.yaml": vs("front", "[shop.example.com]", route, gateways="[gw]") + "---\n"
             + gateway("gw", '["shop.example.com"]') + "---\n" + two_ports}
    assert [d.code for d in errors_of(texts)] == ["IST0112"]
    # Naming the port, or routing inside the mesh (each listener port has its own routes), is fine.
    assert load_texts({"a.yaml": texts["a.yaml"].replace("{host: reviews}", "{host: reviews, port: {number: 9090}}")})
    assert load_texts({"a.yaml": vs("reviews", "[reviews]", route) + "---\n" + two_ports})
