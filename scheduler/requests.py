"""What the picker reads from a request: its headers (class, objective,
session) and, when Envoy sends it, its body (an OpenAI completion or chat
request: the prompt for prefix affinity, `model` for body-based routing)."""
from __future__ import annotations

import json

from mcp26.mesh import endpoint_picker as epp
from mcp26.mesh import headers as H
from mcp26.mesh.qos import QosClass
from mcp26.scheduler.picker import Request

MAX_BODY_PARSED = 4 << 20      # a larger body is routed without prefix affinity


def prompt_and_model(body: bytes) -> tuple[str, str | None]:
    """The prompt text (completions `prompt`, or chat `messages` joined in order)
    and the `model` field; ("", None) for anything else. Never raises: a body
    the picker cannot read is routed without prefix affinity, not refused."""
    if not body or len(body) > MAX_BODY_PARSED:
        return "", None
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):     # not JSON, or nested past the parser's depth
        return "", None
    if not isinstance(doc, dict):
        return "", None
    model = doc.get("model") if isinstance(doc.get("model"), str) else None
    prompt = doc.get("prompt")
    if isinstance(prompt, list):
        prompt = "".join(p for p in prompt if isinstance(p, str))
    if isinstance(prompt, str):
        return prompt, model
    parts = []
    for m in doc.get("messages") or []:
        if isinstance(m, dict):
            content = m.get("content")
            if isinstance(content, list):       # content parts
                content = "".join(c["text"] for c in content if isinstance(c, dict) and isinstance(c.get("text"), str))
            parts.append(f"{m.get('role', '')}:{content if isinstance(content, str) else ''}\n")
    return "".join(parts), model


def build_request(headers: dict[str, str], body: bytes, objectives: dict[str, int],
                  subset: tuple[str, ...] | None) -> tuple[Request, str | None]:
    """The scheduling Request, and the model name the body asked for."""
    prompt, model = prompt_and_model(body)
    objective = headers.get(epp.OBJECTIVE_HEADER) or (model if model in objectives else None)
    priority = objectives.get(objective, 0) if objective else 0
    try:
        qos = QosClass.parse(headers[H.QOS_CLASS]) if headers.get(H.QOS_CLASS) else None
    except ValueError:
        qos = None
    request = Request(prompt=prompt, session=headers.get(epp.SESSION_HEADER) or None,
                      sheddable=priority < 0 or qos is QosClass.BATCH,
                      critical=priority > 0 or qos is QosClass.LATENCY_CRITICAL,
                      subset=subset)
    return request, model
