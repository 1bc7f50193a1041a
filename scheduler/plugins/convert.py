"""scheduler.decisions dataclasses <-> the values wasmtime-py passes to and from a component.

wasmtime-py lowers a WIT record by reading attributes named as the WIT fields (kebab-case) and
lifts one into an object with those attributes; `f32`/`f64` want Python floats, integers ints.
What a plugin returns is checked here, so a plugin's nonsense (an unknown action kind, a NaN
weight, one score too few) is an error of that call, never a value the loop acts on.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

from scheduler.decisions import Action, EndpointInfo, FlowSignals, ReplicaSignals, RequestInfo, Signals

ACTION_KINDS = ("remap-class", "upgrade-flow", "class-weight", "endpoint-weight", "batcher-policy")
U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1


class BadResult(ValueError):
    """A plugin returned something the contract does not allow."""


def _record(**fields) -> SimpleNamespace:
    return SimpleNamespace(**{name.replace("_", "-"): value for name, value in fields.items()})


def _u32(v) -> int:
    return min(max(int(v), 0), U32_MAX)


def _u64(v) -> int:
    return min(max(int(v), 0), U64_MAX)


def replica_to_wit(r: ReplicaSignals) -> SimpleNamespace:
    return _record(
        endpoint=r.endpoint,
        queue_depth=[_record(qos_class=str(c), depth=_u32(d)) for c, d in sorted(r.queue_depth.items())],
        running=_u32(r.running), compute_p99_ms=float(r.compute_p99_ms),
        tokens_per_second=float(r.tokens_per_second), kv_utilisation=float(r.kv_utilisation),
        kv_hit_rate=float(r.kv_hit_rate), memory_fraction=float(r.memory_fraction),
        memory_source=r.memory_source, age_ms=float(r.age_ms))


def flow_to_wit(f: FlowSignals) -> SimpleNamespace:
    return _record(flow=f.flow, rtt_ms=float(f.rtt_ms), payload_bytes=_u64(f.payload_bytes), age_ms=float(f.age_ms))


def signals_to_wit(s: Signals) -> SimpleNamespace:
    return _record(now_s=float(s.now_s), replicas=[replica_to_wit(r) for r in s.replicas],
                   flows=[flow_to_wit(f) for f in s.flows])


def request_to_wit(r: RequestInfo) -> SimpleNamespace:
    return _record(qos_class=r.qos_class, prompt_bytes=_u64(r.prompt_bytes), session=r.session)


def endpoint_to_wit(e: EndpointInfo) -> SimpleNamespace:
    return _record(endpoint=e.endpoint, queue_depth=_u32(e.queue_depth),
                   kv_utilisation=float(e.kv_utilisation), compute_p99_ms=float(e.compute_p99_ms))


def _finite(name: str, v: float) -> float:
    if not math.isfinite(v):
        raise BadResult(f"{name} is {v}")
    return v


def action_from_wit(a) -> Action:
    kind = getattr(a, "kind")
    if kind not in ACTION_KINDS:
        raise BadResult(f"unknown action kind {kind!r} (one of {', '.join(ACTION_KINDS)})")
    subject = getattr(a, "subject")
    if not subject:
        raise BadResult(f"{kind} action without a subject")
    hold_s = _finite("hold-s", getattr(a, "hold-s"))
    weight = _finite("weight", getattr(a, "weight"))
    if hold_s < 0 or weight < 0:
        raise BadResult(f"{kind} {subject}: negative weight or hold")
    return Action(kind=kind, subject=subject, value=getattr(a, "value"), weight=weight, hold_s=hold_s,
                  reserved_threads=getattr(a, "reserved-threads"), reason=getattr(a, "reason"))


def actions_from_wit(values) -> list[Action]:
    return [action_from_wit(a) for a in values]


def scores_from_wit(values, endpoints: int) -> list[float]:
    if len(values) != endpoints:
        raise BadResult(f"{len(values)} scores for {endpoints} endpoints")
    return [_finite("score", float(v)) for v in values]
