"""A synthetic mesh for the xDS benchmark: N services x R routes behind one gateway."""
from __future__ import annotations

import os


def service_yaml(i: int, ports: tuple[int, int] = (20000, 20001), routes: int = 10) -> str:
    host = f"svc-{i}.bench.local"
    rules = "\n".join(f"""  - match: [{{uri: {{prefix: /r{r}}}}}]
    route:
    - destination: {{host: {host}, subset: {'v1' if r % 2 == 0 else 'v2'}}}""" for r in range(routes - 1))
    return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: svc-{i}, namespace: default}}
spec:
  hosts: [{host}]
  location: MESH_INTERNAL
  ports: [{{number: 80, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints:
  - {{address: 127.0.0.1, ports: {{http: {ports[0]}}}, labels: {{version: v1}}}}
  - {{address: 127.0.0.1, ports: {{http: {ports[1]}}}, labels: {{version: v2}}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: svc-{i}, namespace: default}}
spec:
  host: {host}
  subsets:
  - {{name: v1, labels: {{version: v1}}}}
  - {{name: v2, labels: {{version: v2}}}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: svc-{i}, namespace: default}}
spec:
  hosts: [svc-{i}.example.com]
  gateways: [bench-gw]
  http:
{rules}
  - route:
    - {{destination: {{host: {host}, subset: v1}}, weight: 90}}
    - {{destination: {{host: {host}, subset: v2}}, weight: 10}}
"""


GATEWAY = """apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: bench-gw, namespace: default}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: {port}, name: http, protocol: HTTP}}
    hosts: ["*"]
"""


def write_mesh(directory: str, services: int, routes: int, gateway_port: int) -> None:
    """One file per service (as a GitOps repo would hold them), plus the gateway."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "gateway.yaml"), "w") as f:
        f.write(GATEWAY.format(port=gateway_port))
    for i in range(services):
        with open(os.path.join(directory, f"svc-{i:04d}.yaml"), "w") as f:
            f.write(service_yaml(i, routes=routes))
