"""Property-based fuzzing of the compiled module: headers, claims and configs.

Whatever arrives, the module never traps, never lets a spoofed session, QoS
or identity header through, never lets another tenant's header through, and
what it signs always verifies with mesh.session.
"""
import json
import os
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcp26.mesh import headers as H
from mcp26.mesh.header_contract import is_token, parse_plugin_config
from mcp26.mesh.qos import QOS_CLASS_NAMES
from mcp26.mesh.session import carriable, verify_session
from mcp26.wasm import HEADER_CONTRACT_WASM
from mcp26.wasm.host import ProxyWasmHost

pytestmark = pytest.mark.skipif(not os.path.exists(HEADER_CONTRACT_WASM), reason="run `make wasm` first")

KEY = b"fuzz-key-0123456789abcdef-fuzz!!"
PLUGIN = {"sessionKeyHex": KEY.hex(), "tenants": {"acme": {"allowedHeaders": ["x-tenant-acme-*"]},
                                                  "beta": {"allowedHeaders": ["x-tenant-beta-x"], "strict": True}},
          "qos": {"tiers": {"free": "batch", "gold": "latency-critical"}}}
CONTRACT = parse_plugin_config(PLUGIN)
MESH_SET = set(CONTRACT.stripped_headers)
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

token_chars = string.ascii_lowercase + string.digits + "-_.!#$%&'*+^`|~"
names = st.one_of(
    st.sampled_from(sorted(MESH_SET) + ["x-tenant-acme-a", "x-tenant-beta-x", "x-tenant-evil", "x-tenant-",
                                        "x-llm-priority", "content-type", "x-custom"]),
    st.text(token_chars, min_size=1, max_size=40),
    st.text(st.characters(min_codepoint=1, max_codepoint=255), min_size=1, max_size=20),   # may be invalid
)
values = st.text(st.characters(min_codepoint=0, max_codepoint=255), max_size=200)
claim_values = st.one_of(st.text(st.characters(min_codepoint=0, max_codepoint=255), max_size=300),
                         st.binary(max_size=64))
claims = st.dictionaries(st.sampled_from(["sub", "tenant", "tier", "email"]), claim_values, max_size=4)
priorities = st.one_of(st.none(), st.sampled_from(["high", "medium", "normal", "low", "HIGH", "", "x"]))
protocols = st.sampled_from([b"HTTP/1.1", b"HTTP/2", b"HTTP/3", b"", b"\x00\xff"])


@pytest.fixture(scope="module")
def host():
    h = ProxyWasmHost()
    assert h.configure(CONTRACT.filter_json())
    return h


def _safe(v) -> bool:
    return carriable(v)   # mesh.session's rule, which the filter must follow


@FUZZ
@given(headers=st.lists(st.tuples(names, values), max_size=30), claims=claims, priority=priorities, proto=protocols)
def test_no_trap_no_spoofed_header_and_the_signature_verifies(host, headers, claims, priority, proto):
    sent = [(":method", "GET"), (":path", "/")] + [(k.lower(), v) for k, v in headers]
    if priority is not None:
        sent.append(("x-llm-priority", priority))
    claims = {k: (v.encode("latin-1") if isinstance(v, str) else v) for k, v in claims.items()}
    r = host.request(sent, properties={("request", "protocol"): proto}, metadata=claims)   # a trap raises here

    bad_name = any(not is_token(k) for k, _ in sent if not k.startswith(":"))
    if r.local_response is not None:
        assert bad_name and r.local_response.status == 400
        return
    assert not bad_name
    out = r.headers
    want = {}
    for claim, header in CONTRACT.claims:
        if claim in claims and _safe(claims[claim]):
            want[header] = claims[claim].decode("latin-1")
    for h in MESH_SET:
        got = [v for k, v in out if k == h]
        if h in want:
            assert got == [want[h]]
        elif h == H.QOS_CLASS:
            assert len(got) == 1 and got[0] in QOS_CLASS_NAMES
        elif h == H.SESSION_SIG:
            assert len(got) == 1
        else:
            assert got == [], f"client's {h} leaked"
    tenant = want.get(H.TENANT)
    allowed = CONTRACT.tenants[tenant].allowed_headers if tenant in CONTRACT.tenants else []
    for k, _ in out:
        if k.startswith(H.TENANT_HEADER_PREFIX):
            assert any(k == a or (a.endswith("*") and k.startswith(a[:-1])) for a in allowed), k
    verify_session(out, KEY, required=[h for _, h in CONTRACT.claims])


def _mutations():
    base = CONTRACT.filter_config()
    leaf = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.text(max_size=20)),
                        lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=8), c, max_size=4)),
                        max_leaves=8)
    paths = []

    def walk(node, path):
        paths.append(path)
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, path + (k,))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, path + (i,))
    walk(base, ())
    return st.lists(st.tuples(st.sampled_from(paths[1:]), st.one_of(st.just("<delete>"), leaf)), min_size=1, max_size=3)


@FUZZ
@given(mutations=_mutations())
def test_mutated_configs_are_accepted_or_rejected_never_trap(mutations):
    cfg = CONTRACT.filter_config()
    for path, value in mutations:
        node = cfg
        try:
            for p in path[:-1]:
                node = node[p]
            if value == "<delete>":
                del node[path[-1]]
            else:
                node[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue
    h = ProxyWasmHost()
    ok = h.configure(json.dumps(cfg))
    r = h.request([(":path", "/"), (H.END_USER, "admin")], metadata={"sub": "jane"})
    if ok:
        assert r.local_response is None
        assert r.all(H.END_USER) in (["jane"], [])   # never the client's value
        assert "admin" not in r.all(H.END_USER)
    else:
        assert r.local_response.status == 500         # fail closed


@FUZZ
@given(raw=st.binary(max_size=600))
def test_random_bytes_as_config_never_trap(raw):
    h = ProxyWasmHost()
    assert not h.configure(raw) or raw.strip().startswith(b"{")


@FUZZ
@given(payload=st.binary(max_size=300))
def test_malformed_payload_metadata_never_traps_or_leaks(host, payload):
    from mcp26.mesh.header_contract import PAYLOAD_PROPERTY
    r = host.request([(":path", "/"), (H.END_USER, "admin")], properties={PAYLOAD_PROPERTY: payload})
    if r.local_response is None:
        assert "admin" not in r.all(H.END_USER)
        verify_session(r.headers, KEY, required=[h for _, h in CONTRACT.claims], method="")   # no :method sent
