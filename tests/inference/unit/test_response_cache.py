"""The response cache's pure parts (inference-backend/response_cache.py): the key, the verified
entry format against hostile bytes, the byte-bounded LRU, the circuit breaker on a fake clock,
and Triton's --cache-config. Redis itself: tests/inference/e2e/test_response_cache_redis.py."""
from __future__ import annotations

import numpy as np
import pytest

from mcp26.inference import response_cache as RC

X = {"INPUT0": np.arange(64, dtype=np.float32).reshape(1, 64)}
KEY = b"k" * 32


def test_the_key_covers_model_version_outputs_and_every_input_byte_shape_and_dtype():
    base = RC.cache_key("mlp", "1", X, ())
    assert RC.cache_key("mlp", "1", {"INPUT0": X["INPUT0"].copy()}, ()) == base     # equal inputs: one entry
    changed = X["INPUT0"].copy()
    changed[0, 63] = np.nextafter(changed[0, 63], np.float32(1e9))                    # one ulp of one element
    others = [RC.cache_key("mlp", "2", X, ()), RC.cache_key("mlp2", "1", X, ()),
              RC.cache_key("mlp", "1", X, ("OUTPUT0",)), RC.cache_key("mlp", "1", {"INPUT0": changed}, ()),
              RC.cache_key("mlp", "1", {"INPUT0": X["INPUT0"].reshape(2, 32)}, ()),
              RC.cache_key("mlp", "1", {"INPUT0": X["INPUT0"].astype(np.float64)}, ()),
              RC.cache_key("mlp", "1", {"INPUT1": X["INPUT0"]}, ())]
    assert len({base, *others}) == len(others) + 1


def test_an_entry_gives_back_the_exact_bytes():
    out = {"OUTPUT0": np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32),
           "IDS": np.array([[1, 2]], dtype=np.int64), "OK": np.array([True, False])}
    d = RC.cache_key("m", "1", X, ())
    back = RC.decode(RC.encode(d, out, KEY), d, KEY)
    assert list(back) == list(out)
    for name in out:
        assert back[name].dtype == out[name].dtype and back[name].shape == out[name].shape
        assert back[name].tobytes() == out[name].tobytes()


@pytest.mark.adversarial
def test_poisoned_and_corrupt_entries_are_rejected_saying_why():
    d, other = RC.cache_key("m", "1", X, ()), RC.cache_key("m", "1", X, ("y",))
    good = RC.encode(d, {"y": np.ones((1, 4), np.float32)}, KEY)
    flipped = bytearray(good)
    flipped[60] ^= 1
    forged_body = good[:-32].replace(np.ones((1, 4), np.float32).tobytes(), np.zeros((1, 4), np.float32).tobytes())
    cases = {
        "truncated": good[:20],
        "MAC mismatch": bytes(flipped),                                      # a bit flipped on the way
        "MAC mismatch ": forged_body + RC._mac(b"another key", forged_body),  # forged without the cache's key
        "key mismatch": RC.encode(other, {"y": np.ones((1, 4), np.float32)}, KEY),   # another request's answer
        "not a response-cache entry": b"XXXX" + good[4:-32] + RC._mac(KEY, b"XXXX" + good[4:-32]),
        "dtype": _entry(d, b"|O8", b"\0" * 8),                              # an object array: never unpickled
        "bytes for shape": _entry(d, b"<f4", b"\0" * 12),                   # 12 bytes for 4 floats
        "trailing": good[:-32] + b"!" + RC._mac(KEY, good[:-32] + b"!"),
        "nothing": b"",
    }
    for why, blob in cases.items():
        with pytest.raises(RC.CorruptEntry, match=why.strip().split()[0] if why != "nothing" else "truncated"):
            RC.decode(blob, d, KEY)
    assert RC.decode(good, d, KEY)["y"].tolist() == [[1.0] * 4]


def _entry(digest: bytes, dtype: bytes, data: bytes) -> bytes:
    import struct
    body = (RC.MAGIC + digest + struct.pack("<H", 1) + RC._OUT.pack(1, len(dtype), 2) + b"y" + dtype
            + RC._DIM.pack(1) + RC._DIM.pack(4) + RC._DIM.pack(len(data)) + data)
    return body + RC._mac(KEY, body)


def test_the_local_lru_is_bounded_in_bytes_and_evicts_the_least_recently_used():
    lru = RC.LocalLRU(300)
    for k in (b"a", b"b", b"c"):
        lru.put(k, k * 100)
    assert lru.bytes == 300 and len(lru) == 3
    lru.get(b"a")                                    # a is now the most recent
    lru.put(b"d", b"d" * 100)
    assert lru.get(b"b") is None and lru.get(b"a") and lru.evictions == 1 and lru.bytes == 300
    lru.put(b"huge", b"h" * 301)                     # larger than the whole cache: not kept, nothing evicted
    assert lru.get(b"huge") is None and len(lru) == 3


def test_the_breaker_opens_on_failures_probes_once_half_open_and_closes_on_success():
    now = [100.0]
    b = RC.CircuitBreaker(failures=2, open_s=1.0, clock=lambda: now[0])
    assert b.allow() == "closed"
    b.failure()
    assert b.state == "closed" and b.allow() == "closed"       # one failure is not two
    b.failure()
    assert b.state == "open" and b.allow() is None and b.opens == 1
    now[0] += 0.99
    assert b.allow() is None
    now[0] += 0.02
    assert b.allow() == "probe" and b.state == "half-open"
    assert b.allow() is None                                  # one probe at a time
    b.failure()                                               # the probe failed: open again, for another second
    assert b.state == "open" and b.opens == 2 and b.allow() is None
    now[0] += 1.0
    assert b.allow() == "probe"
    b.success()
    assert b.state == "closed" and b.allow() == "closed" and b.failures == 0
    assert [s for _, s in b.transitions] == ["open", "half-open", "open", "half-open", "closed"]


@pytest.mark.parametrize("items, message", [
    (["memcache,host=x"], "the caches are local and redis"),
    (["local,size=-5"], "positive number of bytes"),
    (["local,size=10,ttl=3"], "unknown key"),
    (["redis,port=6379"], "host= is required"),
    (["redis,host=h,port=http"], "a positive integer"),
    (["redis,host=h,cluster=maybe"], "true or false"),
    (["redis,host=h,sharding=1"], "unknown key"),
    (["redis,host"], "NAME,KEY=VALUE"),
])
def test_bad_cache_config_is_refused_naming_the_key(items, message):
    with pytest.raises(ValueError, match=message):
        RC.parse_cache_config(items)


def test_cache_config_merges_repeats_as_tritons_flag_does():
    c = RC.parse_cache_config(["local,size=1048576", "redis,host=127.0.0.1", "redis,port=7000,cluster=true"])
    assert c.local_bytes == 1 << 20 and c.redis == {"host": "127.0.0.1", "port": "7000", "cluster": "true"}
    assert RC.parse_cache_config([]) is None
