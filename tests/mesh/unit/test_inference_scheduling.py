"""--qos-policy presets, L7SchedulingPolicy -> batcher settings, and its validator."""
from __future__ import annotations

import pytest

from mcp26.mesh.resources import MeshConfig
from mcp26.mesh.parse import parse_documents
from mcp26.mesh.qos import PRIORITY_LEVELS, QosClass
from mcp26.mesh.batching_policy import PRESETS, BatcherSettings, QueuePolicy, parse_spec, preset, settings_from_spec
from mcp26.mesh.validation import validate


def test_presets_are_valid_and_ordered_by_batch_size():
    for name, s in PRESETS.items():
        assert parse_spec({"qosPolicy": name}) == (s, [])
        assert s.priority_levels == PRIORITY_LEVELS
    sizes = [PRESETS[n].max_batch_size for n in ("latency-critical", "balanced", "throughput")]
    delays = [PRESETS[n].max_queue_delay_us for n in ("latency-critical", "balanced", "throughput")]
    assert sizes == sorted(sizes) and delays == sorted(delays)
    with pytest.raises(ValueError, match="unknown --qos-policy 'fast'"):
        preset("fast")


def test_level_from_qos_class_then_priority_parameter_then_default():
    s = BatcherSettings(priority_levels=4, default_priority_level=3)
    for c in QosClass:
        assert s.level_for(c.header_value) == c.priority_level
    assert s.level_for(None, 2) == 2
    assert s.level_for("batch", 1) == 4            # the mesh's class wins over the client's number
    assert s.level_for(None, 0) == 3 and s.level_for(None, 9) == 3   # Triton: 0 / out of range -> default
    assert BatcherSettings(priority_levels=2, default_priority_level=1).level_for("batch") == 2
    with pytest.raises(ValueError):
        s.level_for("gold")


def test_spec_overrides_a_preset():
    s = settings_from_spec({"qosPolicy": "throughput", "maxBatchSize": 16, "preferredBatchSize": [8, 4],
                            "maxQueueDelayMicroseconds": 100, "priorityLevels": 2, "defaultPriorityLevel": 2,
                            "queuePolicies": {1: {"maxQueueSize": 5, "defaultTimeoutMicroseconds": 10,
                                                  "timeoutAction": "DELAY", "allowTimeoutOverride": True}}})
    assert (s.max_batch_size, s.preferred_batch_sizes, s.max_queue_delay_us) == (16, (4, 8), 100)
    assert (s.priority_levels, s.default_priority_level) == (2, 2)
    assert s.policy_for(1) == QueuePolicy(5, 10, "DELAY", True) and s.policy_for(2) == QueuePolicy()
    assert s.name == "throughput+overrides"


def test_reserved_lane_is_on_for_latency_critical_and_a_spec_may_set_it():
    assert PRESETS["latency-critical"].reserved_lane_levels == QosClass.LATENCY_CRITICAL.priority_level
    assert PRESETS["balanced"].reserved_lane_levels == 0 and PRESETS["throughput"].reserved_lane_levels == 0
    assert settings_from_spec({"qosPolicy": "latency-critical", "reservedLaneLevels": 0}).reserved_lane_levels == 0
    assert settings_from_spec({"reservedLaneLevels": 2}).reserved_lane_levels == 2
    assert PRESETS["latency-critical"].describe()["reserved_lane_levels"] == 1
    _, problems = parse_spec({"reservedLaneLevels": 17})
    assert problems and problems[0][0] == "spec.reservedLaneLevels"


def test_command_line_overrides_keep_preferred_sizes_consistent():
    s = PRESETS["balanced"].with_overrides(max_batch_size=1)
    assert s.max_batch_size == 1 and s.preferred_batch_sizes == ()
    with pytest.raises(ValueError, match="maxBatchSize"):
        PRESETS["balanced"].with_overrides(max_batch_size=0)


@pytest.mark.parametrize("spec, field, words", [
    ({"maxBatchSize": 0}, "spec.maxBatchSize", "1..4096"),
    ({"maxBatchSize": "8"}, "spec.maxBatchSize", "integer"),
    ({"qosPolicy": "fast"}, "spec.qosPolicy", "unknown preset"),
    ({"preferredBatchSize": [64], "maxBatchSize": 8}, "spec.preferredBatchSize", "exceeds maxBatchSize"),
    ({"priorityLevels": 2, "defaultPriorityLevel": 3}, "spec.defaultPriorityLevel", "1..priorityLevels"),
    ({"queuePolicies": {7: {}}}, "spec.queuePolicies.7", "outside 1..priorityLevels"),
    ({"queuePolicies": {2: {"timeoutAction": "DROP"}}}, "spec.queuePolicies.2.timeoutAction", "REJECT or DELAY"),
    ({"queuePolicies": {2: {"maxQueueSize": -1}}}, "spec.queuePolicies.2.maxQueueSize", "0..10000000"),
    ({"queuePolicies": {"x": {}}}, "spec.queuePolicies.x", "priority level"),
    ({"maxBatch": 8}, "spec.maxBatch", "unknown field"),
    ({"selector": {"labels": {}}}, "spec.selector", "matchLabels"),
    ({"selector": {"matchLabels": {f"k{i}": "v" for i in range(65)}}}, "spec.selector.matchLabels", "at most 64"),
    ({"maxBatchSize": 4096, "preferredBatchSize": list(range(1, 66))}, "spec.preferredBatchSize", "at most 64"),
])
def test_bad_spec_names_the_field(spec, field, words):
    settings, problems = parse_spec(spec)
    assert settings is None or problems
    assert any(f == field and words in m for f, m in problems), problems


POLICY = """apiVersion: scheduling.mcp-mesh.io/v1alpha1
kind: L7SchedulingPolicy
metadata:
  name: pool
  namespace: inference
spec:
  selector:
    matchLabels: {app: mlp}
  maxBatchSize: 16
  queuePolicies:
    4:
      timeoutAction: DROP
"""


def test_validator_names_file_line_resource_and_field():
    config = MeshConfig(parse_documents(POLICY, file="policy.yaml"))
    diags = [d for d in validate(config) if d.severity == "error"]
    assert len(diags) == 1
    d = diags[0]
    assert (d.file, d.line, d.resource, d.field) == ("policy.yaml", 12, "L7SchedulingPolicy/inference/pool",
                                                     "spec.queuePolicies.4.timeoutAction")
    assert "REJECT or DELAY" in str(d) and str(d).startswith("policy.yaml:12:")


def test_validator_accepts_a_good_policy_and_checks_api_version():
    good = POLICY.replace("DROP", "DELAY")
    assert [d for d in validate(MeshConfig(parse_documents(good))) if d.severity == "error"] == []
    wrong = good.replace("v1alpha1", "v9")
    diags = validate(MeshConfig(parse_documents(wrong)))
    assert [d.field for d in diags] == ["apiVersion"]
