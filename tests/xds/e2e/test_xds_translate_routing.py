"""Traffic through real Envoy running translate()'s output (static bootstrap).

Three echo upstreams v1/v2/v3 behind a ServiceEntry whose endpoints carry
version labels, a DestinationRule with subsets, a VirtualService on a
Gateway. Each check looks at which upstream answered and what it received.
"""
import http.client
import json
import time

import pytest

from mcp26.mesh.change_set import load_texts
from mcp26.demo.stack.envoy import Envoy
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.xds.translate import translate
from mcp26.xds.translate.static import static_bootstrap
from mcp26.xds.model.node import ProxyNode

pytestmark = pytest.mark.e2e
DELAY_S = 0.4

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
  - {{address: 127.0.0.1, ports: {{http: {v1}}}, labels: {{version: v1}}}}
  - {{address: 127.0.0.1, ports: {{http: {v2}}}, labels: {{version: v2}}}}
  - {{address: 127.0.0.1, ports: {{http: {v3}}}, labels: {{version: v3}}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: reviews, namespace: shop}}
spec:
  host: reviews
  trafficPolicy: {{loadBalancer: {{consistentHash: {{httpHeaderName: x-user}}}}}}
  subsets:
  - {{name: v1, labels: {{version: v1}}}}
  - {{name: v2, labels: {{version: v2}}}}
  - {{name: v3, labels: {{version: v3}}}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: reviews, namespace: shop}}
spec:
  hosts: [reviews.example.com]
  gateways: [ingress]
  http:
  - match: [{{uri: {{exact: /teapot}}}}]
    directResponse: {{status: 418, body: {{string: "short and stout"}}}}
  - match: [{{uri: {{prefix: /slow}}}}]
    fault: {{delay: {{fixedDelay: {delay}s, percentage: {{value: 100}}}}}}
    route: [{{destination: {{host: reviews, subset: v1}}}}]
  - match: [{{uri: {{prefix: /old/}}}}]
    rewrite: {{uri: /new/}}
    headers: {{request: {{set: {{x-rewritten: "yes"}}}}}}
    route: [{{destination: {{host: reviews, subset: v3}}}}]
  - match: [{{uri: {{prefix: /moved}}}}]
    redirect: {{uri: /here, authority: elsewhere.example.com}}
  - match: [{{uri: {{prefix: /cors}}}}]
    corsPolicy:
      allowOrigins: [{{exact: "https://app.example.com"}}]
      allowMethods: [POST]
      allowHeaders: [x-model]
      maxAge: 1h
    headers: {{response: {{set: {{x-served-by: mesh}}, remove: [x-upstream]}}}}
    route: [{{destination: {{host: reviews, subset: v1}}}}]
  - match: [{{uri: {{prefix: /mirror}}}}]
    mirror: {{host: reviews, subset: v3}}
    mirrorPercentage: {{value: 100}}
    route: [{{destination: {{host: reviews, subset: v1}}}}]
  - match: [{{uri: {{prefix: /sticky}}}}]
    route: [{{destination: {{host: reviews}}}}]
  - match: [{{uri: {{prefix: /team/}}}}]
    delegate: {{name: team-routes}}
  - match: [{{headers: {{end-user: {{exact: jason}}}}}}]
    route: [{{destination: {{host: reviews, subset: v2}}}}]
  - route:
    - {{destination: {{host: reviews, subset: v1}}, weight: 80}}
    - {{destination: {{host: reviews, subset: v3}}, weight: 20}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: team-routes, namespace: shop}}
spec:
  http:
  - match: [{{headers: {{x-pick: {{exact: three}}}}}}]
    route: [{{destination: {{host: reviews, subset: v3}}}}]
  - route: [{{destination: {{host: reviews, subset: v2}}}}]
"""


UPSTREAMS = {}


@pytest.fixture(scope="module")
def gateway():
    ups = {v: EchoUpstream(v).start() for v in ("v1", "v2", "v3")}
    UPSTREAMS.update(ups)
    gw_port = free_port()
    try:
        text = CONFIG.format(gw=gw_port, delay=DELAY_S, **{v: u.port for v, u in ups.items()})
        snap = translate(load_texts({"routing.yaml": text}),
                         ProxyNode("router~127.0.0.1~ingress.shop~shop.svc.cluster.local",
                                   namespace="shop", labels={"istio": "ingressgateway"}))
        with Envoy(static_bootstrap(snap)):
            yield gw_port
    finally:
        for u in ups.values():
            u.stop()


def request(port, path="/", headers=None, conn=None):
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", path, headers={"host": "reviews.example.com", **(headers or {})})
    r = c.getresponse()
    body = r.read()
    if conn is None:
        c.close()
    return r.status, dict((k.lower(), v) for k, v in r.getheaders()), body


def test_end_user_jason_goes_to_v2(gateway):
    seen = {json.loads(request(gateway, "/reviews/1", {"end-user": "jason"})[2])["upstream"] for _ in range(20)}
    assert seen == {"v2"}


def test_others_split_80_20_between_v1_and_v3(gateway):
    counts = {"v1": 0, "v2": 0, "v3": 0}
    conn = http.client.HTTPConnection("127.0.0.1", gateway, timeout=10)
    try:
        for i in range(1000):
            status, headers, _ = request(gateway, f"/reviews/{i}", {"end-user": "someone"}, conn=conn)
            assert status == 200
            counts[headers["x-upstream"]] += 1
    finally:
        conn.close()
    # Binomial(1000, 0.8): sd 12.6; 5 sd either side.
    assert counts["v2"] == 0
    assert 737 <= counts["v1"] <= 863, counts
    assert counts["v1"] + counts["v3"] == 1000


def test_fault_delay_holds_the_request(gateway):
    t0 = time.monotonic()
    status, headers, _ = request(gateway, "/slow")
    slow = time.monotonic() - t0
    t0 = time.monotonic()
    request(gateway, "/fast", {"end-user": "jason"})
    fast = time.monotonic() - t0
    assert status == 200 and headers["x-upstream"] == "v1"
    # Envoy arms the delay from its event loop's cached time, which on a busy machine can be
    # several ms old (CI: 394.6 ms for a 400 ms delay), so the timer may fire that much early;
    # the undelayed request is three orders of magnitude quicker.
    assert slow >= DELAY_S * 0.95, (slow, fast)
    assert fast < slow - DELAY_S / 2, (slow, fast)


def test_direct_response_never_reaches_an_upstream(gateway):
    status, headers, body = request(gateway, "/teapot")
    assert (status, body) == (418, b"short and stout")
    assert "x-upstream" not in headers


def test_rewrite_and_request_header_reach_the_upstream(gateway):
    status, _, body = request(gateway, "/old/page?x=1")
    seen = json.loads(body)
    assert status == 200 and seen["upstream"] == "v3"
    assert seen["path"] == "/new/page?x=1"
    assert seen["headers"]["x-rewritten"] == "yes"


def test_redirect_answers_with_location(gateway):
    status, headers, _ = request(gateway, "/moved")
    assert status == 301
    assert headers["location"] == "http://elsewhere.example.com/here"


def test_delegated_routes_answer_under_the_roots_prefix(gateway):
    picked = [request(gateway, "/team/a", {"x-pick": "three"})[1]["x-upstream"] for _ in range(5)]
    default = [request(gateway, "/team/a")[1]["x-upstream"] for _ in range(5)]
    outside = request(gateway, "/elsewhere", {"x-pick": "three", "end-user": "jason"})[1]["x-upstream"]
    assert picked == ["v3"] * 5 and default == ["v2"] * 5
    assert outside == "v2"            # the delegate's x-pick match holds only under /team/


def test_cors_preflight_and_response_headers(gateway):
    c = http.client.HTTPConnection("127.0.0.1", gateway, timeout=10)
    c.request("OPTIONS", "/cors", headers={"host": "reviews.example.com", "origin": "https://app.example.com",
                                           "access-control-request-method": "POST"})
    r = c.getresponse()
    r.read()
    allowed = {k.lower(): v for k, v in r.getheaders()}
    c.request("OPTIONS", "/cors", headers={"host": "reviews.example.com", "origin": "https://evil.example.com",
                                           "access-control-request-method": "POST"})
    r2 = c.getresponse()
    r2.read()
    denied = {k.lower(): v for k, v in r2.getheaders()}
    c.close()
    assert r.status == 200 and allowed["access-control-allow-origin"] == "https://app.example.com"
    assert allowed["access-control-allow-methods"] == "POST" and allowed["access-control-max-age"] == "3600"
    assert "access-control-allow-origin" not in denied
    status, headers, body = request(gateway, "/cors/thing", {"origin": "https://app.example.com"})
    assert status == 200 and json.loads(body)["upstream"] == "v1"
    assert headers["x-served-by"] == "mesh" and "x-upstream" not in headers
    assert headers["access-control-allow-origin"] == "https://app.example.com"


def test_mirror_sends_a_copy_to_the_mirror_subset(gateway):
    before = len(UPSTREAMS["v3"].requests)
    status, headers, _ = request(gateway, "/mirror/item?n=7")
    assert status == 200 and headers["x-upstream"] == "v1"
    deadline = time.monotonic() + 5
    while len(UPSTREAMS["v3"].requests) == before and time.monotonic() < deadline:
        time.sleep(0.02)
    copy = UPSTREAMS["v3"].requests[-1]
    assert copy["path"] == "/mirror/item?n=7"
    assert copy["headers"]["host"] == "reviews.example.com-shadow"   # Envoy marks the shadow copy


def test_consistent_hash_keeps_each_user_on_one_endpoint(gateway):
    conn = http.client.HTTPConnection("127.0.0.1", gateway, timeout=10)
    try:
        by_user = {u: {request(gateway, "/sticky", {"x-user": u}, conn=conn)[1]["x-upstream"] for _ in range(3)}
                   for u in (f"user-{i}" for i in range(24))}
    finally:
        conn.close()
    assert all(len(seen) == 1 for seen in by_user.values()), by_user
    assert len(set().union(*by_user.values())) >= 2          # users spread over the ring
