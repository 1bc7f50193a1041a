"""mcp26.mesh.header_contract: the filter JSON comes from mcp26.mesh's definitions, not from C."""
from mcp26.mesh import headers as H
from mcp26.mesh import qos as Q
from mcp26.mesh.error_classes import DEFAULT_ERROR_CLASS_MAP
from mcp26.mesh.header_contract import parse_plugin_config

KEY = {"sessionKeyHex": "ab" * 32}


def test_filter_config_carries_mesh_classes_levels_headers_and_error_map():
    c = parse_plugin_config({**KEY, "errorClasses": {"UNAVAILABLE": "overload"}}).filter_config()
    assert c["qos"]["classes"] == [{"name": q.header_value, "level": q.priority_level} for q in Q.QosClass]
    assert c["qos"]["priority"] == {n: cls.header_value for n, cls in Q.LLM_PRIORITY_CLASSES.items()}
    assert c["qos"]["protocol"] == {"HTTP/2": Q.ALPN_CLASSES["h2"].header_value}
    assert c["qos"]["header"] == H.QOS_CLASS and c["qos"]["priority_header"] == H.LLM_PRIORITY
    assert c["errors"]["grpc"]["14"] == "overload"
    assert c["errors"]["grpc"]["4"] == DEFAULT_ERROR_CLASS_MAP[4]
    assert set(c["strip"]) >= {H.END_USER, H.TENANT, H.SESSION_SIG, H.QOS_CLASS, H.DOWNSTREAM_SERVICE_CLUSTER}
    assert c["session"] == {"header": H.SESSION_SIG, "signed": [H.END_USER, H.TENANT, H.QOS_CLASS], "key": "ab" * 32}


def test_custom_claims_and_tenant_claim():
    c = parse_plugin_config({**KEY, "tenantClaim": "org", "claims": [{"claim": "email", "header": "x-mcp-email"}]})
    assert c.claims == [("sub", H.END_USER), ("org", H.TENANT), ("email", "x-mcp-email")]
    assert "x-mcp-email" in c.signed_headers and "x-mcp-email" in c.stripped_headers
    merged = c.with_claims([("grp", "x-jwt-group"), ("email", "x-mcp-email")])
    assert merged.claims[-1] == ("grp", "x-jwt-group") and len(merged.claims) == 4
