"""`mcpctl route explain` agrees with real Envoy.

A bookinfo-style directory is explained request by request, and the same
translation is served to a real Envoy gateway (static bootstrap). Every
cluster has its own echo upstream (every subset its own endpoint), so the
upstream that answered names the cluster Envoy routed to; a 404 or a
redirect is read from Envoy's answer. The explanation must name the same.
"""
import http.client
import json
import os

import pytest

from mcp26.demo.stack.envoy import Envoy
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.xds.explain import envoy_match
from mcp26.xds.explain.route_explain import explain, load, proxy_for
from mcp26.xds.translate import translate
from mcp26.xds.translate.static import static_bootstrap

pytestmark = pytest.mark.e2e

UPSTREAMS = ("productpage", "ratings", "details", "reviews-v1", "reviews-v2", "reviews-v3")

CONFIG = """
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: ingress, namespace: shop}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: {gw}, name: http, protocol: HTTP}}
    hosts: ["*"]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: reviews, namespace: shop}}
spec:
  hosts: [reviews.shop.svc.cluster.local]
  ports: [{{number: 9080, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints:
  - {{address: 127.0.0.1, ports: {{http: {reviews-v1}}}, labels: {{version: v1}}}}
  - {{address: 127.0.0.1, ports: {{http: {reviews-v2}}}, labels: {{version: v2}}}}
  - {{address: 127.0.0.1, ports: {{http: {reviews-v3}}}, labels: {{version: v3}}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: reviews, namespace: shop}}
spec:
  host: reviews
  subsets:
  - {{name: v1, labels: {{version: v1}}}}
  - {{name: v2, labels: {{version: v2}}}}
  - {{name: v3, labels: {{version: v3}}}}
{services}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: bookinfo, namespace: shop}}
spec:
  hosts: [bookinfo.example.com]
  gateways: [ingress]
  http:
  - match: [{{uri: {{exact: /productpage}}}}]
    route: [{{destination: {{host: productpage}}}}]
  - match: [{{uri: {{regex: "/api/v[0-9]+/ratings"}}}}]
    route: [{{destination: {{host: ratings}}}}]
  - match: [{{uri: {{prefix: /reviews}}, headers: {{end-user: {{exact: jason}}}}}}]
    route: [{{destination: {{host: reviews, subset: v2}}}}]
  - match: [{{uri: {{prefix: /reviews}}, headers: {{x-canary: {{}}}}}}]
    route: [{{destination: {{host: reviews, subset: v3}}}}]
  - match: [{{uri: {{prefix: /reviews}}, withoutHeaders: {{x-tier: {{exact: gold}}}}}}]
    route:
    - {{destination: {{host: reviews, subset: v1}}, weight: 100}}
    - {{destination: {{host: reviews, subset: v2}}, weight: 0}}
  - match: [{{queryParams: {{debug: {{exact: "1"}}}}}}]
    route: [{{destination: {{host: details}}}}]
  - match: [{{method: {{exact: POST}}}}]
    route: [{{destination: {{host: ratings}}}}]
  - match: [{{uri: {{prefix: /moved}}}}]
    redirect: {{uri: /here, authority: elsewhere.example.com}}
  - match: [{{uri: {{prefix: /static/}}, ignoreUriCase: true}}]
    route: [{{destination: {{host: details}}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: shop-wildcard, namespace: shop}}
spec:
  hosts: ["*.shop.example.com"]
  gateways: [ingress]
  http:
  - route:
    - {{destination: {{host: reviews, subset: v1}}, weight: 0}}
    - {{destination: {{host: reviews, subset: v3}}, weight: 100}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: api-shop, namespace: shop}}
spec:
  hosts: [api.shop.example.com]
  gateways: [ingress]
  http:
  - route: [{{destination: {{host: details}}}}]
"""

SERVICE = """---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: {name}, namespace: shop}}
spec:
  hosts: [{name}.shop.svc.cluster.local]
  ports: [{{number: 9080, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints: [{{address: 127.0.0.1, ports: {{http: {port}}}}}]"""

# (host, method, path, headers): host wildcards, exact/prefix/regex paths,
# header match / present / absent-inverted, query parameter, method, 0/100
# weights, subsets, a redirect and 404s (no route, no virtual host).
REQUESTS = [
    ("bookinfo.example.com", "GET", "/productpage", {}),
    ("bookinfo.example.com", "GET", "/productpage/extra", {}),
    ("bookinfo.example.com", "GET", "/api/v1/ratings", {}),
    ("bookinfo.example.com", "GET", "/api/v2/ratings?debug=0", {}),
    ("bookinfo.example.com", "GET", "/api/vX/ratings", {}),
    ("bookinfo.example.com", "GET", "/reviews/1", {"end-user": "jason"}),
    ("bookinfo.example.com", "GET", "/reviews/1", {"end-user": "JASON"}),
    ("bookinfo.example.com", "GET", "/reviews/1", {"x-canary": ""}),
    ("bookinfo.example.com", "GET", "/reviews/1", {"x-tier": "silver"}),
    ("bookinfo.example.com", "GET", "/reviews/1", {"x-tier": "gold"}),
    ("bookinfo.example.com", "GET", "/reviews/1", {}),
    ("bookinfo.example.com", "GET", "/other?debug=1", {}),
    ("bookinfo.example.com", "GET", "/other?debug=2", {}),
    ("bookinfo.example.com", "POST", "/other", {}),
    ("bookinfo.example.com", "GET", "/moved/x", {}),
    ("bookinfo.example.com", "GET", "/STATIC/app.js", {}),
    ("BookInfo.Example.com", "GET", "/productpage", {}),
    ("api.shop.example.com", "GET", "/", {}),
    ("www.shop.example.com", "GET", "/anything", {}),
    ("shop.example.com", "GET", "/", {}),
    ("unknown.example.org", "GET", "/productpage", {}),
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    ups = {name: EchoUpstream(name).start() for name in UPSTREAMS}
    gw = free_port()
    try:
        d = tmp_path_factory.mktemp("explain")
        services = "\n".join(SERVICE.format(name=n, port=ups[n].port) for n in ("productpage", "ratings", "details"))
        text = CONFIG.format(gw=gw, services=services, **{n: u.port for n, u in ups.items()})
        (d / "bookinfo.yaml").write_text(text)
        config = load(str(d))
        proxy = proxy_for(config, "shop/ingress")
        with Envoy(static_bootstrap(translate(config, proxy.node))):
            yield {"dir": str(d), "config": config, "proxy": proxy, "port": gw,
                   "listening": {f"127.0.0.1:{u.port}": n for n, u in ups.items()}}
    finally:
        for u in ups.values():
            u.stop()


def _envoy_answer(port: int, host: str, method: str, path: str, headers: dict) -> dict:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request(method, path, headers={"host": host, **headers})
        r = c.getresponse()
        body = r.read()
    finally:
        c.close()
    if r.getheader("x-upstream"):
        return {"upstream": json.loads(body)["upstream"]}
    return {"status": r.status, "location": r.getheader("location")}


def _explained(result: dict) -> dict:
    """The explanation's answer in the same shape: the endpoint the one cluster
    with weight selects, mapped to the upstream listening there; or a status."""
    if result.get("response"):
        return {"status": result["response"]["status"], "location": None}
    action = result["action"]
    if "redirect" in action:
        rd = action["redirect"]
        return {"status": rd["status"], "location": f"http://{rd['hostRedirect']}{rd['pathRedirect']}"}
    live = [c for c in action["clusters"] if c["weight"] > 0]
    assert len(live) == 1, live
    return {"endpoints": live[0]["endpoints"]}


@pytest.mark.parametrize("host,method,path,headers", REQUESTS,
                         ids=[f"{m} {h}{p} {hd}" for h, m, p, hd in REQUESTS])
def test_explained_cluster_is_where_envoy_routes(setup, host, method, path, headers):
    req = envoy_match.Request(host, path, method, {k: [v] for k, v in headers.items()})
    result = explain(setup["config"], setup["proxy"], req, setup["port"])
    explained = _explained(result)
    seen = _envoy_answer(setup["port"], host, method, path, headers)
    if "endpoints" in explained:
        # The upstream listening on the explained cluster's one endpoint must be the one that answered.
        assert len(explained["endpoints"]) == 1, explained
        listening = setup["listening"].get(explained["endpoints"][0])
        assert {"upstream": listening} == seen, (json.dumps(result, indent=1), seen)
    else:
        assert explained == seen, (json.dumps(result, indent=1), seen)


def test_cli_json_names_the_rule_and_line(mcpctl, setup):
    out = mcpctl("route", "explain", setup["dir"],
                 "--host", "bookinfo.example.com", "--port", str(setup["port"]), "--path", "/reviews/7",
                 "-H", "end-user:jason", "-o", "json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    src = result["route"]["source"]
    assert (src["resource"], src["rule"]) == ("VirtualService/shop/bookinfo", "spec.http[2]")
    line = int(src["match_at"].rsplit(":", 1)[1])
    assert "end-user" in open(os.path.join(setup["dir"], "bookinfo.yaml")).read().splitlines()[line - 1]
    seen = _envoy_answer(setup["port"], "bookinfo.example.com", "GET", "/reviews/7", {"end-user": "jason"})
    assert seen == {"upstream": "reviews-v2"}
    assert result["action"]["clusters"][0]["subset"] == "v2"
