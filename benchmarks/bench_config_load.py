"""What one config change set costs the control plane, stage by stage, side by side.

A synthetic mesh of N services x 10 HTTP routes (ServiceEntry with STATIC
endpoints, DestinationRule with subsets and a connection pool, VirtualService
with header/regex matches, weights, timeouts, retries) is loaded by the
stages of mesh.change_set.load_config, each timed alone on the same input:

  yaml C loader   plain yaml.load_all(CSafeLoader), no line numbers (the floor)
  parse + lines   mesh.parse.load_dir: resources with the line of every field
  validate        mesh.validation.validate: CRD schema + Istio's rules
  analyze         mesh.analyze.analyze: cross-resource (IST0101, IST0109, ...)
  load_config     the whole call the control plane makes

for N = 100 and N = 1,000: CPU seconds of this process (time.process_time,
best of 3), so that other work on a shared machine does not count., with each stage's ratio
to the YAML floor and the 1,000/100 scaling ratio (10 = linear).

Run from the repo root: `python -m benchmarks config_load`; writes
artifacts/bench/config_load.json.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys
import tempfile
import time

import yaml

from mcp26.mesh import analyze, validation
from mcp26.mesh.parse import load_dir, yaml_files
from mcp26.mesh.change_set import load_config

ROUTES = 10
SIZES = (100, 1000)
RUNS = 3


def service(i: int) -> str:
    host = f"svc{i}.prod.svc.cluster.local"
    routes = "\n".join(f"""  - name: r{j}
    match:
    - uri: {{prefix: /api/v{j}/}}
      headers:
        end-user: {{exact: user{j}}}
        x-model: {{regex: "^(llama|mistral)-[0-9]+b$"}}
    timeout: 5s
    retries: {{attempts: 3, perTryTimeout: 1s, retryOn: "5xx,connect-failure"}}
    route:
    - destination: {{host: {host}, subset: v1, port: {{number: 8080}}}}
      weight: 90
    - destination: {{host: {host}, subset: v2, port: {{number: 8080}}}}
      weight: 10""" for j in range(ROUTES))
    return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: svc{i}, namespace: prod}}
spec:
  hosts: [{host}]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 8080, name: http, protocol: HTTP}}]
  endpoints:
  - {{address: 10.0.{i // 250}.{i % 250 + 1}, labels: {{version: v1}}}}
  - {{address: 10.1.{i // 250}.{i % 250 + 1}, labels: {{version: v2}}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: svc{i}, namespace: prod}}
spec:
  host: {host}
  trafficPolicy:
    connectionPool: {{http: {{http2MaxRequests: 100}}, tcp: {{maxConnections: 50}}}}
    outlierDetection: {{consecutive5xxErrors: 5, interval: 10s, baseEjectionTime: 30s}}
  subsets:
  - {{name: v1, labels: {{version: v1}}}}
  - {{name: v2, labels: {{version: v2}}}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: svc{i}, namespace: prod}}
spec:
  hosts: [{host}]
  http:
{routes}
"""


def write_mesh(directory: str, services: int) -> None:
    for i in range(services):
        with open(os.path.join(directory, f"svc-{i:04d}.yaml"), "w") as f:
            f.write(service(i))


def timed(fn, runs: int = RUNS) -> float:
    samples = []
    for _ in range(runs):
        t = time.process_time()
        fn()
        samples.append(time.process_time() - t)
    return min(samples)


def plain_yaml(directory: str) -> None:
    for path in yaml_files(directory):
        with open(path) as fh:
            list(yaml.load_all(fh.read(), Loader=yaml.CSafeLoader))


def measure(services: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        write_mesh(d, services)
        config = load_dir(d)
        assert not [x for x in validation.validate(config) if x.severity == "error"]
        assert not [x for x in analyze.analyze(config) if x.severity == "error"]
        return {
            "resources": len(config),
            "yaml C loader": timed(lambda: plain_yaml(d)),
            "parse + lines": timed(lambda: load_dir(d)),
            "validate": timed(lambda: validation.validate(config)),
            "analyze": timed(lambda: analyze.analyze(config)),
            "load_config": timed(lambda: load_config(d)),
        }


def main() -> int:
    results = {n: measure(n) for n in SIZES}
    stages = ["yaml C loader", "parse + lines", "validate", "analyze", "load_config"]
    small, big = results[SIZES[0]], results[SIZES[-1]]
    print(f"config load, {ROUTES} routes per service, CPU seconds, best of {RUNS} runs")
    print(f"{'stage':<16}" + "".join(f"{f'{n} svc (s)':>14}" for n in SIZES)
          + f"{'vs yaml':>10}{f'{SIZES[-1]}/{SIZES[0]}':>11}")
    for s in stages:
        print(f"{s:<16}" + "".join(f"{results[n][s]:>14.3f}" for n in SIZES)
              + f"{big[s] / big['yaml C loader']:>9.2f}x{big[s] / small[s]:>10.1f}x")
    print("resources: " + ", ".join(f"{n} svc = {results[n]['resources']}" for n in SIZES))
    out = pathlib.Path("artifacts/bench")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config_load.json").write_text(json.dumps({
        "routes_per_service": ROUTES, "runs": RUNS, "seconds": {str(n): results[n] for n in SIZES},
        "ratio_to_yaml": {s: big[s] / big["yaml C loader"] for s in stages},
        "scaling": {s: big[s] / small[s] for s in stages},
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
