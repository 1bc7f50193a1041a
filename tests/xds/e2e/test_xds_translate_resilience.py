"""DestinationRule connectionPool and outlierDetection, enforced by real Envoy."""
import http.client
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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
kind: Gateway
metadata: {{name: gw, namespace: default}}
spec:
  selector: {{istio: ingressgateway}}
  servers: [{{port: {{number: {gw}, name: http, protocol: HTTP}}, hosts: ["*"]}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: flaky, namespace: default}}
spec:
  hosts: [flaky.mesh.local]
  ports: [{{number: 80, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints: [{{address: 127.0.0.1, ports: {{http: {bad}}}}}, {{address: 127.0.0.1, ports: {{http: {good}}}}}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: flaky, namespace: default}}
spec:
  host: flaky.mesh.local
  trafficPolicy:
    loadBalancer: {{simple: ROUND_ROBIN}}
    outlierDetection: {{consecutive5xxErrors: 2, interval: 1s, baseEjectionTime: 60s, maxEjectionPercent: 100}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: slow, namespace: default}}
spec:
  hosts: [slow.mesh.local]
  ports: [{{number: 80, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints: [{{address: 127.0.0.1, ports: {{http: {slow}}}}}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: slow, namespace: default}}
spec:
  host: slow.mesh.local
  trafficPolicy:
    connectionPool: {{tcp: {{maxConnections: 1}}, http: {{http1MaxPendingRequests: 1, maxRequestsPerConnection: 1}}}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: retried, namespace: default}}
spec:
  hosts: [retried.mesh.local]
  ports: [{{number: 80, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints: [{{address: 127.0.0.1, ports: {{http: {bad}}}}}, {{address: 127.0.0.1, ports: {{http: {good}}}}}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: retried, namespace: default}}
spec:
  host: retried.mesh.local
  trafficPolicy: {{loadBalancer: {{simple: ROUND_ROBIN}}}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: vs, namespace: default}}
spec:
  hosts: ["*"]
  gateways: [gw]
  http:
  - match: [{{uri: {{prefix: /timeout}}}}]
    timeout: 200ms
    retries: {{attempts: 0}}
    route: [{{destination: {{host: slow.mesh.local}}}}]
  - match: [{{uri: {{prefix: /retried}}}}]
    retries: {{attempts: 3, retryOn: "5xx"}}
    route: [{{destination: {{host: retried.mesh.local}}}}]
  - match: [{{uri: {{prefix: /slow}}}}]
    retries: {{attempts: 0}}
    route: [{{destination: {{host: slow.mesh.local}}}}]
  - retries: {{attempts: 0}}
    route: [{{destination: {{host: flaky.mesh.local}}}}]
"""


class SlowUpstream:
    """Answers 200 after `delay` seconds, so requests pile up in Envoy's pool."""

    def __init__(self, delay: float):
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                time.sleep(delay)
                self.send_response(200)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


UPSTREAMS = {}


@pytest.fixture(scope="module")
def gateway():
    bad, good, slow = EchoUpstream("bad", status=500).start(), EchoUpstream("good").start(), SlowUpstream(1.0)
    UPSTREAMS.update(bad=bad, good=good)
    try:
        gw = free_port()
        text = CONFIG.format(gw=gw, bad=bad.port, good=good.port, slow=slow.port)
        snap = translate(load_texts({"resilience.yaml": text}),
                         ProxyNode("router~127.0.0.1~gw.default~default.svc.cluster.local",
                                   labels={"istio": "ingressgateway"}))
        with Envoy(static_bootstrap(snap)) as envoy:
            yield gw, envoy
    finally:
        bad.stop()
        good.stop()
        slow.stop()


def get(port: int, path: str) -> tuple[int, dict]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", path, headers={"host": "any.example.com"})
        r = c.getresponse()
        r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}
    finally:
        c.close()


def test_outlier_detection_ejects_the_failing_endpoint(gateway):
    port, envoy = gateway
    statuses = [get(port, f"/item/{i}")[0] for i in range(30)]
    # Round robin alternates until the bad endpoint's 2nd consecutive 5xx ejects it. Envoy ejects
    # on its main thread, after the worker reports the 5xx: on a loaded machine the next request
    # can reach the bad endpoint once more before the worker learns (seen once in CI: 3).
    assert statuses.count(500) in (2, 3), statuses
    assert statuses[-20:] == [200] * 20
    stats = envoy.stats(r"outlier_detection\.ejections_enforced_consecutive_5xx")
    assert stats["cluster.outbound|80||flaky.mesh.local.outlier_detection.ejections_enforced_consecutive_5xx"] == 1


def test_connection_pool_limits_overflow_with_503(gateway):
    port, envoy = gateway
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(lambda i: get(port, f"/slow/{i}"), range(6)))
    statuses = [s for s, _ in results]
    # One connection, one pending request: the rest are shed by the circuit
    # breaker (on a loaded machine a late thread may find room again).
    assert statuses.count(200) >= 1 and statuses.count(503) >= 3, statuses
    assert set(statuses) == {200, 503}
    assert all(h.get("x-envoy-overloaded") == "true" for s, h in results if s == 503)
    overflow = envoy.stats(r"upstream_rq_pending_overflow")
    assert overflow["cluster.outbound|80||slow.mesh.local.upstream_rq_pending_overflow"] == statuses.count(503)


def test_route_timeout_answers_504_before_the_upstream_does(gateway):
    port, _ = gateway
    t0 = time.monotonic()
    status, _ = get(port, "/timeout")
    took = time.monotonic() - t0
    assert status == 504 and took < 1.0, took        # the upstream needs 1 s


def test_retries_on_5xx_hide_the_failing_endpoint(gateway):
    port, _ = gateway
    bad_before = len(UPSTREAMS["bad"].requests)
    statuses = [get(port, f"/retried/{i}")[0] for i in range(10)]
    assert statuses == [200] * 10
    assert len(UPSTREAMS["bad"].requests) > bad_before     # the 500s happened, and were retried
