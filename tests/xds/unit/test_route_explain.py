"""route explain without sockets: Envoy's matching rules on hand-built messages,
and explanations of a small translated config traced to file:line."""
import pytest
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2

from harness.paths import TEST_DATA
from mcp26.mesh.change_set import load_texts
from mcp26.xds.explain import envoy_match as em
from mcp26.xds.explain.route_explain import ExplainError, explain, parse_header, proxy_for


def _rc(*vhosts):
    out = route_pb2.RouteConfiguration(name="t")
    for name, domains in vhosts:
        out.virtual_hosts.add(name=name, domains=domains)
    return out


@pytest.mark.parametrize("host,expected", [
    ("api.example.com", "exact"), ("x.api.example.com", "long-suffix"), ("b.example.com", "suffix"),
    ("example.com", "default"), ("foo.bar", "prefix"), ("FOO.org", "prefix"), ("api.example.com:80", "port"),
])
def test_virtual_host_precedence(host, expected):
    config = _rc(("default", ["*"]), ("suffix", ["*.example.com"]), ("long-suffix", ["*.api.example.com"]),
                 ("prefix", ["foo.*"]), ("exact", ["api.example.com"]), ("port", ["api.example.com:80"]))
    vh, _ = em.select_virtual_host(config, host)
    assert vh.name == expected


def test_wildcard_never_matches_empty():
    vh, why = em.select_virtual_host(_rc(("s", ["*.example.com"])), ".example.com")
    assert vh is None and "no virtual host" in why


def _route(**match):
    r = rc.Route()
    for k, v in match.items():
        if k == "headers":
            r.match.headers.extend(v)
        elif k == "case_sensitive":
            r.match.case_sensitive.value = v
        elif k == "safe_regex":
            r.match.safe_regex.regex = v
        else:
            setattr(r.match, k, v)
    return r


def _req(path="/", **headers):
    return em.Request("h", path, headers.pop("method", "GET"), {k.replace("_", "-"): [v] for k, v in headers.items()})


def test_paths():
    assert em.check_route(_route(prefix="/api"), _req("/api/x")).matched
    assert not em.check_route(_route(path="/api"), _req("/api/x")).matched
    assert em.check_route(_route(path="/api"), _req("/api?x=1")).matched
    assert em.check_route(_route(safe_regex="/v[0-9]+"), _req("/v2?q")).matched
    assert not em.check_route(_route(safe_regex="/v[0-9]+"), _req("/v2/x")).matched
    assert not em.check_route(_route(prefix="/API"), _req("/api")).matched
    assert em.check_route(_route(prefix="/API", case_sensitive=False), _req("/api")).matched
    assert em.check_route(_route(path_separated_prefix="/a"), _req("/a/b")).matched
    assert not em.check_route(_route(path_separated_prefix="/a"), _req("/ab")).matched


def test_headers_present_absent_invert():
    exact = rc.HeaderMatcher(name="x-user", string_match={"exact": "jason"})
    inverted = rc.HeaderMatcher(name="x-user", string_match={"exact": "jason"}, invert_match=True)
    absent = rc.HeaderMatcher(name="x-user", present_match=True, invert_match=True)
    assert em.header_matches(exact, _req(x_user="jason"))
    assert not em.header_matches(exact, _req())
    assert em.header_matches(inverted, _req(x_user="bob"))
    assert not em.header_matches(inverted, _req())          # Envoy: an absent header never matches inverted
    assert em.header_matches(absent, _req()) and not em.header_matches(absent, _req(x_user="x"))
    method = rc.HeaderMatcher(name=":method", string_match={"exact": "POST"})
    assert em.header_matches(method, _req(method="POST")) and not em.header_matches(method, _req())


def test_query_parameters_first_value():
    r = rc.Route()
    r.match.prefix = "/"
    r.match.query_parameters.add(name="debug", string_match={"exact": "1"})
    assert em.check_route(r, _req("/x?debug=1&debug=2")).matched
    assert not em.check_route(r, _req("/x?debug=2&debug=1")).matched
    assert "query parameter debug" in em.check_route(r, _req("/x")).reason


CONFIG = (TEST_DATA / "route_explain.yaml").read_text()      # test_proxy_config.py reads it too


@pytest.fixture(scope="module")
def config():
    return load_texts({"vs.yaml": CONFIG})


def _lines():
    return CONFIG.splitlines()


def test_traced_to_rule_match_and_subset(config):
    r = explain(config, proxy_for(config), em.Request("reviews.example.com", "/x", "GET", {"end-user": ["jason"]}))
    src = r["route"]["source"]
    assert (src["resource"], src["rule"]) == ("VirtualService/shop/reviews", "spec.http[0]")
    assert "end-user" in _lines()[int(src["match_at"].split(":")[1]) - 1]
    (c,) = r["action"]["clusters"]
    assert c["subset"] == "v2" and c["selects"] == {"version": "v2"}
    assert "name: v2" in _lines()[int(c["subset_at"].split(":")[1]) - 1]
    assert c["endpoints"] == ["10.0.0.2:9080"]
    assert "fault:" in _lines()[int(r["action"]["fault"]["at"].split(":")[1]) - 1]


def test_weights_rewrite_timeout_and_passed_over(config):
    r = explain(config, proxy_for(config), em.Request("reviews.example.com", "/api/books"))
    assert [(c["subset"], c["weight"]) for c in r["action"]["clusters"]] == [("v1", 75), ("v2", 25)]
    assert r["action"]["rewrite"]["prefix_rewrite"] == "/v1"
    assert r["action"]["timeout"]["seconds"] == 2.0
    (over,) = r["passed_over"]
    assert over["index"] == 0 and "end-user" in over["reason"] and "absent" in over["reason"]


def test_no_match_is_404_with_closest_reason(config):
    r = explain(config, proxy_for(config), em.Request("reviews.example.com", "/other"))
    assert r["route"] is None and r["response"]["status"] == 404
    assert r["response"]["closest"]["index"] == 0            # its path held; the header did not
    r = explain(config, proxy_for(config), em.Request("nobody.example.org", "/"))
    # The gateway's hosts are "*" but only reviews.example.com has a VirtualService.
    assert r["virtual_host"] is None and r["response"]["status"] == 404


def test_bad_input_is_an_explain_error(config):
    with pytest.raises(ExplainError, match="no Gateway shop/nope"):
        proxy_for(config, "shop/nope")
    with pytest.raises(ExplainError, match="NAMESPACE/NAME"):
        proxy_for(config, "nope")
    with pytest.raises(ExplainError, match="NAME:VALUE"):
        parse_header("novalue")
    with pytest.raises(ExplainError, match="port 9999"):
        explain(config, proxy_for(config), em.Request("reviews.example.com"), port=9999)


def test_cli_errors_exit_2(tmp_path, capsys):
    from mcp26.mesh.cli import main
    assert main(["route", "explain", str(tmp_path / "missing"), "--host", "h"]) == 2
    (tmp_path / "vs.yaml").write_text(CONFIG)
    assert main(["route", "explain", str(tmp_path), "--host", "h", "-H", "bad"]) == 2
    assert main(["route", "explain", str(tmp_path), "--host", "h", "--gateway", "x/y"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("mcpctl route explain: ") for line in err)
