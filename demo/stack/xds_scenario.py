"""The routing scenario the xDS e2e tests and the benchmark share, and the client
to the gateway that they and the demo (`mcpctl demo`) count answers with.

Three echo upstreams (v1, v2, v3) behind a ServiceEntry whose endpoints are
labelled by version, a DestinationRule with a subset per version, and a
VirtualService bound to a Gateway. The Gateway port and upstream ports are
the test's free ports. (The demo serves the same routing from its own
manifests, demo/manifests/, which a reader can open.)
"""
from __future__ import annotations

import http.client
import json
import time

GATEWAY_LABELS = {"istio": "ingressgateway"}


def base_config(gateway_port: int, upstream_ports: dict[str, int]) -> dict[str, str]:
    endpoints = "\n".join(
        f"  - {{address: 127.0.0.1, ports: {{http: {port}}}, labels: {{version: {v}}}}}"
        for v, port in sorted(upstream_ports.items()))
    subsets = "\n".join(f"  - {{name: {v}, labels: {{version: {v}}}}}" for v in sorted(upstream_ports))
    return {
        "gateway.yaml": f"""apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: gw, namespace: default}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: {gateway_port}, name: http, protocol: HTTP}}
    hosts: ["*"]
""",
        "services.yaml": f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: reviews, namespace: default}}
spec:
  hosts: [reviews.mesh.local]
  location: MESH_INTERNAL
  ports: [{{number: 80, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints:
{endpoints}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: reviews, namespace: default}}
spec:
  host: reviews.mesh.local
  subsets:
{subsets}
""",
        "virtualservice.yaml": virtual_service(default=[("v1", None)]),
    }


def virtual_service(default: list[tuple[str, int | None]], jason: str = "v2",
                    jason_delay: str | None = None, name: str = "reviews") -> str:
    """end-user: jason -> `jason` subset (optionally delayed); everyone else -> `default` [(subset, weight)]."""
    fault = (f"""    fault:
      delay:
        fixedDelay: {jason_delay}
        percentage: {{value: 100}}
""" if jason_delay else "")
    routes = "\n".join(
        f"    - destination: {{host: reviews.mesh.local, subset: {s}}}" + (f"\n      weight: {w}" if w is not None else "")
        for s, w in default)
    return f"""apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: {name}, namespace: default}}
spec:
  hosts: ["*"]
  gateways: [gw]
  http:
  - match:
    - headers:
        end-user: {{exact: jason}}
{fault}    route:
    - destination: {{host: reviews.mesh.local, subset: {jason}}}
  - route:
{routes}
"""


class Client:
    """HTTP/1.1 keep-alive client to the gateway; returns which upstream answered
    (x-upstream) and what it saw. `authority` and `path`: what every request asks for."""

    def __init__(self, port: int, host: str = "127.0.0.1", authority: str = "reviews.example.com",
                 path: str = "/"):
        self.port, self.host, self.authority, self.path = port, host, authority, path
        self.conn: http.client.HTTPConnection | None = None

    def get(self, path: str | None = None, headers: dict | None = None,
            timeout: float = 5.0) -> tuple[int, str, dict]:
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
            try:
                self.conn.request("GET", path or self.path, headers={"host": self.authority, **(headers or {})})
                resp = self.conn.getresponse()
                body = resp.read()
                upstream = resp.getheader("x-upstream") or ""
                seen = json.loads(body) if upstream else {}
                if resp.getheader("connection", "").lower() == "close":
                    self.close()
                return resp.status, upstream, seen
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def who(self, headers: dict | None = None) -> str:
        return self.get(headers=headers)[1]

    def count(self, n: int, headers: dict | None = None) -> dict[str, int]:
        out: dict[str, int] = {}
        for _ in range(n):
            status, upstream, _ = self.get(headers=headers)
            key = upstream if status == 200 else f"HTTP {status}"
            out[key] = out.get(key, 0) + 1
        return out

    def wait_for(self, predicate, timeout: float = 10.0, headers: dict | None = None) -> str:
        """Until the upstream answering satisfies `predicate` (a route change has landed)."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                status, last, _ = self.get(headers=headers, timeout=2)
                if predicate(last):
                    return last
            except OSError as e:
                last = str(e)
            time.sleep(0.01)
        raise TimeoutError(f"route did not change within {timeout}s (last answer: {last!r})")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
