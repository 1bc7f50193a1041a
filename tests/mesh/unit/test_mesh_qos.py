from mcp26.mesh import qos


def test_alpn_dscp_contract():
    assert qos.ALPN_DSCP == {"h2": 46, "grpc-exp": 34}


def test_classes_round_trip_and_tos_byte():
    for c in qos.QosClass:
        assert qos.QosClass.parse(c.header_value) is c
        assert c.tos >> 2 == c.dscp
    assert sorted(c.priority_level for c in qos.QosClass) == list(range(1, qos.PRIORITY_LEVELS + 1))


def test_the_seeds_four_names_map_one_to_a_class_in_level_order():
    names = qos.LLM_PRIORITY_NAMES
    assert names == ("critical", "high", "medium", "low")
    assert [qos.LLM_PRIORITY_CLASSES[n].priority_level for n in names] == [1, 2, 3, 4]
    assert len({qos.LLM_PRIORITY_CLASSES[n] for n in names}) == 4


def test_the_decision_tables_rules_name_the_classes_of_the_seeds_names():
    # "all Medium tasks to Low": a request without the header is Medium too
    assert qos.DOWNGRADE_FROM is qos.LLM_PRIORITY_CLASSES["medium"] is qos.DEFAULT_QOS_CLASS
    assert qos.DOWNGRADE_TO is qos.LLM_PRIORITY_CLASSES["low"]
    assert qos.UPGRADE_TO is qos.LLM_PRIORITY_CLASSES["critical"] and qos.RESERVED_THREADS == 2
    # "high raises the thread weight to 3x" the default class's
    high, default = qos.LLM_PRIORITY_CLASSES["high"], qos.DEFAULT_QOS_CLASS
    assert high.weight == 3 * default.weight
    # "freezes low-priority inference" while Critical or High work waits
    assert qos.FROZEN_LEVELS == (qos.LLM_PRIORITY_CLASSES["low"].priority_level,)
    assert set(qos.FREEZE_WHILE_LEVELS) == {qos.LLM_PRIORITY_CLASSES[n].priority_level for n in ("critical", "high")}
    assert qos.default_level_weights() == {2: 3, 3: 1}         # Low: not shared, behind them
