"""proxy-config tables and the Envoy comparison, from config dumps in memory."""
import json

from mcp26.xds.explain import proxy_config as pc
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.translate import translate
from mcp26.xds.model.type_urls import CLUSTER, ENDPOINT, LISTENER, ROUTE
from google.protobuf import json_format
from mcp26.mesh.change_set import load_texts

from harness.paths import TEST_DATA

CONFIG = (TEST_DATA / "route_explain.yaml").read_text()      # the config test_route_explain.py explains


def _view():
    snap = translate(load_texts({"vs.yaml": CONFIG}),
                     ProxyNode("router~x~gw.shop~shop", namespace="shop", labels={"istio": "ingressgateway"}))
    short = {CLUSTER: "CDS", ENDPOINT: "EDS", LISTENER: "LDS", ROUTE: "RDS"}
    return {short[t]: {n: json_format.MessageToDict(m) for n, m in by.items()} for t, by in snap.items() if t in short}


def test_cluster_table_columns_as_istioctl():
    out = pc.render("clusters", _view()["CDS"]).splitlines()
    assert out[0].split() == ["SERVICE", "FQDN", "PORT", "SUBSET", "DIRECTION", "TYPE", "DESTINATION", "RULE"]
    assert any(r.split()[:5] == ["reviews.shop.svc.cluster.local", "9080", "v2", "outbound", "EDS"] for r in out[1:])
    # The DestinationRule the cluster was built from, read from istiod-style cluster metadata.
    assert all(r.split()[5] == "reviews.shop" for r in out[1:] if r.startswith("reviews."))


def test_listener_route_endpoint_tables():
    v = _view()
    lis = pc.render("listeners", v["LDS"])
    assert "127.0.0.1" in lis and "8080" in lis and "Route: http.8080" in lis
    routes = pc.render("routes", v["RDS"]).splitlines()
    assert routes[0].split()[:2] == ["NAME", "VHOST"]
    assert any("reviews.shop" in r and "/api*" in r for r in routes)
    eps = pc.render("endpoints", v["EDS"])
    assert "10.0.0.2:9080" in eps and "HEALTHY" in eps


def test_compare_flags_missing_extra_and_changed():
    mine = {"a": {"x": 1}, "b": {"x": 1}, "c": {"x": 1}}
    envoy = {"a": {"x": 1, "default": True}, "b": {"x": 2}, "d": {}}
    assert pc.compare(mine, envoy) == {"a": "same", "b": "differs", "c": "missing in Envoy", "d": "only in Envoy"}


def test_no_key_material_in_any_output():
    wasm = {"name": "hc", "typedConfig": {"config": {"configuration": {"value": json.dumps(
        {"sessionKey": "c2VjcmV0LWtleS1ieXRlcw==", "model": "m"})}}}}
    text = pc.render("listeners", {}, "json") + json.dumps(pc.redact(wasm))
    assert "c2VjcmV0" not in text and "<redacted>" in json.dumps(pc.redact(wasm))
    secret = {"name": "cert", "tlsCertificate": {"privateKey": {"inlineString": "-----BEGIN PRIVATE KEY-----"}}}
    for output in ("short", "json", "yaml"):
        out = pc.render("secret", {"cert": secret}, output)
        assert "PRIVATE" not in out and "cert" in out and "Cert Chain" in out


def test_envoy_dump_reads_only_dynamic_resources():
    dump = {"configs": [{"@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
                         "static_clusters": [{"cluster": {"name": "xds-grpc"}}],
                         "dynamic_active_clusters": [{"cluster": {"name": "outbound|1||a"}}]}]}
    assert list(pc.envoy_view_from_dump(dump)["CDS"]) == ["outbound|1||a"]
