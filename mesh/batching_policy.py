"""Batcher settings of the inference backend: `--qos-policy` presets and the
`L7SchedulingPolicy` resource, with Triton's dynamic-batching semantics.

The fields mirror Triton's `dynamic_batching` block (model_config.proto):
max_batch_size, preferred_batch_size, max_queue_delay_microseconds,
priority_levels (1 is the highest), default_priority_level and a queue policy
per level (max_queue_size, default_timeout_microseconds, timeout_action
REJECT|DELAY, allow_timeout_override). A request's level comes from the mesh's
QoS class header (`x-mcp-qos-class`, set by the sidecar) or, without one, from
the protocol's `priority` parameter.

Beyond Triton, the seed's QoS rules (mesh/qos.py's table), on by default in every preset:
a weighted share of batch slots between the levels above `strict_levels` that have a weight
(High's class weighs 3x the default; Low has none by default and stays behind them), freezing (no batch of a frozen level starts while a request of a
freezing level is queued or computing), and the reserved lane's thread count (the seed's
"2 threads reserved" for a request upgraded to Critical). inference-backend/batch_formation.py
says how each is carried out.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from mcp26.mesh import qos as Q
from mcp26.mesh.qos import PRIORITY_LEVELS, QosClass

API_VERSION = "scheduling.mcp-mesh.io/v1alpha1"
KIND = "L7SchedulingPolicy"
TIMEOUT_ACTIONS = ("REJECT", "DELAY")
MAX_PRIORITY_LEVELS = 16
MAX_BATCH_SIZE_LIMIT = 4096
MAX_QUEUE_DELAY_US_LIMIT = 10_000_000   # 10 s: anything longer is a typo
MAX_LIST_ITEMS = 64                     # the CRD's maxItems / maxProperties (bounded CEL cost)
MAX_CLASS_WEIGHT = 100
MAX_LANE_THREADS = 16
# Levels 1..STRICT_LEVELS go first, in level order (mesh.qos: the leading classes of weight 0,
# latency-critical); the rest share by weight, a level of weight 0 among them (Low) after them.
STRICT_LEVELS = next(c.priority_level for c in sorted(QosClass, key=lambda c: c.priority_level) if c.weight) - 1


@dataclass(frozen=True)
class QueuePolicy:
    """Triton's ModelQueuePolicy; 0 means unlimited / no timeout."""
    max_queue_size: int = 0
    default_timeout_us: int = 0
    timeout_action: str = "REJECT"
    allow_timeout_override: bool = False

    def timeout_us(self, requested_us: int | None) -> int:
        """The timeout a request gets: a request may only shorten it (Triton)."""
        if requested_us and self.allow_timeout_override:
            if self.default_timeout_us == 0 or requested_us < self.default_timeout_us:
                return requested_us
        return self.default_timeout_us


@dataclass(frozen=True)
class BatcherSettings:
    max_batch_size: int = 32
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    priority_levels: int = PRIORITY_LEVELS
    default_priority_level: int = QosClass.STANDARD.priority_level
    queue_policies: Mapping[int, QueuePolicy] = field(default_factory=dict)
    default_queue_policy: QueuePolicy = QueuePolicy()
    # Levels 1..N get a reserved compute lane: a second compute thread on the
    # model that only takes batches of those levels, so they never wait behind a
    # running lower-level batch (batches cannot be pre-empted). 0: off, one
    # instance, plain Triton. See inference-backend/batch_formation.py.
    reserved_lane_levels: int = 0
    reserved_lane_threads: int = Q.RESERVED_THREADS     # the lane's compute threads
    # Weighted share: levels above strict_levels with a weight take batch slots in proportion
    # to it while they all wait; a level without one (Low by default) goes after them, in
    # level order; None: Triton's strict order throughout.
    level_weights: Mapping[int, int] | None = field(default_factory=Q.default_level_weights)
    strict_levels: int = STRICT_LEVELS
    # Freezing: while a request of freeze_while_levels is queued or computing, no batch of
    # freeze_levels starts (one already computing finishes). (): off.
    freeze_levels: tuple[int, ...] = Q.FROZEN_LEVELS
    freeze_while_levels: tuple[int, ...] = Q.FREEZE_WHILE_LEVELS
    name: str = "custom"          # the preset or policy it came from, for reports

    def policy_for(self, level: int) -> QueuePolicy:
        return self.queue_policies.get(level, self.default_queue_policy)

    def with_overrides(self, max_batch_size: int | None = None,
                       max_queue_delay_us: int | None = None) -> "BatcherSettings":
        """Command-line flags on top of a preset (`--max-batch`, `--max-queue-delay-us`)."""
        out = self
        if max_batch_size is not None:
            prefs = tuple(p for p in out.preferred_batch_sizes if p <= max_batch_size)
            out = replace(out, max_batch_size=max_batch_size, preferred_batch_sizes=prefs)
        if max_queue_delay_us is not None:
            out = replace(out, max_queue_delay_us=max_queue_delay_us)
        problems = settings_problems(out)
        if problems:
            raise ValueError("; ".join(f"{f}: {m}" for f, m in problems))
        return out

    def level_for(self, qos_class: str | None = None, priority: int | None = None) -> int:
        """The priority level of a request.

        The mesh's QoS class wins: the sidecar computed it from the verified
        caller, while `priority` is whatever the client wrote. A class above
        the configured levels lands on the lowest level. `priority` follows
        Triton: 0 or out of range means the default level.
        Raises ValueError for a QoS class the mesh does not define.
        """
        if qos_class:
            return min(QosClass.parse(qos_class).priority_level, self.priority_levels)
        if priority and 1 <= priority <= self.priority_levels:
            return int(priority)
        return self.default_priority_level

    def describe(self) -> dict:
        return {
            "name": self.name, "max_batch_size": self.max_batch_size,
            "preferred_batch_size": list(self.preferred_batch_sizes),
            "max_queue_delay_microseconds": self.max_queue_delay_us,
            "priority_levels": self.priority_levels,
            "default_priority_level": self.default_priority_level,
            "priority_queue_policy": {str(k): vars(v) for k, v in sorted(self.queue_policies.items())},
            "reserved_lane_levels": self.reserved_lane_levels,
            "reserved_lane_threads": self.reserved_lane_threads,
            "level_weights": ({str(k): v for k, v in sorted(self.level_weights.items())}
                              if self.level_weights is not None else None),
            "strict_levels": self.strict_levels,
            "freeze_levels": list(self.freeze_levels),
            "freeze_while_levels": list(self.freeze_while_levels),
        }

    def weight_of(self, level: int) -> int:
        """The level's share weight; 0: not shared (after the shared levels, in level order)."""
        return (self.level_weights or {}).get(level, 0)


# The `--qos-policy` presets (documented in inference-backend/README.md).
# latency-critical: small batches, a short wait, bounded low-priority queues
#   that shed load fast, and a reserved compute lane for level 1 (the
#   latency-critical class), so its p99 stays near batch-1 latency while
#   lower levels saturate the server.
# balanced: the default; batches up to 32, a 2 ms window, batch-class work
#   that waits past 1 s is delayed behind fresh work instead of failing.
# throughput: big batches and a 10 ms window; nothing is shed.
PRESETS: dict[str, BatcherSettings] = {
    "latency-critical": BatcherSettings(
        name="latency-critical", max_batch_size=8, preferred_batch_sizes=(4, 8),
        max_queue_delay_us=500, queue_policies={
            QosClass.STANDARD.priority_level: QueuePolicy(max_queue_size=256, default_timeout_us=200_000),
            QosClass.BATCH.priority_level: QueuePolicy(max_queue_size=64, default_timeout_us=100_000),
        }, reserved_lane_levels=QosClass.LATENCY_CRITICAL.priority_level),
    "balanced": BatcherSettings(
        name="balanced", max_batch_size=32, preferred_batch_sizes=(8, 16, 32),
        max_queue_delay_us=2_000, queue_policies={
            QosClass.BATCH.priority_level: QueuePolicy(max_queue_size=1024, default_timeout_us=1_000_000,
                                                       timeout_action="DELAY"),
        }),
    "throughput": BatcherSettings(
        name="throughput", max_batch_size=64, preferred_batch_sizes=(32, 64),
        max_queue_delay_us=10_000),
}
DEFAULT_PRESET = "balanced"


def preset(name: str) -> BatcherSettings:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown --qos-policy {name!r}; expected one of {', '.join(PRESETS)}") from None


def _int(spec: Mapping, key: str, path: str, problems: list, lo: int, hi: int) -> int | None:
    value = spec.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append((f"{path}.{key}", f"must be an integer, got {value!r}"))
        return None
    if not lo <= value <= hi:
        problems.append((f"{path}.{key}", f"must be in {lo}..{hi}, got {value}"))
        return None
    return value


_SPEC_FIELDS = {"selector", "qosPolicy", "maxBatchSize", "preferredBatchSize", "maxQueueDelayMicroseconds",
                "priorityLevels", "defaultPriorityLevel", "queuePolicies", "reservedLaneLevels",
                "reservedLaneThreads", "weightedShare", "classWeights", "freezeLowPriority"}
# The seed's routing fields (l7_routing.py); the batcher does not read them.
ROUTING_FIELDS = {"priority", "matchHeaders", "backendService"}
_QUEUE_FIELDS = {"maxQueueSize", "defaultTimeoutMicroseconds", "timeoutAction", "allowTimeoutOverride"}


def _bool(spec: Mapping, key: str, problems: list) -> bool | None:
    value = spec.get(key)
    if value is not None and not isinstance(value, bool):
        problems.append((f"spec.{key}", f"must be true or false, got {value!r}"))
        return None
    return value


SHARED_CLASSES = tuple(c.header_value for c in QosClass if c.priority_level > STRICT_LEVELS)


def _class_weights(raw, problems: list) -> dict[int, int] | None:
    """spec.classWeights {class: weight} -> {level: weight}; the strict classes take none."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        problems.append(("spec.classWeights", "must map a QoS class to a weight"))
        return None
    out = {}
    for name, weight in raw.items():
        path = f"spec.classWeights.{name}"
        if name not in SHARED_CLASSES:
            problems.append((path, f"not a class that shares batch slots; expected one of {', '.join(SHARED_CLASSES)}"
                                   " (latency-critical is strict: it always goes first)"))
        elif isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_CLASS_WEIGHT:
            problems.append((path, f"must be an integer in 1..{MAX_CLASS_WEIGHT}, got {weight!r}"))
        else:
            out[QosClass.parse(name).priority_level] = weight
    return out


def parse_spec(spec: Mapping[str, Any]) -> tuple[BatcherSettings | None, list[tuple[str, str]]]:
    """An L7SchedulingPolicy spec -> (settings, problems as (field path, message)).

    Fields left out come from `qosPolicy` (a preset name, default balanced).
    Settings are None whenever a problem is found: a policy is taken whole.
    """
    problems: list[tuple[str, str]] = []
    if not isinstance(spec, Mapping):
        return None, [("spec", "must be a mapping")]
    for key in spec:
        if key not in _SPEC_FIELDS and key not in ROUTING_FIELDS:
            problems.append((f"spec.{key}", "unknown field; expected one of "
                                            f"{', '.join(sorted(_SPEC_FIELDS | ROUTING_FIELDS))}"))
    selector = spec.get("selector")
    if selector is not None:
        labels = selector.get("matchLabels") if isinstance(selector, Mapping) else None
        if not isinstance(selector, Mapping) or set(selector) - {"matchLabels"} or (
                labels is not None and not (isinstance(labels, Mapping)
                                            and all(isinstance(v, str) for v in labels.values()))):
            problems.append(("spec.selector", "must be {matchLabels: {label: string}}"))
        elif labels is not None and len(labels) > MAX_LIST_ITEMS:
            problems.append(("spec.selector.matchLabels", f"at most {MAX_LIST_ITEMS} labels"))
    base_name = spec.get("qosPolicy", DEFAULT_PRESET)
    if base_name not in PRESETS:
        problems.append(("spec.qosPolicy", f"unknown preset {base_name!r}; expected one of {', '.join(PRESETS)}"))
        base = PRESETS[DEFAULT_PRESET]
    else:
        base = PRESETS[base_name]
    max_batch = _int(spec, "maxBatchSize", "spec", problems, 1, MAX_BATCH_SIZE_LIMIT)
    delay = _int(spec, "maxQueueDelayMicroseconds", "spec", problems, 0, MAX_QUEUE_DELAY_US_LIMIT)
    levels = _int(spec, "priorityLevels", "spec", problems, 1, MAX_PRIORITY_LEVELS)
    default_level = _int(spec, "defaultPriorityLevel", "spec", problems, 1, MAX_PRIORITY_LEVELS)
    lane = _int(spec, "reservedLaneLevels", "spec", problems, 0, MAX_PRIORITY_LEVELS)
    lane_threads = _int(spec, "reservedLaneThreads", "spec", problems, 1, MAX_LANE_THREADS)
    weighted, freeze = _bool(spec, "weightedShare", problems), _bool(spec, "freezeLowPriority", problems)
    weights = _class_weights(spec.get("classWeights"), problems)
    prefs = spec.get("preferredBatchSize")
    pref_tuple = None
    if prefs is not None:
        if not isinstance(prefs, list) or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 1
                                                  for p in prefs):
            problems.append(("spec.preferredBatchSize", f"must be a list of positive integers, got {prefs!r}"))
        elif len(prefs) > MAX_LIST_ITEMS:
            problems.append(("spec.preferredBatchSize", f"at most {MAX_LIST_ITEMS} sizes"))
        else:
            pref_tuple = tuple(sorted(set(prefs)))
    queues = None
    raw_queues = spec.get("queuePolicies")
    if raw_queues is not None:
        if not isinstance(raw_queues, Mapping):
            problems.append(("spec.queuePolicies", "must map a priority level to a queue policy"))
        else:
            queues = {}
            for key, q in raw_queues.items():
                path = f"spec.queuePolicies.{key}"
                try:
                    level = int(key)
                except (TypeError, ValueError):
                    problems.append((path, f"key must be a priority level (1 is the highest), got {key!r}"))
                    continue
                if not isinstance(q, Mapping):
                    problems.append((path, "must be a mapping"))
                    continue
                for k in q:
                    if k not in _QUEUE_FIELDS:
                        problems.append((f"{path}.{k}", f"unknown field; expected one of {', '.join(sorted(_QUEUE_FIELDS))}"))
                size = _int(q, "maxQueueSize", path, problems, 0, 10_000_000)
                timeout = _int(q, "defaultTimeoutMicroseconds", path, problems, 0, 3_600_000_000)
                action = q.get("timeoutAction", "REJECT")
                if action not in TIMEOUT_ACTIONS:
                    problems.append((f"{path}.timeoutAction", f"must be REJECT or DELAY, got {action!r}"))
                override = q.get("allowTimeoutOverride", False)
                if not isinstance(override, bool):
                    problems.append((f"{path}.allowTimeoutOverride", f"must be true or false, got {override!r}"))
                queues[level] = QueuePolicy(max_queue_size=size or 0, default_timeout_us=timeout or 0,
                                            timeout_action=action if action in TIMEOUT_ACTIONS else "REJECT",
                                            allow_timeout_override=bool(override))
    if problems:
        return None, problems
    overridden = set(spec) - {"qosPolicy", "selector"} - ROUTING_FIELDS
    level_weights = base.level_weights
    if weighted is False:
        level_weights = None
    elif weights:
        level_weights = {**(level_weights or Q.default_level_weights()), **weights}
    settings = replace(
        base, name=f"{base.name}+overrides" if overridden else base.name,
        max_batch_size=max_batch if max_batch is not None else base.max_batch_size,
        preferred_batch_sizes=pref_tuple if pref_tuple is not None else tuple(
            p for p in base.preferred_batch_sizes if p <= (max_batch or base.max_batch_size)),
        max_queue_delay_us=delay if delay is not None else base.max_queue_delay_us,
        priority_levels=levels if levels is not None else base.priority_levels,
        default_priority_level=default_level if default_level is not None else min(
            base.default_priority_level, levels or base.priority_levels),
        queue_policies=queues if queues is not None else {
            k: v for k, v in base.queue_policies.items() if k <= (levels or base.priority_levels)},
        reserved_lane_levels=lane if lane is not None else base.reserved_lane_levels,
        reserved_lane_threads=lane_threads if lane_threads is not None else base.reserved_lane_threads,
        level_weights=level_weights,
        freeze_levels=() if freeze is False else base.freeze_levels,
    )
    return settings, settings_problems(settings)


def settings_problems(s: BatcherSettings) -> list[tuple[str, str]]:
    """Cross-field rules, named by the L7SchedulingPolicy field they concern."""
    out = []
    if s.max_batch_size < 1:
        out.append(("spec.maxBatchSize", "must be at least 1"))
    for p in s.preferred_batch_sizes:
        if p > s.max_batch_size:
            out.append(("spec.preferredBatchSize", f"{p} exceeds maxBatchSize {s.max_batch_size}"))
    if not 1 <= s.default_priority_level <= s.priority_levels:
        out.append(("spec.defaultPriorityLevel",
                    f"must be in 1..priorityLevels ({s.priority_levels}), got {s.default_priority_level}"))
    for level in s.queue_policies:
        if not 1 <= level <= s.priority_levels:
            out.append((f"spec.queuePolicies.{level}", f"level outside 1..priorityLevels ({s.priority_levels})"))
    return out


def with_class_weight(settings: BatcherSettings, qos_class: str, weight) -> BatcherSettings:
    """`settings` with one class's batch-slot weight changed (the decision loop's class-weight
    action); ValueError names the field."""
    problems: list = []
    levels = _class_weights({qos_class: weight}, problems)
    if problems:
        raise ValueError("; ".join(f"{f}: {m}" for f, m in problems))
    return replace(settings, level_weights={**(settings.level_weights or Q.default_level_weights()), **levels})


def settings_from_spec(spec: Mapping[str, Any]) -> BatcherSettings:
    settings, problems = parse_spec(spec)
    if problems or settings is None:
        raise ValueError("; ".join(f"{f}: {m}" for f, m in problems))
    return settings


def selector_matches(spec: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a policy's selector.matchLabels picks a workload with `labels` (no selector: all)."""
    match = ((spec.get("selector") or {}).get("matchLabels")) or {}
    return all(labels.get(k) == v for k, v in match.items())
