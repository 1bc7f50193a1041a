"""The response cache with a real Redis Cluster (3 shards, Debian's redis-server, each behind a
delay proxy: harness/redis_stack.py) shared by two real model servers:

- a miss is computed and kept, the same request is then a hit with the same answer bytes, and the
  other replica finds it in Redis (Triton's cache statistics say which);
- an entry poisoned in Redis (forged without the cache's key) is rejected and recomputed;
- Redis slowed to 500 ms under load: no request fails, the breaker opens within a second, the
  local cache answers meanwhile (`fallbacks`, the seed's cache_fallback), and it closes again
  once Redis is quick; Redis killed under load: the same."""
from __future__ import annotations

import http.client
import json
import os
import tempfile
import threading
import time
import urllib.request

import numpy as np
import pytest

from harness.redis_stack import RedisCluster, skip_reason
from mcp26.demo.stack.inference_server import InferenceServer
from mcp26.inference import response_cache as RC

pytestmark = pytest.mark.e2e

SECRET = b"a response-cache key for the test, 32+ bytes long"


@pytest.fixture(scope="module")
def stack():
    if skip_reason():
        pytest.skip(skip_reason())
    redis = RedisCluster(3).start()
    key_file = tempfile.NamedTemporaryFile(delete=False)
    key_file.write(SECRET)
    key_file.close()
    cfg = redis.cache_config(timeout_ms=50, failures=2, open_ms=500, hmac_key_file=key_file.name)
    servers = []
    try:
        for _ in range(2):
            servers.append(InferenceServer("builtin:mlp", "--cache-config", cfg,
                                           "--cache-config", "local,size=4194304").start())
        yield redis, servers
    finally:
        for s in servers:
            s.stop()
        redis.stop()
        os.unlink(key_file.name)


def inputs(seed: int) -> list[float]:
    return [float(x) for x in np.random.default_rng(seed).standard_normal(64).astype(np.float32)]


class Client:
    def __init__(self, server):
        self.conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)

    def infer(self, data: list[float]) -> tuple[int, dict]:
        body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 64], "datatype": "FP32", "data": data}]})
        self.conn.request("POST", "/v2/models/mlp/infer", body=body, headers={"content-type": "application/json"})
        r = self.conn.getresponse()
        return r.status, json.loads(r.read() or b"{}")


def stats(server) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/v2/models/mlp/stats", timeout=5) as r:
        return json.load(r)["model_stats"][0]["inference_stats"]


def cache_status(server) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.admin_port}/admin/status", timeout=5) as r:
        return json.load(r)["response_cache"]


def test_a_miss_is_kept_the_same_request_hits_with_the_same_bytes_and_the_other_replica_finds_it(stack):
    redis, (a, b) = stack
    data = inputs(1)
    before = stats(a)
    status, first = Client(a).infer(data)
    assert status == 200
    status, again = Client(a).infer(data)
    assert status == 200 and again["outputs"] == first["outputs"]
    after = stats(a)
    assert after["cache_miss"]["count"] == before["cache_miss"]["count"] + 1
    assert after["cache_hit"]["count"] == before["cache_hit"]["count"] + 1 and after["cache_hit"]["ns"] > 0
    # the other replica: not in its local cache, in Redis
    hits = cache_status(b)["models"].get("mlp", {}).get("redis_hits", 0)
    status, there = Client(b).infer(data)
    assert status == 200 and there["outputs"] == first["outputs"]
    assert cache_status(b)["models"]["mlp"]["redis_hits"] == hits + 1
    # a different input is a miss
    status, other = Client(a).infer(inputs(2))
    assert status == 200 and other["outputs"] != first["outputs"]
    assert stats(a)["cache_miss"]["count"] == after["cache_miss"]["count"] + 1


@pytest.mark.adversarial
def test_an_entry_poisoned_in_redis_is_rejected_and_the_answer_recomputed(stack):
    redis, (a, b) = stack
    data = inputs(3)
    status, truth = Client(a).infer(data)                     # computed, kept in Redis and in a's LRU
    assert status == 200
    digest = RC.cache_key("mlp", "1", {"INPUT0": np.array(data, np.float32).reshape(1, 64)}, ())
    client = redis.client()
    key = RC.KEY_PREFIX + digest.hex()
    assert client.get(key) is not None                        # the server computed the key the test does
    body = RC.encode(digest, {"OUTPUT0": np.zeros((1, 16), np.float32)}, b"")[:-32]
    client.set(key, body + RC._mac(b"not the cache's key", body))     # forged: right layout, wrong MAC
    rejected = cache_status(b)["models"].get("mlp", {}).get("rejected", 0)
    status, got = Client(b).infer(data)
    assert status == 200 and got["outputs"] == truth["outputs"]
    assert cache_status(b)["models"]["mlp"]["rejected"] == rejected + 1
    deadline = time.monotonic() + 5                           # dropped from Redis, then the right one kept again
    while True:
        blob = client.get(key)
        try:
            if blob is not None and RC.decode(blob, digest, SECRET):
                break
        except RC.CorruptEntry:
            pass
        assert time.monotonic() < deadline, "the recomputed answer was not kept"
        time.sleep(0.05)
    client.close()


def _load(server, stop: threading.Event, statuses: list, seeds) -> None:
    c = Client(server)
    for seed in seeds:
        if stop.is_set():
            return
        statuses.append(c.infer(inputs(seed))[0])


def _wait_state(server, want: str, since: float, timeout: float) -> float:
    deadline = since + timeout
    while True:
        if cache_status(server)["breaker"]["state"] == want:
            return time.monotonic() - since
        assert time.monotonic() < deadline, f"breaker not {want} after {timeout} s: {cache_status(server)}"
        time.sleep(0.01)


def _metric(server, name: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.admin_port}/metrics", timeout=5) as r:
        return "\n".join(line for line in r.read().decode().splitlines() if line.startswith(name))


def test_redis_slowed_to_500_ms_under_load_fails_nothing_and_the_breaker_opens_within_a_second(stack):
    redis, (a, b) = stack
    warm = inputs(500)
    assert Client(a).infer(warm)[0] == 200                    # in a's local cache from now on
    stop, statuses = threading.Event(), []
    threads = [threading.Thread(target=_load, args=(a, stop, statuses, range(1000 + 1000 * i, 2000 + 1000 * i)))
               for i in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        t0 = time.monotonic()
        redis.set_delay(0.5)
        opened = _wait_state(a, "open", t0, 1.0)
        assert opened < 1.0
        assert 'mcp_inference_response_cache_breaker_state{state="open"} 1.0' in _metric(a, "mcp_inference_response_cache_breaker_state")
        fallbacks = cache_status(a)["models"]["mlp"]["fallbacks"]
        status, _ = Client(a).infer(warm)                      # answered by the local cache meanwhile
        assert status == 200 and cache_status(a)["models"]["mlp"]["fallbacks"] > fallbacks
        time.sleep(1.5)                                        # probes while slow: they fail, it stays open
        assert cache_status(a)["breaker"]["state"] in ("open", "half-open")
        redis.set_delay(0)
        _wait_state(a, "closed", time.monotonic(), 5.0)        # a probe found Redis quick again
    finally:
        redis.set_delay(0)
        stop.set()
        for t in threads:
            t.join(30)
    assert len(statuses) > 50 and set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}


def test_a_request_waits_for_a_slow_redis_no_longer_than_timeout_ms(stack):
    """Closed, tripping and half-open alike, a request whose lookup Redis does not answer within
    timeout_ms is answered from the local cache then - not when redis-py gives up, which for a
    Cluster client is after it has also asked each node for the topology (~4x timeout_ms)."""
    redis, _ = stack
    c = InferenceServer("builtin:mlp", "--cache-config", redis.cache_config(timeout_ms=250, failures=2, open_ms=500),
                        "--cache-config", "local,size=4194304").start()
    try:
        x = inputs(4242)
        status, first = Client(c).infer(x)                          # computed, kept locally and in Redis
        assert status == 200 and Client(c).infer(x)[1]["outputs"] == first["outputs"]
        redis.set_delay(2.0)
        took = []
        for _ in range(4):                                          # closed, closed (opens), open, a probe
            t = time.monotonic()
            status, got = Client(c).infer(x)
            took.append(time.monotonic() - t)
            assert status == 200 and got["outputs"] == first["outputs"]
            time.sleep(0.3)
        assert cache_status(c)["models"]["mlp"]["late"] >= 1          # (a lookup may also lose the race to its own socket timeout)
        assert max(took) < 0.6, [round(t, 3) for t in took]
    finally:
        redis.set_delay(0)
        c.stop()


def test_redis_killed_under_load_fails_nothing_and_the_breaker_opens_within_a_second(stack):
    redis, (a, b) = stack
    stop, statuses = threading.Event(), []
    threads = [threading.Thread(target=_load, args=(b, stop, statuses, range(9000 + 1000 * i, 10000 + 1000 * i)))
               for i in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        t0 = time.monotonic()
        redis.kill()
        assert _wait_state(b, "open", t0, 1.0) < 1.0
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert len(statuses) > 50 and set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
    assert cache_status(b)["breaker"]["opens"] >= 1
