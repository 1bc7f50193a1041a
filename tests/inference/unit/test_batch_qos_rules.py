"""The seed's QoS rules in the pure batch formation (inference-backend/batch_formation.py):
the weighted share between classes, freezing, and the reserved lane's two threads held for a
request's lifetime. Driven with explicit `now` values, as test_batch_formation.py is."""
from __future__ import annotations

import collections

from mcp26.mesh import qos as Q
from mcp26.mesh.batching_policy import BatcherSettings, parse_spec
from mcp26.inference.batch_formation import BatchFormation
from mcp26.inference.batch_queue import Pending

MS = 1_000_000
T0 = 1_000 * MS
HIGH, MEDIUM, LOW, CRITICAL = (Q.LLM_PRIORITY_CLASSES[n].header_value for n in ("high", "medium", "low", "critical"))


def formation(instances: int = 1, **settings) -> BatchFormation:
    return BatchFormation("m", BatcherSettings(**settings), idle_dispatch=True, instances=instances)


def arrive(f: BatchFormation, tag: str, qos_class: str, now: int = T0) -> Pending:
    p = Pending(inputs={}, outputs=(), rows=1, key=(4,), context={"tag": tag})
    f.enqueue(p, f.admit(p, qos_class, None, now))
    return p


def classes(batch) -> list[str]:
    return [p.context["tag"].split("/")[0] for p in batch]


def saturate(f: BatchFormation, per_class: dict[str, int], batches: int) -> collections.Counter:
    """Keep `per_class` requests of each class waiting; run `batches` batches on instance 0;
    -> batch slots per class."""
    slots = collections.Counter()
    n = 0
    for _ in range(batches):
        for cls, want in per_class.items():
            while sum(1 for p in f.queue.ordered() if p.context["tag"].startswith(cls + "/")) < want:
                n += 1
                arrive(f, f"{cls}/{n}", cls)
        turn = f.next_batch(T0)
        assert turn.batch, turn
        slots.update(classes(turn.batch))
        f.finished(turn.batch)
    return slots


# -- weighted share ----------------------------------------------------------------------------
def test_high_takes_three_batch_slots_to_the_default_classs_one_under_saturation():
    f = formation(max_batch_size=8)
    slots = saturate(f, {HIGH: 16, MEDIUM: 16}, batches=200)
    assert slots[HIGH] + slots[MEDIUM] == 1600
    ratio = slots[HIGH] / slots[MEDIUM]
    assert abs(ratio - 3.0) <= 0.3, slots                     # the bound: within 10 % of 3:1
    assert f.slots[2] == slots[HIGH] and f.slots[3] == slots[MEDIUM]


def test_each_batch_interleaves_the_classes_by_weight():
    f = formation(max_batch_size=8)
    for i in range(8):
        arrive(f, f"{MEDIUM}/{i}", MEDIUM)
    for i in range(8):
        arrive(f, f"{HIGH}/{i}", HIGH)
    assert collections.Counter(classes(f.next_batch(T0).batch)) == {HIGH: 6, MEDIUM: 2}


def test_a_class_weight_from_the_policy_changes_the_share():
    settings, problems = parse_spec({"classWeights": {"interactive": 1}, "maxBatchSize": 8})
    assert not problems
    f = BatchFormation("m", settings, idle_dispatch=True)
    slots = saturate(f, {HIGH: 16, MEDIUM: 16}, batches=50)
    assert slots[HIGH] == slots[MEDIUM] == 200


def test_low_takes_only_the_slots_medium_leaves_unless_a_policy_weighs_it():
    # Low has no share of its own: the seed's downgrade of Medium to Low must put that work behind
    f = formation(max_batch_size=8)
    assert saturate(f, {MEDIUM: 16, LOW: 16}, batches=20) == {MEDIUM: 160}
    settings, problems = parse_spec({"classWeights": {"batch": 1}, "maxBatchSize": 8})
    assert not problems
    f = BatchFormation("m", settings, idle_dispatch=True)
    assert saturate(f, {MEDIUM: 16, LOW: 16}, batches=20) == {MEDIUM: 80, LOW: 80}


def test_without_the_weighted_share_levels_go_strictly_in_order():
    f = formation(max_batch_size=8, level_weights=None)
    slots = saturate(f, {HIGH: 16, MEDIUM: 16}, batches=20)
    assert slots == {HIGH: 160}                                # Triton: level 2 starves level 3


def test_a_class_that_waited_nothing_banks_no_credit():
    f = formation(max_batch_size=4)
    saturate(f, {HIGH: 8}, batches=30)                         # High alone for 120 slots
    slots = saturate(f, {HIGH: 8, MEDIUM: 8}, batches=25)
    assert slots[MEDIUM] <= 30, slots                          # its share from now on, not 120 slots owed


def test_critical_is_strict_it_goes_before_any_share():
    f = formation(max_batch_size=4)
    for i in range(4):
        arrive(f, f"{HIGH}/{i}", HIGH)
    arrive(f, f"{CRITICAL}/0", CRITICAL)
    assert classes(f.next_batch(T0).batch)[0] == CRITICAL


# -- freezing ----------------------------------------------------------------------------------
def test_low_does_not_start_nor_ride_along_while_high_waits():
    f = formation(max_batch_size=8)
    for i in range(4):
        arrive(f, f"{LOW}/{i}", LOW)
    arrive(f, f"{HIGH}/0", HIGH)
    batch = f.next_batch(T0).batch
    assert classes(batch) == [HIGH]                            # not back-filled with Low
    assert f.freezes == 1
    f.finished(batch)
    assert classes(f.next_batch(T0).batch) == [LOW] * 4        # High gone: Low goes


def test_low_waits_while_high_computes_on_another_instance_and_a_running_low_batch_finishes():
    f = formation(instances=2, max_batch_size=4)
    arrive(f, f"{LOW}/0", LOW)
    low = f.next_batch(T0, instance=0).batch                   # Low computing on instance 0
    arrive(f, f"{HIGH}/0", HIGH)
    arrive(f, f"{LOW}/1", LOW)
    high = f.next_batch(T0, instance=1).batch
    assert classes(high) == [HIGH]
    f.finished(low)                                            # the running Low batch was not stopped
    turn = f.next_batch(T0, instance=0)
    assert turn.batch is None                                  # High still computing: Low frozen
    f.finished(high)
    assert classes(f.next_batch(T0, instance=0).batch) == [LOW]


def test_medium_is_not_frozen_and_freezing_can_be_switched_off():
    f = formation(max_batch_size=8)
    arrive(f, f"{HIGH}/0", HIGH)
    arrive(f, f"{MEDIUM}/0", MEDIUM)
    arrive(f, f"{LOW}/0", LOW)
    assert classes(f.next_batch(T0).batch) == [HIGH, MEDIUM]
    settings, problems = parse_spec({"freezeLowPriority": False})
    assert not problems and settings.freeze_levels == ()
    f = BatchFormation("m", settings, idle_dispatch=True)
    arrive(f, f"{HIGH}/0", HIGH)
    arrive(f, f"{LOW}/0", LOW)
    assert classes(f.next_batch(T0).batch) == [HIGH, LOW]


# -- the reserved lane: 2 threads, held while a Critical request lives ---------------------------
def test_two_lane_threads_run_two_critical_requests_at_once_beside_a_busy_main_instance():
    f = formation(max_batch_size=4, reserved_lane_levels=1)
    assert f.settings.reserved_lane_threads == Q.RESERVED_THREADS == 2
    arrive(f, f"{LOW}/0", LOW)
    low = f.next_batch(T0).batch                               # the main instance is busy
    assert f.reserved_threads() == 0                           # no Critical request: nothing held
    arrive(f, f"{CRITICAL}/0", CRITICAL)
    assert f.reserved_threads() == 2
    first = f.next_batch(T0, instance=0, lane=True).batch
    arrive(f, f"{CRITICAL}/1", CRITICAL)
    arrive(f, f"{MEDIUM}/0", MEDIUM)
    second = f.next_batch(T0, instance=1, lane=True).batch     # while the first still computes
    assert classes(first) == classes(second) == [CRITICAL]
    arrive(f, f"{CRITICAL}/2", CRITICAL)
    assert f.next_batch(T0, instance=2, lane=True).batch is None   # a third thread is no part of it
    f.lane_finished(first)
    assert f.reserved_threads() == 2                           # Critical requests still in the server
    third = f.next_batch(T0, instance=0, lane=True).batch
    assert classes(third) == [CRITICAL]
    assert f.next_batch(T0, instance=1, lane=True).batch is None   # Medium never runs on the lane
    f.lane_finished(second)
    f.lane_finished(third)
    assert f.reserved_threads() == 0                           # released when the last request ended
    f.finished(low)
    assert classes(f.next_batch(T0).batch) == [MEDIUM]
