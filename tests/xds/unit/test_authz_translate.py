"""AuthorizationPolicy -> Envoy RBAC / ext_authz, compared with what istiod builds.

The fixtures in tests/data/authz are written in the style of Istio's own
golden files (pilot/pkg/security/authz/builder/testdata/http): a policy set
in, the HttpFilters out as YAML (protobuf JSON names). Istio keeps the JWT
payload under `payload`; this mesh under JWT_PAYLOAD_METADATA_KEY.
"""
import json
import os

import pytest
import yaml
from google.protobuf import json_format
from envoy.config.rbac.v3 import rbac_pb2
from envoy.extensions.filters.http.ext_authz.v3 import ext_authz_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2 as rbac_http

from mcp26.mesh.header_contract import JWT_PAYLOAD_METADATA_KEY
from mcp26.mesh.parse import parse_documents
from mcp26.mesh.resources import MeshConfig
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.translate import Phase, http_filters, rbac
from harness.paths import TEST_DATA

DATA = os.path.join(TEST_DATA, "authz")
CART = ProxyNode(id="cart", namespace="shop", labels={"app": "cart"})


def cfg(text: str) -> MeshConfig:
    return MeshConfig(parse_documents(text, file="t.yaml"))


def filters(config, node=CART, phase=Phase.AUTHZ):
    return rbac.http_filters(config, node, 8080, phase)


def rbac_of(f) -> rbac_http.RBAC:
    out = rbac_http.RBAC()
    assert f.typed_config.Unpack(out)
    return out


def policy(name, spec, ns="shop", annotations=None):
    meta = {"name": name, "namespace": ns}
    if annotations:
        meta["annotations"] = annotations
    return yaml.safe_dump({"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
                           "metadata": meta, "spec": spec}) + "---\n"


@pytest.mark.parametrize("case,outs", [
    ("deny-and-allow", ["deny-and-allow-out1", "deny-and-allow-out2"]),
    ("claims-and-principals", ["claims-and-principals-out"]),
])
def test_golden(case, outs):
    with open(os.path.join(DATA, f"{case}-in.yaml")) as f:
        got = [json_format.MessageToDict(x) for x in filters(cfg(f.read()))]
    want = []
    for o in outs:
        with open(os.path.join(DATA, f"{o}.yaml")) as f:
            want.append(yaml.safe_load(f))
    assert got == want


def test_allow_without_rules_matches_nothing_so_denies_all():
    (f,) = filters(cfg(policy("allow-nothing", {})))
    r = rbac_of(f).rules
    assert r.action == rbac_pb2.RBAC.ALLOW
    p = r.policies["ns[shop]-policy[allow-nothing]-rule[0]"]
    assert p.permissions[0].not_rule.any and p.principals[0].not_id.any


def test_empty_rule_matches_everything():
    (f,) = filters(cfg(policy("allow-all", {"rules": [{}]})))
    p = rbac_of(f).rules.policies["ns[shop]-policy[allow-all]-rule[0]"]
    assert p.permissions[0].and_rules.rules[0].any and p.principals[0].and_ids.ids[0].any


def test_order_custom_audit_deny_allow_and_actions():
    provider = json.dumps({"name": "authz", "envoyExtAuthzHttp": {"service": "authz.shop.svc.cluster.local",
                                                                   "port": 9000}})
    se = ("apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: authz, namespace: shop}\n"
          "spec: {hosts: [authz.shop.svc.cluster.local], ports: [{number: 9000, name: http, protocol: HTTP}],"
          " resolution: DNS}\n---\n")
    text = (policy("a", {"rules": [{}]}) + policy("d", {"action": "DENY", "rules": [{}]})
            + policy("l", {"action": "AUDIT", "rules": [{}]})
            + policy("c", {"action": "CUSTOM", "provider": {"name": "authz"}, "rules": [{}]},
                     annotations={"mcp-mesh.io/extension-provider": provider}) + se)
    got = filters(cfg(text))
    assert [f.name for f in got] == ["envoy.filters.http.rbac", "envoy.filters.http.ext_authz"] + \
        ["envoy.filters.http.rbac"] * 3
    custom = rbac_of(got[0])
    assert not custom.HasField("rules") and custom.shadow_rules_stat_prefix == "istio_ext_authz_"
    assert list(custom.shadow_rules.policies) == ["istio-ext-authz-authz-ns[shop]-policy[c]-rule[0]"]
    ext = ext_authz_pb2.ExtAuthz()
    got[1].typed_config.Unpack(ext)
    assert ext.http_service.server_uri.cluster == "outbound|9000||authz.shop.svc.cluster.local"
    assert ext.filter_enabled_metadata.value.string_match.prefix == "istio-ext-authz-authz"
    assert [rbac_of(f).rules.action for f in got[2:]] == [rbac_pb2.RBAC.LOG, rbac_pb2.RBAC.DENY, rbac_pb2.RBAC.ALLOW]


def test_custom_with_unknown_provider_denies_its_rules():
    text = policy("c", {"action": "CUSTOM", "provider": {"name": "nowhere"}, "rules": [{"to": [
        {"operation": {"paths": ["/admin"]}}]}]})
    (f,) = filters(cfg(text))
    r = rbac_of(f).rules
    assert r.action == rbac_pb2.RBAC.DENY
    assert list(r.policies) == ["istio-ext-authz-nowhere-ns[shop]-policy[c]-rule[0]-deny-due-to-bad-CUSTOM-action"]


def test_dry_run_goes_to_shadow_rules():
    (f,) = filters(cfg(policy("d", {"action": "DENY", "rules": [{}]}, annotations={"istio.io/dry-run": "true"})))
    r = rbac_of(f)
    assert not r.HasField("rules") and list(r.shadow_rules.policies) == ["ns[shop]-policy[d]-rule[0]"]
    assert r.shadow_rules_stat_prefix == "istio_dry_run_deny_"


def test_selection_root_namespace_selector_and_target_ref():
    text = (policy("mesh-wide", {"action": "DENY", "rules": [{}]}, ns="istio-system")
            + policy("other-ns", {"action": "DENY", "rules": [{}]}, ns="billing")
            + policy("other-app", {"selector": {"matchLabels": {"app": "web"}}, "rules": [{}]})
            + policy("gw-ref", {"targetRefs": [{"kind": "Gateway", "group": "gateway.networking.k8s.io",
                                                "name": "gw"}], "rules": [{}]}))
    config = cfg(text)
    assert [r.name for r in rbac.policies(config, CART)] == ["mesh-wide"]
    web = ProxyNode(id="web", namespace="billing", labels={"app": "web"})
    assert [r.name for r in rbac.policies(config, web)] == ["other-ns", "mesh-wide"]


def test_only_authz_phase_and_not_proxyless():
    config = cfg(policy("d", {"action": "DENY", "rules": [{}]}))
    assert all(filters(config, phase=p) == [] for p in Phase if p is not Phase.AUTHZ)
    grpc = ProxyNode(id="g", namespace="shop", kind="grpc")
    assert http_filters.phase_filters(config, grpc, 8080) == []


def test_rbac_after_jwt_authn_and_authz_wasm_in_the_chain():
    ra = ("apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {name: ra, namespace: shop}\n"
          "spec:\n  jwtRules: [{issuer: https://idp.test, jwksUri: 'http://127.0.0.1:9/jwks'}]\n---\n")
    names = [f.name for f in http_filters.phase_filters(cfg(ra + policy("d", {"action": "DENY", "rules": [{}]})),
                                                        CART, 8080)]
    assert names.index("envoy.filters.http.jwt_authn") < names.index("envoy.filters.http.rbac")


def test_request_principal_forms_split_at_last_slash():
    text = policy("p", {"rules": [{"from": [{"source": {"requestPrincipals": [
        "https://idp.test/path/alice", "https://idp.test/*", "*"]}}]}]})
    (f,) = filters(cfg(text))
    ids = rbac_of(f).rules.policies["ns[shop]-policy[p]-rule[0]"].principals[0].and_ids.ids[0].or_ids.ids
    pairs = [[(m.metadata.path[1].key, json_format.MessageToDict(m.metadata.value.string_match))
              for m in a.and_ids.ids] for a in ids]
    assert all(m.metadata.path[0].key == JWT_PAYLOAD_METADATA_KEY for a in ids for m in a.and_ids.ids)
    assert pairs == [
        [("iss", {"exact": "https://idp.test/path"}), ("sub", {"exact": "alice"})],
        [("iss", {"exact": "https://idp.test"}), ("sub", {"safeRegex": {"regex": ".+"}})],
        [("iss", {"safeRegex": {"regex": ".+"}}), ("sub", {"safeRegex": {"regex": ".+"}})],
    ]


def test_path_template_and_deny_drops_only_the_bad_value():
    text = policy("t", {"rules": [{"to": [{"operation": {"paths": ["/api/{*}/items/{**}"]}}]}]}) + \
        policy("d", {"action": "DENY", "rules": [{"from": [{"source": {"ipBlocks": ["bad", "10.0.0.1"]}}]}]})
    deny, allow = filters(cfg(text))
    perm = rbac_of(allow).rules.policies["ns[shop]-policy[t]-rule[0]"].permissions[0].and_rules.rules[0]
    assert perm.or_rules.rules[0].uri_template.name == "uri-template"
    ids = rbac_of(deny).rules.policies["ns[shop]-policy[d]-rule[0]"].principals[0].and_ids.ids[0].or_ids.ids
    assert [i.direct_remote_ip.address_prefix for i in ids] == ["10.0.0.1"]
