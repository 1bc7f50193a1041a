"""The decision loop's class remap: the contract's JSON, the compiled filter applying it
until its expiry (and signing the class it gives), the control plane's parsing."""
import os
import time

import pytest

from mcp26.mesh import headers as H
from mcp26.mesh import qos as Q
from mcp26.mesh.header_contract import ClassRemap, parse_plugin_config
from mcp26.mesh.session import verify_session
from mcp26.wasm import HEADER_CONTRACT_WASM
from mcp26.wasm.host import ProxyWasmHost
from mcp26.xds.class_remaps import ClassRemaps, parse_remap

KEY = bytes(range(32))
BASE = [(":method", "GET"), (":path", "/v1/completions"), (":authority", "mesh")]


def _contract(remaps=()):
    return parse_plugin_config({"sessionKeyHex": KEY.hex()}).with_class_remaps(remaps)


def test_no_remap_leaves_the_json_as_before():
    assert "remap" not in _contract().filter_config()["qos"]
    r = ClassRemap(Q.QosClass.STANDARD, Q.QosClass.BATCH, 1700000000.5)
    assert _contract([r]).filter_config()["qos"]["remap"] == [
        {"from": "standard", "to": "batch", "until_ns": 1700000000500000000}]


@pytest.mark.skipif(not os.path.exists(HEADER_CONTRACT_WASM), reason="run `make wasm` first")
def test_filter_applies_the_remap_until_it_expires_and_signs_it():
    until = time.time() + 60
    h = ProxyWasmHost()
    assert h.configure(_contract([ClassRemap(Q.QosClass.STANDARD, Q.QosClass.BATCH, until)]).filter_json()), h.logs
    h.now_ns = int((until - 1) * 1e9)
    r = h.request(BASE)                                   # anonymous: standard by default
    assert r.all(H.QOS_CLASS) == ["batch"]
    assert verify_session(r.headers, KEY, now=until - 1).signed == {H.QOS_CLASS: "batch"}
    r = h.request(BASE + [(H.LLM_PRIORITY, "high")])     # another class is not remapped
    assert r.all(H.QOS_CLASS) != ["batch"]
    h.now_ns = int((until + 1) * 1e9)                     # expired: the filter's own clock decides
    assert h.request(BASE).all(H.QOS_CLASS) == ["standard"]


@pytest.mark.skipif(not os.path.exists(HEADER_CONTRACT_WASM), reason="run `make wasm` first")
def test_the_seeds_downgrade_hits_medium_requests_and_only_them():
    """"All Medium tasks to Low": the built-in table's remap, as the filter applies it to what
    clients send as X-LLM-Priority."""
    from mcp26.scheduler.loop.builtin_policy import REMAP_FROM, REMAP_TO
    until = time.time() + 60
    h = ProxyWasmHost()
    remap = ClassRemap(Q.QosClass.parse(REMAP_FROM), Q.QosClass.parse(REMAP_TO), until)
    assert h.configure(_contract([remap]).filter_json()), h.logs
    h.now_ns = int((until - 1) * 1e9)
    low = Q.LLM_PRIORITY_CLASSES["low"].header_value
    got = {name: h.request(BASE + [(H.LLM_PRIORITY, name)]).all(H.QOS_CLASS) for name in Q.LLM_PRIORITY_NAMES}
    assert got == {"critical": ["latency-critical"], "high": ["interactive"], "medium": [low], "low": [low]}


@pytest.mark.skipif(not os.path.exists(HEADER_CONTRACT_WASM), reason="run `make wasm` first")
def test_filter_refuses_a_remap_to_an_unknown_class():
    h = ProxyWasmHost()
    cfg = _contract([ClassRemap(Q.QosClass.STANDARD, Q.QosClass.BATCH, time.time() + 5)]).filter_json()
    assert not h.configure(cfg.replace('"to":"batch"', '"to":"bulk"'))


def test_control_plane_parses_and_expires_remaps():
    now = time.time()
    r = parse_remap({"from": "standard", "to": "batch", "expires_at": now + 2}, now)
    assert (r.from_class, r.to_class) == (Q.QosClass.STANDARD, Q.QosClass.BATCH)
    for bad in ({"from": "standard", "to": "batch", "expires_at": now - 1},
                {"from": "standard", "to": "bulk", "expires_at": now + 1},
                {"from": "standard", "to": "standard", "expires_at": now + 1},
                {"from": "standard", "to": "batch"}, []):
        with pytest.raises(ValueError):
            parse_remap(bad, now)
    store = ClassRemaps()
    store.put(r)
    assert store.active(now) == (r,)
    assert store.active(now + 3) == ()
    assert store.drop_expired(now + 3) and not store.drop_expired(now + 3)
