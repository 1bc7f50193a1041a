"""A sidecar Envoy running translate()'s outbound listeners: clients call services by name."""
import http.client
import json

import pytest

from mcp26.mesh.change_set import load_texts
from mcp26.demo.stack.envoy import Envoy
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.xds.translate import translate
from mcp26.xds.translate.static import static_bootstrap
from mcp26.xds.model.node import ProxyNode

pytestmark = pytest.mark.e2e

CONFIG = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: reviews, namespace: shop}}
spec:
  hosts: [reviews.shop.svc.cluster.local]
  ports: [{{number: {port}, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints:
  - {{address: 127.0.0.1, ports: {{http: {v1}}}, labels: {{version: v1}}}}
  - {{address: 127.0.0.1, ports: {{http: {v2}}}, labels: {{version: v2}}}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: ratings, namespace: shop}}
spec:
  hosts: [ratings.shop.svc.cluster.local]
  ports: [{{number: {port}, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints: [{{address: 127.0.0.1, ports: {{http: {ratings}}}}}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: reviews, namespace: shop}}
spec:
  host: reviews
  subsets: [{{name: v1, labels: {{version: v1}}}}, {{name: v2, labels: {{version: v2}}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: reviews, namespace: shop}}
spec:
  hosts: [reviews]
  http:
  - match: [{{headers: {{end-user: {{exact: jason}}}}}}]
    route: [{{destination: {{host: reviews, subset: v2}}}}]
  - route: [{{destination: {{host: reviews, subset: v1}}}}]
"""


@pytest.fixture(scope="module")
def sidecar():
    ups = {n: EchoUpstream(n).start() for n in ("v1", "v2", "ratings")}
    try:
        port = free_port()
        text = CONFIG.format(port=port, **{n: u.port for n, u in ups.items()})
        snap = translate(load_texts({"sidecar.yaml": text}),
                         ProxyNode("sidecar~127.0.0.1~productpage.shop~shop.svc.cluster.local",
                                   namespace="shop", kind="sidecar"))
        with Envoy(static_bootstrap(snap)):
            yield port
    finally:
        for u in ups.values():
            u.stop()


def call(port: int, host: str, headers: dict | None = None) -> tuple[int, str]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", "/api", headers={"host": host, **(headers or {})})
        r = c.getresponse()
        body = r.read()
        return r.status, json.loads(body)["upstream"] if r.status == 200 else ""
    finally:
        c.close()


@pytest.mark.parametrize("host", ["reviews", "reviews:{port}", "reviews.shop", "reviews.shop.svc.cluster.local:{port}"])
def test_mesh_virtual_service_applies_whatever_name_the_client_uses(sidecar, host):
    host = host.format(port=sidecar)
    assert call(sidecar, host, {"end-user": "jason"}) == (200, "v2")
    assert call(sidecar, host) == (200, "v1")


def test_service_without_virtual_service_gets_the_default_route(sidecar):
    assert call(sidecar, "ratings") == (200, "ratings")


def test_unknown_host_is_not_routed(sidecar):
    assert call(sidecar, "unknown.example.com")[0] == 404
