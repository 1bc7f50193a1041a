"""scheduler.decisions dataclasses <-> the strings a policy component takes and answers.

The encoding, ENCODING ("mcp-policy-json/2", documented in wit/policy.wit): JSON arrays, each WIT
record as the list of its fields in the WIT's order (FIELDS, checked against policy.wit by
tests/unit/test_policy_plugin_conversion.py), a nested record or list the same way, u32/u64 as
integers (clamped here), f64 as numbers. The plugin's side is the wrapper build.py generates: it
builds the bindings' dataclasses positionally from these lists (componentize-py declares their
fields in WIT order), so a plugin still sees typed records.

Why a string and not the records themselves: wasmtime-py lowers and lifts component values in
Python, field by field (a replica record ~0.2 ms, 20 replicas ~4.5 ms a call); one string is one
copy, and JSON is parsed in C on both sides.

What a plugin answers is checked here, so a plugin's nonsense (an unknown action kind, a NaN
weight, one score too few, not JSON at all) is an error of that call, never a value the loop acts on.
"""
from __future__ import annotations

import json
import math

from mcp26.scheduler.decisions import (Action, EndpointInfo, EngineSignals, FlowSignals, LinkSignals, ReplicaSignals,
                                       RequestInfo, ResourceSignals, Signals, WriteBurstSignals)

ENCODING = "mcp-policy-json/2"      # 2: flows' ingress RTT, tokens/s, KV hits; write bursts; resources; trigger
ACTION_KINDS = ("remap-class", "upgrade-flow", "class-weight", "endpoint-weight", "batcher-policy")
U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1
MAX_ANSWER_CHARS = 4 << 20            # a plugin's answer is parsed on the caller's thread: bounded

# Each record's fields in policy.wit's order: the encoding's column order.
FIELDS = {
    "class-depth": ("qos-class", "depth"),
    "replica-signals": ("endpoint", "queue-depth", "running", "compute-p99-ms", "tokens-per-second",
                        "kv-utilisation", "kv-hit-rate", "memory-fraction", "memory-source", "age-ms"),
    "flow-signals": ("flow", "rtt-ms", "payload-bytes", "age-ms", "ingress-rtt-ms", "tokens-per-second",
                     "kv-hit-rate"),
    "write-burst-signals": ("pid", "endpoint", "bytes", "writes", "length-ms", "age-ms"),
    "link-signals": ("device", "value"),
    "engine-signals": ("endpoint", "sessions", "running", "queued", "profiles"),
    "resource-signals": ("numa-nodes", "numa-cpus", "numa-distance", "numa-source", "pcie-links", "pcie-throughput",
                         "pcie-source", "engine", "engine-source"),
    "signals": ("now-s", "replicas", "flows", "write-bursts", "resources", "trigger"),
    "action": ("kind", "subject", "value", "weight", "hold-s", "reserved-threads", "reason"),
    "request-info": ("qos-class", "prompt-bytes", "session"),
    "endpoint-info": ("endpoint", "queue-depth", "kv-utilisation", "compute-p99-ms"),
}

# C-accelerated both ways; NaN/Infinity pass (a signal may be inf; answers are checked below).
_encode = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode
_decode = json.JSONDecoder().decode


class BadResult(ValueError):
    """A plugin returned something the contract does not allow."""


def _u32(v) -> int:
    return min(max(int(v), 0), U32_MAX)


def _u64(v) -> int:
    return min(max(int(v), 0), U64_MAX)


# -- the host's side: rows in FIELDS order ------------------------------------------------------
def replica_row(r: ReplicaSignals) -> list:
    return [str(r.endpoint), [[str(c), _u32(d)] for c, d in sorted(r.queue_depth.items())],
            _u32(r.running), float(r.compute_p99_ms), float(r.tokens_per_second), float(r.kv_utilisation),
            float(r.kv_hit_rate), float(r.memory_fraction), str(r.memory_source), float(r.age_ms)]


def flow_row(f: FlowSignals) -> list:
    return [str(f.flow), float(f.rtt_ms), _u64(f.payload_bytes), float(f.age_ms), float(f.ingress_rtt_ms),
            float(f.tokens_per_second), float(f.kv_hit_rate)]


def burst_row(b: WriteBurstSignals) -> list:
    return [_u32(b.pid), str(b.endpoint), _u64(b.bytes), _u32(b.writes), float(b.length_ms), float(b.age_ms)]


def link_row(link: LinkSignals) -> list:
    return [str(link.device), float(link.value)]


def engine_row(e: EngineSignals) -> list:
    return [str(e.endpoint), float(e.sessions), float(e.running), float(e.queued), float(e.profiles)]


def resources_row(r: ResourceSignals) -> list:
    return [[_u32(n) for n in r.numa_nodes], [[_u32(c) for c in cpus] for cpus in r.numa_cpus],
            [[float(d) for d in row] for row in r.numa_distance], str(r.numa_source),
            [link_row(x) for x in r.pcie_links], [link_row(x) for x in r.pcie_throughput], str(r.pcie_source),
            [engine_row(e) for e in r.engine], str(r.engine_source)]


def request_row(r: RequestInfo) -> list:
    return [str(r.qos_class), _u64(r.prompt_bytes), str(r.session)]


def endpoint_row(e: EndpointInfo) -> list:
    return [str(e.endpoint), _u32(e.queue_depth), float(e.kv_utilisation), float(e.compute_p99_ms)]


def encode_signals(s: Signals) -> str:
    return _encode([float(s.now_s), [replica_row(r) for r in s.replicas], [flow_row(f) for f in s.flows],
                    [burst_row(b) for b in s.write_bursts], resources_row(s.resources), str(s.trigger)])


def encode_request(r: RequestInfo) -> str:
    return _encode(request_row(r))


def encode_endpoints(endpoints) -> str:
    return _encode([endpoint_row(e) for e in endpoints])


# -- the plugin's answers -------------------------------------------------------------------------
def _parse(text: str):
    if len(text) > MAX_ANSWER_CHARS:
        raise BadResult(f"answer of {len(text):,} characters (at most {MAX_ANSWER_CHARS:,})")
    try:
        return _decode(text)
    except ValueError as e:
        raise BadResult(f"answer is not {ENCODING}: {e}") from None


def _finite(name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadResult(f"{name} is not a number: {v!r}")
    v = float(v)
    if not math.isfinite(v):
        raise BadResult(f"{name} is {v}")
    return v


def _str(name: str, v) -> str:
    if not isinstance(v, str):
        raise BadResult(f"{name} is not a string: {v!r}")
    return v


def action_from_row(row) -> Action:
    if not isinstance(row, list) or len(row) != len(FIELDS["action"]):
        raise BadResult(f"an action is a list of {len(FIELDS['action'])} fields, not {str(row)[:80]}")
    kind, subject, value, weight, hold_s, reserved, reason = row
    if kind not in ACTION_KINDS:
        raise BadResult(f"unknown action kind {kind!r} (one of {', '.join(ACTION_KINDS)})")
    if not subject or not isinstance(subject, str):
        raise BadResult(f"{kind} action without a subject")
    hold_s, weight = _finite("hold-s", hold_s), _finite("weight", weight)
    if hold_s < 0 or weight < 0:
        raise BadResult(f"{kind} {subject}: negative weight or hold")
    if isinstance(reserved, bool) or not isinstance(reserved, int) or not 0 <= reserved <= U32_MAX:
        raise BadResult(f"{kind} {subject}: reserved-threads {reserved!r} is not a u32")
    return Action(kind=kind, subject=subject, value=_str("value", value), weight=weight, hold_s=hold_s,
                  reserved_threads=reserved, reason=_str("reason", reason))


def actions_from_answer(text: str) -> list[Action]:
    rows = _parse(text)
    if not isinstance(rows, list):
        raise BadResult(f"decide answered {type(rows).__name__}, not a list of actions")
    return [action_from_row(a) for a in rows]


def scores_from_answer(text: str, endpoints: int) -> list[float]:
    values = _parse(text)
    if not isinstance(values, list):
        raise BadResult(f"score answered {type(values).__name__}, not a list of numbers")
    if len(values) != endpoints:
        raise BadResult(f"{len(values)} scores for {endpoints} endpoints")
    return [_finite("score", v) for v in values]
