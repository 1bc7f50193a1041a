"""OpenAI chat sessions through a Gateway API inference gateway: an HTTPRoute sends
/v1/ to an InferencePool of two `mcpctl serve --model builtin:tiny-decoder`
replicas (127.0.0.2 and 127.0.0.3, one port, as Pods), the control plane
translates it as istiod does (the pool's cluster balanced by override_host,
ext_proc to the pool's endpoint picker on that route), and a real
`mcpctl epp serve` picks the replica for each request from the replicas' live
metrics and the prompt's prefix. Sessions that share a system prompt stay on
one replica, where that prompt's KV blocks already are; the picker's prefix-hit
rate and each replica's prefix-cache hit rate show it.

The gateway is an Envoy of its own (`mcpctl envoy run`, labelled as Istio labels
a Gateway API gateway's pods), on the same control plane as the demo gateway.
"""
from __future__ import annotations

import json
import time
import urllib.request

import openai

from mcp26.demo.framework import Check, Demo, Step
from mcp26.demo.stack.ports import port_free_on_all, wait_port

HOSTS = ("127.0.0.2", "127.0.0.3")
NAMESPACE = "inference"
NODE = f"router~127.0.0.1~inference-gateway.{NAMESPACE}~{NAMESPACE}.svc.cluster.local"
MODEL = "tiny-decoder"
SYSTEM_PROMPTS = {
    "shop": "You are the support assistant of an online shop selling garden tools. Answer in two sentences, "
            "politely, and never invent an order status: ask for the order number when it is missing. ",
    "code": "You are a code reviewer for a Python service mesh. Point out one bug or risk per answer, name the "
            "file and line when you can, and suggest the smallest fix that keeps the tests passing. ",
}
# Four sessions, two per system prompt, three turns each (the turns interleaved across sessions).
SESSIONS = [("shop", "Where is my order?"), ("code", "Review my retry loop."),
            ("shop", "Can I return a rake?"), ("code", "Is this lock needed?")]
TURNS = 3

CONFIG = """\
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: inference-gateway, namespace: {ns}}}
spec:
  gatewayClassName: istio
  listeners:
  - {{name: http, port: {gateway_port}, protocol: HTTP}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: chat, namespace: {ns}}}
spec:
  parentRefs: [{{name: inference-gateway}}]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: /v1}}}}]
    backendRefs: [{{group: inference.networking.k8s.io, kind: InferencePool, name: decoders}}]
---
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {{name: decoders, namespace: {ns}}}
spec:
  selector: {{matchLabels: {{app: tiny-decoder}}}}
  targetPorts: [{{number: {port}}}]
  endpointPickerRef: {{name: epp, port: {{number: 9002}}, failureMode: FailClose}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: tiny-decoder, namespace: {ns}}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: tiny-decoder}}}}
  template:
    metadata:
      labels: {{app: tiny-decoder}}
      annotations: {{mcp-mesh.io/addresses: "{hosts}"}}
    spec:
      containers: [{{name: server, image: mcp-mesh, args: [serve, --model, "builtin:{model}"]}}]
---
apiVersion: v1
kind: Service
metadata: {{name: epp, namespace: {ns}}}
spec:
  ports: [{{name: grpc-ext-proc, port: 9002, appProtocol: http2}}]
---
apiVersion: v1
kind: Endpoints
metadata: {{name: epp, namespace: {ns}}}
subsets:
- addresses: [{{ip: 127.0.0.1}}]
  ports: [{{name: grpc-ext-proc, port: {picker_port}}}]
"""


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def run(demo: Demo) -> list[Check]:
    started = time.monotonic()
    http_port, grpc_port = port_free_on_all(HOSTS, demo.port), port_free_on_all(HOSTS, demo.port)
    for h in HOSTS:     # the slowest part first: the replicas load while the rest comes up
        demo.start(f"decoder-{h}", [demo.mcpctl, "serve", "--model", f"builtin:{MODEL}", "--host", h,
                                    "--http-port", str(http_port), "--grpc-port", str(grpc_port),
                                    "--drain-seconds", "0"])
    gateway_port, picker_port, picker_admin, envoy_admin = demo.port(), demo.port(), demo.port(), demo.port()
    demo.apply("inference-gateway.yaml", CONFIG.format(
        ns=NAMESPACE, gateway_port=gateway_port, port=http_port, hosts=",".join(HOSTS), model=MODEL,
        picker_port=picker_port))
    demo.start("endpoint-picker", [demo.mcpctl, "epp", "serve", "--config-dir", str(demo.config_dir),
                                   "--pool", f"{NAMESPACE}/decoders", "--grpc-port", str(picker_port),
                                   "--admin-port", str(picker_admin), "--log-level", "WARNING"])
    demo.start("inference-gateway", [demo.mcpctl, "envoy", "run", "--node-id", NODE, "--cluster", "inference-gateway",
                                     "--xds-address", demo.control_plane.address, "--admin-port", str(envoy_admin),
                                     "--label", "gateway.networking.k8s.io/gateway-name=inference-gateway",
                                     "--bootstrap-path", str(demo.workdir / "inference-gateway-bootstrap.yaml")]
               + (["--delta"] if demo.args.delta else []))
    stats_url = f"http://127.0.0.1:{picker_admin}/stats"
    endpoints = [f"{h}:{http_port}" for h in HOSTS]
    demo.wait("the endpoint picker to see both replicas ready", lambda: all(
        (_get(stats_url)["endpoints"].get(e) or {}).get("ready") for e in endpoints), timeout=60)
    demo.control_plane.wait_synced(NODE, ("CDS", "EDS", "LDS", "RDS"), timeout=30)
    wait_port(gateway_port, timeout=30)
    ready_s = time.monotonic() - started
    demo.urls["inference gateway (OpenAI API)"] = f"http://127.0.0.1:{gateway_port}/v1/chat/completions"
    demo.urls["endpoint picker stats"] = stats_url

    def load(h: str) -> dict:
        return _get(f"http://{h}:{http_port}/v1/load")

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{gateway_port}/v1", api_key="demo", max_retries=0,
                           timeout=30)
    histories = [[{"role": "system", "content": SYSTEM_PROMPTS[kind]}] for kind, _ in SESSIONS]
    served: dict[int, list[str]] = {i: [] for i in range(len(SESSIONS))}
    prompt_tokens = cached_tokens = 0
    queries = {h: load(h)["models"][0]["prefix_cache_queries"] for h in HOSTS}
    chat_started = time.monotonic()
    for turn in range(TURNS):
        for i, (kind, question) in enumerate(SESSIONS):
            histories[i].append({"role": "user", "content": f"{question} (turn {turn + 1})"})
            answer = client.chat.completions.create(model=MODEL, messages=histories[i], max_tokens=8, seed=i)
            histories[i].append({"role": "assistant", "content": answer.choices[0].message.content or ""})
            prompt_tokens += answer.usage.prompt_tokens
            details = answer.usage.prompt_tokens_details
            cached_tokens += (details.cached_tokens or 0) if details else 0
            # Which replica answered: the one whose prefix-cache lookups moved.
            now = {h: load(h)["models"][0]["prefix_cache_queries"] for h in HOSTS}
            moved = [h for h in HOSTS if now[h] > queries[h]]
            served[i].append(moved[0] if len(moved) == 1 else "?")
            queries = now
    chat_s = time.monotonic() - chat_started
    stats = _get(stats_url)
    loads = {h: load(h) for h in HOSTS}
    by_prompt: dict[str, set] = {}
    for i, (kind, _) in enumerate(SESSIONS):
        by_prompt.setdefault(kind, set()).update(served[i])
        print(f"  session {i + 1} ({kind} system prompt): turns served by {', '.join(served[i])}")
    requests = len(SESSIONS) * TURNS
    answered = sum(h != "?" for turns in served.values() for h in turns)
    hit_rate = stats.get("prefix_hit_rate") or 0.0
    print(f"  replicas {', '.join(endpoints)}, picker 127.0.0.1:{picker_port}, gateway 127.0.0.1:{gateway_port} "
          f"(ready in {ready_s:.1f}s); {requests} chat completions in {chat_s:.2f}s")
    print(f"  picker: prefix-hit rate {hit_rate:.2f}, picks {({e: s['picked'] for e, s in stats['endpoints'].items()})}, "
          f"mean decision {stats.get('mean_decision_us')} us")
    print("  replicas' prefix-cache hit rate: " + ", ".join(
        f"{h} {loads[h]['prefix_cache_hit_rate']:.2f}" for h in HOSTS)
        + f"; cached prompt tokens {cached_tokens}/{prompt_tokens} ({cached_tokens / max(prompt_tokens, 1):.0%})")
    return [
        Check("chat completions through the gateway", f"{requests}, each served by one replica",
              str(answered), answered == requests),
        Check("a shared system prompt sticks to one replica", "1 replica per prompt",
              "; ".join(f"{k}: {' '.join(sorted(v))}" for k, v in by_prompt.items()),
              all(len(v) == 1 and "?" not in v for v in by_prompt.values())),
        Check("picker's prefix-hit rate", "> 0.5", f"{hit_rate:.2f}", hit_rate > 0.5),
        Check("replicas reuse cached prompt tokens", "> 0", f"{cached_tokens}/{prompt_tokens}", cached_tokens > 0),
    ]


STEP = Step(95, "inference gateway: OpenAI sessions picked by the endpoint picker", run)
