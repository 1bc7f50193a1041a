"""The compiled header-contract module, run in the wasmtime Proxy-Wasm host."""
import json
import os

import pytest

from mcp26.mesh import headers as H
from mcp26.mesh.header_contract import ContractError, parse_plugin_config
from mcp26.mesh.session import SessionError, sign, verify_session
from mcp26.wasm import HEADER_CONTRACT_WASM
from mcp26.wasm.host import CONTINUE, PAUSE, ProxyWasmHost

pytestmark = pytest.mark.skipif(not os.path.exists(HEADER_CONTRACT_WASM), reason="run `make wasm` first")

KEY = bytes(range(32))
PLUGIN = {
    "sessionKeyHex": KEY.hex(),
    "claims": [{"claim": "email", "header": "x-mcp-email"}],
    "tenants": {
        "acme": {"allowedHeaders": ["x-tenant-acme-*", "x-tenant-shared"]},
        "globex": {"allowedHeaders": ["x-tenant-globex-*"], "strict": True},
    },
    "qos": {"tiers": {"free": "standard", "pro": "interactive", "enterprise": "latency-critical"}},
    "errorClasses": {"RESOURCE_EXHAUSTED": "overload", "5": "unavailable"},
    "httpErrorClasses": {"429": "overload"},
}
BASE = [(":method", "GET"), (":path", "/v2/models/m/infer"), (":authority", "mesh"), ("content-type", "application/json")]


@pytest.fixture(scope="module")
def host():
    h = ProxyWasmHost()
    assert h.configure(parse_plugin_config(PLUGIN).filter_json()), h.logs
    return h


def test_claims_become_session_headers_and_the_signature_is_mesh_sessions(host):
    r = host.request(BASE, metadata={"sub": "jane", "tenant": "acme", "email": "jane@acme.test"})
    assert r.action == CONTINUE and r.local_response is None
    assert (r.get(H.END_USER), r.get(H.TENANT), r.get("x-mcp-email")) == ("jane", "acme", "jane@acme.test")
    s = verify_session(r.headers, KEY, required=(H.END_USER, H.TENANT, "x-mcp-email"))
    assert s.signed == {H.END_USER: "jane", H.TENANT: "acme", H.QOS_CLASS: "standard", "x-mcp-email": "jane@acme.test"}
    # byte for byte the Python signer's output
    assert r.get(H.SESSION_SIG) == sign([(n, s.signed[n]) for n in s.signed], KEY, method="GET", request_id="",
                                        issued_at=s.issued_at)


def test_client_sent_session_qos_and_identity_headers_never_pass(host):
    spoofed = BASE + [(H.END_USER, "admin"), (H.END_USER, "root"), (H.TENANT, "globex"), (H.QOS_CLASS, "latency-critical"),
                      (H.SESSION_SIG, "v1;h=end-user;s=" + "0" * 64), (H.DOWNSTREAM_SERVICE_CLUSTER, "billing"),
                      ("x-mcp-email", "ceo@acme.test")]
    r = host.request(spoofed)   # no token: jwt_authn left no payload
    names = [k for k, _ in r.headers]
    for h in (H.END_USER, H.TENANT, "x-mcp-email", H.DOWNSTREAM_SERVICE_CLUSTER):
        assert h not in names
    assert r.all(H.QOS_CLASS) == ["standard"]
    assert verify_session(r.headers, KEY).signed == {H.QOS_CLASS: "standard"}
    # with a token the claim wins over the client's copy, once
    r = host.request(spoofed, metadata={"sub": "jane", "tenant": "acme"})
    assert r.all(H.END_USER) == ["jane"] and r.all(H.TENANT) == ["acme"]


def test_other_tenants_headers_are_removed_own_whitelist_kept(host):
    hdrs = BASE + [("x-tenant-acme-region", "eu"), ("x-tenant-shared", "1"), ("x-tenant-globex-secret", "s"),
                   ("x-custom", "kept")]
    r = host.request(hdrs, metadata={"sub": "jane", "tenant": "acme"})
    names = [k for k, _ in r.headers]
    assert "x-tenant-acme-region" in names and "x-tenant-shared" in names and "x-custom" in names
    assert "x-tenant-globex-secret" not in names
    anon = host.request(hdrs)
    assert not [k for k, _ in anon.headers if k.startswith("x-tenant-")]


def test_strict_tenant_keeps_only_its_whitelist_and_common_headers(host):
    hdrs = BASE + [("x-tenant-globex-a", "1"), ("x-custom", "dropped"), ("user-agent", "t"), ("x-llm-priority", "low")]
    r = host.request(hdrs, metadata={"sub": "bob", "tenant": "globex"})
    names = {k for k, _ in r.headers}
    assert {"x-tenant-globex-a", "user-agent", "content-type", "x-llm-priority", ":path"} <= names
    assert "x-custom" not in names


@pytest.mark.parametrize("name", ["bad header", "x-a\x01", "x(y)", "ümlaut"])
def test_non_token_header_names_are_rejected_400(host, name):
    r = host.request(BASE + [(name, "v")])
    assert r.action == PAUSE and r.local_response.status == 400


@pytest.mark.parametrize("priority, tier, protocol, want", [
    ("critical", None, "HTTP/1.1", "latency-critical"),  # the seed's four names (mesh.qos's table)
    ("high", None, "HTTP/1.1", "interactive"),           # the seed: high -> the weight x3 class
    ("medium", None, "HTTP/1.1", "standard"),            # the class the memory rule downgrades
    ("low", None, "HTTP/2", "batch"),
    ("HIGH ", None, "HTTP/1.1", "standard"),               # exact token, not trimmed: no match -> protocol/default
    ("high", "free", "HTTP/1.1", "standard"),             # a free tier caps what it may ask
    ("high", "pro", "HTTP/2", "interactive"),
    ("low", "enterprise", "HTTP/2", "batch"),             # asking for less is always allowed
    (None, None, "HTTP/2", "latency-critical"),           # h2 -> EF class when nothing is asked
    (None, "free", "HTTP/2", "standard"),
    (None, None, "HTTP/1.1", "standard"),                 # the default
    ("bogus", None, "HTTP/1.1", "standard"),
])
def test_qos_class_from_priority_tier_and_protocol(host, priority, tier, protocol, want):
    hdrs = BASE + ([("x-llm-priority", priority)] if priority else [])
    claims = {"sub": "u", **({"tier": tier} if tier else {})}
    r = host.request(hdrs, properties={("request", "protocol"): protocol.encode()}, metadata=claims)
    assert r.get(H.QOS_CLASS) == want


@pytest.mark.parametrize("route_class, priority, tier, want", [
    ("latency-critical", None, None, "latency-critical"),   # an L7SchedulingPolicy route's class
    ("interactive", "low", None, "interactive"),             # the operator's, over the client's X-LLM-Priority
    ("batch", "critical", None, "batch"),
    ("latency-critical", None, "free", "standard"),          # the caller's tier still caps it
    ("platinum", "low", None, "batch"),                      # not a class: as if the route had none
    (None, "low", None, "batch"),
])
def test_the_class_of_an_l7schedulingpolicy_route_is_asked_for_and_signed(host, route_class, priority, tier, want):
    from mcp26.mesh.header_contract import ROUTE_CLASS_PROPERTY
    props = {("request", "protocol"): b"HTTP/1.1"}
    if route_class:
        props[ROUTE_CLASS_PROPERTY] = route_class.encode()
    hdrs = BASE + ([("x-llm-priority", priority)] if priority else [])
    r = host.request(hdrs, properties=props, metadata={"sub": "u", **({"tier": tier} if tier else {})})
    assert r.get(H.QOS_CLASS) == want
    assert verify_session(r.headers, KEY).qos_class == want


@pytest.mark.parametrize("alpn, priority, tier, protocol, want", [
    ("grpc-exp", None, None, "HTTP/2", "interactive"),        # the listener's ALPN, not the codec's HTTP/2
    ("h2", None, None, "HTTP/2", "latency-critical"),
    ("h2", None, None, "HTTP/1.1", "latency-critical"),       # the header, not request.protocol, decides
    ("http/1.1", None, None, "HTTP/2", "standard"),           # an ALPN without a class: the default, no fallback
    ("grpc-exp", "low", None, "HTTP/2", "batch"),             # X-LLM-Priority still comes first
    ("grpc-exp", "critical", None, "HTTP/2", "latency-critical"),
    ("h2", None, "free", "HTTP/2", "standard"),               # the tier still caps it
    ("grpc-exp", None, "enterprise", "HTTP/2", "interactive"),
    (None, None, None, "HTTP/2", "latency-critical"),         # no header (plaintext, h2c): request.protocol
])
def test_qos_class_from_the_downstream_alpn_header(host, alpn, priority, tier, protocol, want):
    from mcp26.mesh.qos import ALPN_CLASSES
    assert {"h2", "grpc-exp"} <= set(ALPN_CLASSES)
    hdrs = BASE + ([(H.DOWNSTREAM_ALPN, alpn)] if alpn else []) + ([("x-llm-priority", priority)] if priority else [])
    claims = {"sub": "u", **({"tier": tier} if tier else {})}
    r = host.request(hdrs, properties={("request", "protocol"): protocol.encode()}, metadata=claims)
    assert r.get(H.QOS_CLASS) == want
    assert r.get(H.DOWNSTREAM_ALPN) is None                   # read, then never passed upstream
    verify_session(r.headers, KEY)


def test_the_alpn_header_comes_from_the_generated_config_only():
    cfg = json.loads(parse_plugin_config(PLUGIN).filter_json())
    assert cfg["qos"]["alpn_header"] == H.DOWNSTREAM_ALPN and H.DOWNSTREAM_ALPN in cfg["strip"]
    cfg["qos"]["alpn_header"] = "x-other-alpn"
    h = ProxyWasmHost()
    assert not h.configure(json.dumps(cfg))                   # must also be stripped
    cfg["strip"].append("x-other-alpn")
    h = ProxyWasmHost()
    assert h.configure(json.dumps(cfg)), h.logs
    proto = {("request", "protocol"): b"HTTP/1.1"}
    assert h.request(BASE + [("x-other-alpn", "grpc-exp")], properties=proto).get(H.QOS_CLASS) == "interactive"
    assert h.request(BASE + [(H.DOWNSTREAM_ALPN, "grpc-exp")], properties=proto).get(H.QOS_CLASS) == "standard"


def test_non_string_or_unsafe_claims_are_not_written(host):
    r = host.request(BASE, metadata={"sub": b"\x00\x00\x00\x00\x00\x00\xf0\x3f", "tenant": "a\r\nx-evil: 1"})
    assert r.get(H.END_USER) is None and r.get(H.TENANT) is None


@pytest.mark.parametrize("response, trailers, want_header, want_trailer", [
    ([(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "14")], None, "unavailable", None),
    ([(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "8")], None, "overload", None),
    ([(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "5")], None, "unavailable", None),
    ([(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "99")], None, "server", None),
    ([(":status", "200"), ("content-type", "application/grpc"), (H.ERROR_CLASS, "ok")], [("grpc-status", "4")], None, "timeout"),
    ([(":status", "429"), (H.ERROR_CLASS, "ok")], None, "overload", None),
    ([(":status", "404")], None, "client", None),
    ([(":status", "503")], None, "server", None),
    ([(":status", "200")], None, "ok", None),
])
def test_error_class_from_grpc_status_or_http_status(host, response, trailers, want_header, want_trailer):
    r = host.request(BASE, response=response, trailers=trailers)
    got = [v for k, v in r.response if k == H.ERROR_CLASS]
    assert got == ([want_header] if want_header else [])
    if trailers is not None:
        assert [v for k, v in r.trailers if k == H.ERROR_CLASS] == [want_trailer]


def test_a_session_header_changed_after_the_filter_fails_the_backend_check(host):
    r = host.request(BASE, metadata={"sub": "jane", "tenant": "acme"})
    changed = [(k, "admin" if k == H.END_USER else v) for k, v in r.headers]
    with pytest.raises(SessionError):
        verify_session(changed, KEY)


@pytest.mark.parametrize("config, why", [
    ("", "no plugin configuration"),
    ("{", "expected a string key"),
    ("{\"v\":1,", "expected a string key"),
    ('{"v":2}', "version"),
    ("[]", "JSON object"),
])
def test_bad_configuration_fails_closed(config, why):
    h = ProxyWasmHost()
    assert not h.configure(config)
    assert any(why in m for _, m in h.logs), h.logs
    r = h.request(BASE + [(H.END_USER, "admin")])
    assert r.local_response and r.local_response.status == 500


@pytest.mark.parametrize("mutate, why", [
    (lambda c: c["session"].update(key="abcd"), "session.key"),
    (lambda c: c["session"].update(key="zz" * 32), "hex"),
    (lambda c: c["strip"].append("Bad Name"), "RFC 7230"),
    (lambda c: c["qos"].update(default="platinum"), "unknown QoS class"),
    (lambda c: c["qos"]["tiers"].update(free="nope"), "unknown QoS class"),
    (lambda c: c["errors"]["grpc"].update({"17": "server"}), "0..16"),
    (lambda c: c.pop("tenant"), "tenant"),
    (lambda c: c["strip"].remove(H.SESSION_SIG), "session.header must also be stripped"),
    (lambda c: c["claims"].append({"claim": "x", "header": "x-unstripped"}), "also be stripped"),
])
def test_each_bad_field_is_rejected_by_the_module_itself(mutate, why):
    cfg = parse_plugin_config(PLUGIN).filter_config()
    mutate(cfg)
    h = ProxyWasmHost()
    assert not h.configure(json.dumps(cfg))
    assert any(why in m for _, m in h.logs), h.logs


def test_a_failed_reconfigure_drops_the_old_configuration():
    h = ProxyWasmHost()
    assert h.configure(parse_plugin_config(PLUGIN).filter_json())
    assert h.request(BASE).local_response is None
    assert not h.configure("{}")
    assert h.request(BASE).local_response.status == 500


def test_streams_do_not_leak_memory(host):
    for _ in range(50):
        host.request(BASE + [("x-tenant-acme-a", "1")] * 10, metadata={"sub": "jane", "tenant": "acme"},
                     response=[(":status", "200")])
    size = host.memory_size()
    for _ in range(2000):
        host.request(BASE + [("x-tenant-acme-a", "1")] * 10, metadata={"sub": "jane", "tenant": "acme"},
                     response=[(":status", "200")])
    assert host.memory_size() == size


def test_identity_header_comes_from_the_verified_peer_certificate_only(host):
    spiffe = "spiffe://cluster.local/ns/default/sa/frontend"
    r = host.request(BASE + [(H.DOWNSTREAM_SERVICE_CLUSTER, "billing")],
                     properties={("connection", "uri_san_peer_certificate"): spiffe.encode()})
    assert r.all(H.DOWNSTREAM_SERVICE_CLUSTER) == [spiffe]
    r = host.request(BASE + [(H.DOWNSTREAM_SERVICE_CLUSTER, "billing")])   # plaintext: no identity at all
    assert r.all(H.DOWNSTREAM_SERVICE_CLUSTER) == []


def test_host_calls_follow_what_changes_not_how_many_headers_came(host):
    def calls(extra):
        before = host.host_calls
        host.request(BASE + [(H.END_USER, "admin"), ("x-tenant-globex-a", "1")] + extra, metadata={"sub": "jane", "tenant": "acme"})
        return host.host_calls - before
    few = calls([])
    assert calls([(f"x-plain-{i}", "v") for i in range(60)]) == few
    # pairs, payload, route class, protocol, identity, clock, 2 removes, 4 replaces (end-user, tenant, class, signature)
    assert few == 12


@pytest.mark.parametrize("length, ok", [(128, True), (129, False), (5000, False)])
def test_long_header_names_in_the_config_are_bounded(length, ok):
    name = "x-" + "a" * (length - 2)
    cfg = parse_plugin_config({**PLUGIN, "claims": [{"claim": "c%d" % i, "header": f"{name[:-2]}{i:02d}"} for i in range(13)]}) if ok else None
    if not ok:   # mcpctl validate refuses it first; the module also refuses it on its own
        with pytest.raises(ContractError, match="at most 128"):
            parse_plugin_config({**PLUGIN, "claims": [{"claim": "c", "header": name}]})
        cfg = parse_plugin_config(PLUGIN).filter_config()
        cfg["claims"].append({"claim": "c", "header": name})
        cfg["strip"].append(name)
        h = ProxyWasmHost()
        assert not h.configure(json.dumps(cfg))
        return
    h = ProxyWasmHost()
    assert h.configure(cfg.filter_json()) == ok, h.logs
    if ok:
        r = h.request(BASE, metadata={"sub": "jane", **{"c%d" % i: "v" for i in range(13)}})
        s = verify_session(r.headers, KEY)
        assert len(s.signed) == 15   # end-user, qos class, 13 claim headers (no tenant claim sent)


def test_a_token_with_many_claims_still_yields_its_session(host):
    claims = {f"claim{i}": "x" for i in range(300)} | {"sub": "jane", "tenant": "acme"}
    r = host.request(BASE, metadata=claims)
    assert (r.get(H.END_USER), r.get(H.TENANT)) == ("jane", "acme")


# ---- v2: the signature is bound to the request (issue time, method, x-request-id)

def test_the_signature_is_v2_bound_to_time_method_and_request_id_byte_for_byte(host):
    host.now_ns = 1_700_000_000_999_999_999
    try:
        r = host.request([(":method", "POST")] + BASE[1:] + [("x-request-id", "rid-1")],
                         metadata={"sub": "jane", "tenant": "acme"})
    finally:
        host.now_ns = None
    want = sign([(H.END_USER, "jane"), (H.TENANT, "acme"), (H.QOS_CLASS, "standard")], KEY,
                method="POST", request_id="rid-1", issued_at=1_700_000_000)
    assert r.get(H.SESSION_SIG) == want
    assert verify_session(r.headers, KEY, now=1_700_000_010).end_user == "jane"
    with pytest.raises(SessionError, match="expired"):
        verify_session(r.headers, KEY, now=1_700_000_000 + 3600)


def test_a_captured_header_set_replayed_on_another_request_is_refused(host):
    r = host.request(BASE + [("x-request-id", "victim")], metadata={"sub": "jane", "tenant": "acme"})
    verify_session(r.headers, KEY)
    captured = [(k, v) for k, v in r.headers if k in (H.END_USER, H.TENANT, H.QOS_CLASS, H.SESSION_SIG)]
    for other in ([("x-request-id", "attacker")], []):
        with pytest.raises(SessionError, match="another request"):
            verify_session([(":method", "GET")] + other + captured, KEY)
    with pytest.raises(SessionError, match="another request"):   # same id, other method
        verify_session([(":method", "DELETE"), ("x-request-id", "victim")] + captured, KEY)


def test_anonymous_signatures_are_no_longer_a_constant(host):
    a = host.request(BASE + [("x-request-id", "1")]).get(H.SESSION_SIG)
    b = host.request(BASE + [("x-request-id", "2")]).get(H.SESSION_SIG)
    assert a != b


def test_two_request_ids_get_400(host):
    r = host.request(BASE + [("x-request-id", "a"), ("x-request-id", "b")], metadata={"sub": "jane"})
    assert r.local_response is not None and r.local_response.status == 400


@pytest.mark.parametrize("sub", [" jane ", "jane\t", "\tjane", " "])
def test_a_claim_with_whitespace_at_an_end_is_neither_written_nor_signed(host, sub):
    r = host.request(BASE, metadata={"sub": sub, "tenant": "acme"})
    assert r.local_response is None
    assert r.get(H.END_USER) is None and r.get(H.TENANT) == "acme"
    s = verify_session(r.headers, KEY)
    assert H.END_USER not in s.signed
    assert any("claim value is not carried" in m for _, m in r.logs)
    inner = host.request(BASE, metadata={"sub": "jane doe", "tenant": "acme"})   # inner spaces are fine
    assert inner.get(H.END_USER) == "jane doe"
