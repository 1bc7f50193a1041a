from mcp26.mesh import qos


def test_alpn_dscp_contract():
    assert qos.ALPN_DSCP == {"h2": 46, "grpc-exp": 34}


def test_classes_round_trip_and_tos_byte():
    for c in qos.QosClass:
        assert qos.QosClass.parse(c.header_value) is c
        assert c.tos >> 2 == c.dscp
    assert qos.LLM_PRIORITY_CLASSES["high"].weight == 3
    assert sorted(c.priority_level for c in qos.QosClass) == list(range(1, qos.PRIORITY_LEVELS + 1))
