"""The design document's multimodal topology through the gateway: `mcpctl serve
--model-repository` serving the example repository (inference-backend/examples: a vision
branch, an audio branch and a text branch feeding a fusion model, each placed by its
config.pbtxt, and the `multimodal` ensemble over them), routed by the gateway on a port of
its own; one KServe v2 REST request with an image, a clip and tokens goes through the
gateway, the ensemble runs its DAG server-side and answers class probabilities.
"""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np

from mcp26.demo.framework import Check, Demo, Step
from mcp26.demo.stack.ports import wait_port

CONFIG = """\
# The multimodal ensemble's REST port behind a gateway port of its own.
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: multimodal-gateway, namespace: default}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: {gateway_port}, name: http-multimodal, protocol: HTTP}}
    hosts: ["*"]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: multimodal, namespace: default}}
spec:
  hosts: [multimodal.demo.local]
  location: MESH_INTERNAL
  ports: [{{number: 8000, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints:
  - {{address: 127.0.0.1, ports: {{http: {http_port}}}}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: multimodal, namespace: default}}
spec:
  hosts: ["*"]
  gateways: [multimodal-gateway]
  http:
  - match: [{{uri: {{prefix: /v2/}}}}]
    route:
    - destination: {{host: multimodal.demo.local, port: {{number: 8000}}}}
"""


def _post(url: str, doc: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, json.dumps(doc).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def run(demo: Demo) -> list[Check]:
    # the repository's own build script (steps import no other part)
    repo = subprocess.run([sys.executable, "-m", "mcp26.inference.examples.build_repository",
                           str(demo.workdir / "multimodal-repository")], check=True, capture_output=True,
                          text=True, timeout=120).stdout.strip()
    http_port, grpc_port, gateway_port = demo.port(), demo.port(), demo.port()
    demo.start("multimodal", [demo.mcpctl, "serve", "--model-repository", repo, "--http-port", str(http_port),
                              "--grpc-port", str(grpc_port), "--drain-seconds", "0"])

    def ready():
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/multimodal/ready", timeout=2) as r:
            return r.status == 200
    demo.wait("the model repository", ready, timeout=90)
    demo.apply("multimodal.yaml", CONFIG.format(gateway_port=gateway_port, http_port=http_port))
    wait_port(gateway_port, timeout=30)
    gateway = f"http://127.0.0.1:{gateway_port}"
    demo.urls["multimodal ensemble (gateway)"] = f"{gateway}/v2/models/multimodal"

    rng = np.random.default_rng(0)
    inputs = {"IMAGE": rng.standard_normal((1, 3, 32, 32)).astype(np.float32),
              "AUDIO": rng.standard_normal((1, 1, 1600)).astype(np.float32),
              "TOKENS": rng.integers(0, 1000, (1, 16)).astype(np.int64)}
    doc = {"inputs": [{"name": n, "datatype": "INT64" if a.dtype == np.int64 else "FP32", "shape": list(a.shape),
                       "data": a.ravel().tolist()} for n, a in inputs.items()]}
    status, answer = demo.wait("the gateway's route to the ensemble",
                               lambda: (lambda r: r if r[0] == 200 else None)(_post(
                                   f"{gateway}/v2/models/multimodal/infer", doc)), timeout=30)
    probs = np.array(answer["outputs"][0]["data"], np.float32) if status == 200 else np.zeros(0)
    with urllib.request.urlopen(f"{gateway}/v2/models/multimodal/config", timeout=5) as r:
        steps = [s["model_name"] for s in json.load(r)["ensemble_scheduling"]["step"]]
    where = {}
    for name in steps:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/{name}/config", timeout=5) as r:
            c = json.load(r)["parameters"]
        where[name] = f"{c['device']['string_value'] if 'device' in c else 'config'} -> " + ", ".join(
            d.get("device", "?") for d in json.loads(c["placement"]["string_value"]))
    print(f"  repository {repo}: steps {', '.join(steps)}")
    for name, w in where.items():
        print(f"    {name:8} {w}")
    print(f"  one request through the gateway {gateway}: HTTP {status}, PROBS {[round(float(p), 3) for p in probs]}, "
          f"server-side {answer.get('parameters', {})}")
    return [Check("ensemble through the gateway", "200, 10 probabilities summing to 1",
                  f"{status}, {probs.size} summing to {probs.sum():.4f}",
                  status == 200 and probs.size == 10 and abs(float(probs.sum()) - 1) < 1e-4),
            Check("ensemble steps", "vision, audio, text, fusion", ", ".join(steps),
                  steps == ["vision", "audio", "text", "fusion"])]


STEP = Step(85, "multimodal ensemble through the gateway", run)
