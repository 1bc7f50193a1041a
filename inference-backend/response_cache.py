"""The response cache: Triton's (`response_cache { enable: true }` in a model's config,
`--cache-config local,size=BYTES` or the Redis cache) with the seed's production rule on top -
a circuit breaker that falls back to the local cache while Redis is slow or down.

Key: SHA-256 over the model's name and version, the requested outputs (in the order asked) and
every input tensor exactly - its name, dtype, shape and bytes (Triton hashes the same). A decoder
(its sequences keep KV state) and sequence requests are never cached, nor parameters that do not
change the answer (priority, timeout): two requests with equal inputs share one entry.

Tiers. `local`: an LRU bounded in bytes (the entries' encoded size), in this process. `redis`:
a Redis server or Redis Cluster (redis-py, `cluster=true`) shared by every replica - then Redis
is the cache, as in the seed's production case (and Triton's Redis cache), and the local LRU is
its fallback: kept warm (every answer stored, every Redis hit copied in), read only while the
breaker is open.

Entries are verified, never trusted: an entry is `MAGIC | key digest | outputs | MAC`, the MAC an
HMAC-SHA256 over the rest with `hmac_key_file`'s key (without one, a plain SHA-256: corruption is
caught, a forger with Redis write access is not - a warning at start says so). An entry whose MAC,
key, layout, dtype (numbers and bool only: nothing is unpickled) or sizes do not check out is
rejected (counted in `rejected`), deleted where it was, and the request computes as a miss.

Circuit breaker (`CircuitBreaker`): every Redis call has `timeout_ms`; `failures` consecutive
timeouts or errors open it. Open: Redis is not called, the local LRU serves (`fallbacks`, the
seed's `cache_fallback`). After `open_ms` one request probes Redis (half-open): success closes the
breaker, failure opens it again for another `open_ms`. A cache failure never fails a request.

Threads. Redis calls run on a small pool of their own, never on the event loop, and a request
waits for its lookup at most `timeout_ms` (then it is served as with the breaker open: `late`;
ServedModel._remote_lookup). Local lookups run inline. A lookup still waiting for the pool when
the breaker opens, or when its request stopped waiting, does not call Redis.
"""
from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import hmac
import logging
import struct
import threading
import time
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger("mcp26.inference")

MAGIC = b"MRC1"
_OUT = struct.Struct("<HBB")              # name length, dtype length, ndim
_DIM = struct.Struct("<Q")
ALLOWED_DTYPES = frozenset(np.dtype(t).str for t in ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32",
                                                     "int64", "uint64", "float16", "float32", "float64"))
DEFAULT_LOCAL_BYTES = 64 << 20            # the local LRU in front of Redis when --cache-config local is not given
KEY_PREFIX = "mcp26:rc:"


class CorruptEntry(ValueError):
    """An entry that does not verify (its reason is the message)."""


# -- configuration (Triton's --cache-config) ---------------------------------------------------------
@dataclass(frozen=True)
class CacheConfig:
    local_bytes: int = DEFAULT_LOCAL_BYTES
    redis: dict = field(default_factory=dict)      # host, port, cluster, timeout_ms, failures, open_ms, ttl_s, ...

    @property
    def timeout_s(self) -> float:
        return int(self.redis.get("timeout_ms", 50)) / 1e3


_REDIS_KEYS = {"host", "port", "cluster", "timeout_ms", "failures", "open_ms", "ttl_s", "hmac_key_file", "password",
               "workers"}


def parse_cache_config(items: list[str]) -> CacheConfig | None:
    """`--cache-config NAME,KEY=VALUE[,KEY=VALUE...]`, repeatable (Triton's), NAME local or redis;
    None when none is given. ValueError names the flag and the key."""
    if not items:
        return None
    local, redis = None, {}
    for item in items:
        name, _, rest = item.partition(",")
        pairs = {}
        for kv in filter(None, rest.split(",")):
            k, sep, v = kv.partition("=")
            if not sep or not k:
                raise ValueError(f"--cache-config {item!r}: expected NAME,KEY=VALUE[,KEY=VALUE...]")
            pairs[k.strip()] = v.strip()
        if name == "local":
            if set(pairs) - {"size"}:
                raise ValueError(f"--cache-config local: unknown key(s) {', '.join(sorted(set(pairs) - {'size'}))}")
            if "size" in pairs:
                if not pairs["size"].isdigit() or int(pairs["size"]) <= 0:
                    raise ValueError(f"--cache-config local,size={pairs['size']}: a positive number of bytes")
                local = int(pairs["size"])
        elif name == "redis":
            unknown = set(pairs) - _REDIS_KEYS
            if unknown:
                raise ValueError(f"--cache-config redis: unknown key(s) {', '.join(sorted(unknown))}; "
                                 f"expected {', '.join(sorted(_REDIS_KEYS))}")
            for k in ("port", "timeout_ms", "failures", "open_ms", "ttl_s", "workers"):
                if k in pairs and (not pairs[k].isdigit() or (int(pairs[k]) <= 0 and k != "ttl_s")):
                    raise ValueError(f"--cache-config redis,{k}={pairs[k]}: a positive integer")
            if pairs.get("cluster", "false") not in ("true", "false"):
                raise ValueError(f"--cache-config redis,cluster={pairs['cluster']}: true or false")
            redis.update(pairs)
        else:
            raise ValueError(f"--cache-config {name!r}: the caches are local and redis")
    if redis and "host" not in redis:
        raise ValueError("--cache-config redis: host= is required")
    return CacheConfig(local or DEFAULT_LOCAL_BYTES, redis)


# -- key and entries ---------------------------------------------------------------------------------
def cache_key(model: str, version: str, inputs: dict, outputs: tuple) -> bytes:
    """The digest of everything the answer depends on (module docstring)."""
    h = hashlib.sha256(b"mcp26-response-cache-v1\0")
    for part in (model, version, *outputs):
        h.update(part.encode() + b"\0")
    h.update(b"\1")
    for name in sorted(inputs):
        a = np.ascontiguousarray(inputs[name])
        h.update(f"{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(memoryview(a).cast("B"))
    return h.digest()


def encode(digest: bytes, outputs: dict, secret: bytes) -> bytes:
    parts = [MAGIC, digest, struct.pack("<H", len(outputs))]
    for name, arr in outputs.items():
        a = np.ascontiguousarray(arr)
        if a.dtype.str not in ALLOWED_DTYPES:
            raise ValueError(f"output {name!r} of dtype {a.dtype} is not cached")
        n, d = name.encode(), a.dtype.str.encode()
        parts += [_OUT.pack(len(n), len(d), a.ndim), n, d, *(_DIM.pack(x) for x in a.shape),
                  _DIM.pack(a.nbytes), a.tobytes()]
    body = b"".join(parts)
    return body + _mac(secret, body)


def _mac(secret: bytes, body: bytes) -> bytes:
    return hmac.new(secret, body, hashlib.sha256).digest() if secret else hashlib.sha256(body).digest()


def decode(blob: bytes, digest: bytes, secret: bytes) -> dict:
    """The outputs of a verified entry for `digest`; CorruptEntry says why not."""
    if not isinstance(blob, (bytes, bytearray)) or len(blob) < len(MAGIC) + 32 + 2 + 32:
        raise CorruptEntry("truncated")
    body, mac = bytes(blob[:-32]), bytes(blob[-32:])
    if not hmac.compare_digest(mac, _mac(secret, body)):
        raise CorruptEntry("MAC mismatch (corrupt, or written without the cache's key)")
    if body[:4] != MAGIC:
        raise CorruptEntry("not a response-cache entry")
    if body[4:36] != digest:
        raise CorruptEntry("entry of another request (key mismatch)")
    off, out = 38, {}
    try:
        (count,) = struct.unpack_from("<H", body, 36)
        for _ in range(count):
            nlen, dlen, ndim = _OUT.unpack_from(body, off)
            off += _OUT.size
            name = body[off:off + nlen].decode()
            off += nlen
            dtype = body[off:off + dlen].decode()
            off += dlen
            if dtype not in ALLOWED_DTYPES:
                raise CorruptEntry(f"output {name!r}: dtype {dtype!r} not allowed")
            shape = tuple(_DIM.unpack_from(body, off + 8 * i)[0] for i in range(ndim))
            off += 8 * ndim
            (nbytes,) = _DIM.unpack_from(body, off)
            off += 8
            itemsize = np.dtype(dtype).itemsize
            if nbytes != int(np.prod(shape, dtype=np.int64)) * itemsize or off + nbytes > len(body):
                raise CorruptEntry(f"output {name!r}: {nbytes} bytes for shape {list(shape)}")
            out[name] = np.frombuffer(body, dtype=dtype, count=nbytes // itemsize, offset=off).reshape(shape)
            off += nbytes
    except (struct.error, UnicodeDecodeError) as e:
        raise CorruptEntry(f"malformed ({e})") from None
    if off != len(body):
        raise CorruptEntry("trailing bytes")
    return out


# -- the tiers -----------------------------------------------------------------------------------------
class LocalLRU:
    """Encoded entries by digest, the least recently used evicted past `capacity` bytes."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.bytes = 0
        self.evictions = 0
        self._d: collections.OrderedDict[bytes, bytes] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, digest: bytes) -> bytes | None:
        with self._lock:
            blob = self._d.get(digest)
            if blob is not None:
                self._d.move_to_end(digest)
            return blob

    def put(self, digest: bytes, blob: bytes) -> None:
        if len(blob) > self.capacity:
            return                                   # larger than the whole cache: not kept
        with self._lock:
            old = self._d.pop(digest, None)
            if old is not None:
                self.bytes -= len(old)
            self._d[digest] = blob
            self.bytes += len(blob)
            while self.bytes > self.capacity:
                _, evicted = self._d.popitem(last=False)
                self.bytes -= len(evicted)
                self.evictions += 1

    def discard(self, digest: bytes) -> None:
        with self._lock:
            old = self._d.pop(digest, None)
            if old is not None:
                self.bytes -= len(old)

    def __len__(self) -> int:
        return len(self._d)


class CircuitBreaker:
    CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"

    def __init__(self, failures: int = 2, open_s: float = 1.0, clock=time.monotonic):
        self.threshold, self.open_s, self.clock = failures, open_s, clock
        self.state = self.CLOSED
        self.failures = 0
        self.opened_at = 0.0
        self.opens = 0
        self.transitions: collections.deque = collections.deque(maxlen=64)   # (monotonic s, state)
        self._probing = False
        self._lock = threading.Lock()

    def _to(self, state: str) -> None:
        self.state = state
        self.transitions.append((self.clock(), state))

    def allow(self) -> str | None:
        """May this call go to Redis? "closed": yes; "probe": yes, as the half-open state's one
        probe (its outcome must be reported); None: no (open, until `open_s` has passed)."""
        with self._lock:
            if self.state == self.CLOSED:
                return "closed"
            if self.state == self.OPEN and self.clock() - self.opened_at >= self.open_s:
                self._to(self.HALF_OPEN)
            if self.state == self.HALF_OPEN and not self._probing:
                self._probing = True
                return "probe"
            return None

    def still_closed(self) -> bool:
        return self.state == self.CLOSED

    def success(self) -> None:
        with self._lock:
            self.failures = 0
            self._probing = False
            if self.state != self.CLOSED:
                self._to(self.CLOSED)

    def failure(self) -> None:
        with self._lock:
            self._probing = False
            self.failures += 1
            if self.state == self.HALF_OPEN or (self.state == self.CLOSED and self.failures >= self.threshold):
                self.opened_at = self.clock()
                self.opens += 1
                self._to(self.OPEN)


def _redis_client(cfg: dict, timeout_s: float):
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
    kw = dict(socket_timeout=timeout_s, socket_connect_timeout=timeout_s, password=cfg.get("password") or None)
    if cfg.get("cluster") == "true":
        from redis.cluster import RedisCluster
        # one attempt: the breaker, not a retry loop, decides what a slow cluster gets
        return RedisCluster(host=cfg["host"], port=int(cfg.get("port", 6379)), retry=Retry(NoBackoff(), 0),
                            cluster_error_retry_attempts=0, **kw)
    return redis.Redis(host=cfg["host"], port=int(cfg.get("port", 6379)), retry=Retry(NoBackoff(), 0), **kw)


@dataclass
class CacheStats:
    """Triton's cache statistics per model (cache_hit / cache_miss: count and ns) and the tiers'."""
    hits: int = 0
    hit_ns: int = 0
    misses: int = 0
    miss_ns: int = 0
    local_hits: int = 0
    redis_hits: int = 0
    fallbacks: int = 0          # lookups or inserts served by the local LRU: the breaker open, or Redis late
    rejected: int = 0           # entries that did not verify
    redis_errors: int = 0
    late: int = 0               # lookups a request stopped waiting for after timeout_ms (also fallbacks)


class ResponseCache:
    def __init__(self, config: CacheConfig):
        self.config = config
        self.local = LocalLRU(config.local_bytes)
        self.stats: dict[str, CacheStats] = collections.defaultdict(CacheStats)
        self._lock = threading.Lock()
        r = config.redis
        self.secret = b""
        if r.get("hmac_key_file"):
            with open(r["hmac_key_file"], "rb") as f:
                self.secret = f.read().strip()
        self.redis = None
        self.breaker = CircuitBreaker(int(r.get("failures", 2)), int(r.get("open_ms", 1000)) / 1e3)
        self.pool = None
        if r:
            if not self.secret:
                log.warning("response cache: Redis entries are checked with a plain SHA-256 (no hmac_key_file): "
                            "corruption is caught, an entry forged by a Redis writer is not")
            self.redis = _redis_client(r, config.timeout_s)
            self.pool = concurrent.futures.ThreadPoolExecutor(int(r.get("workers", 8)), thread_name_prefix="rcache")
        self.ttl_s = int(r.get("ttl_s", 0))

    @property
    def tier(self) -> str:
        return "redis" if self.redis is not None else "local"

    # -- the local tier (inline) ---------------------------------------------------------------
    def get_local(self, digest: bytes) -> dict | None:
        blob = self.local.get(digest)
        if blob is None:
            return None
        try:
            return decode(blob, digest, self.secret)
        except CorruptEntry as e:                  # (only memory corruption gets here)
            self._rejected("local", e, digest)
            self.local.discard(digest)
            return None

    # -- the Redis tier (on the pool) ----------------------------------------------------------------
    def remote_usable(self) -> str | None:
        """The breaker's leave for a Redis call (CircuitBreaker.allow), None without Redis."""
        return self.breaker.allow() if self.redis is not None else None

    def get_remote(self, digest: bytes, model: str) -> dict | None:
        """A Redis lookup, the breaker told (call after remote_usable()). None: a miss, or
        Redis failed (then the breaker counts it)."""
        try:
            blob = self.redis.get(KEY_PREFIX + digest.hex())
        except Exception as e:
            self._failed("GET", e, model)
            return None
        self.breaker.success()
        if blob is None:
            return None
        try:
            outputs = decode(blob, digest, self.secret)
        except CorruptEntry as e:
            self._rejected("redis", e, digest, model)
            try:
                self.redis.delete(KEY_PREFIX + digest.hex())
            except Exception:
                pass
            return None
        self.local.put(digest, bytes(blob))
        return outputs

    def store(self, digest: bytes, outputs: dict, model: str) -> None:
        """Keep an answer: the local LRU now, Redis on the pool (breaker permitting)."""
        try:
            blob = encode(digest, outputs, self.secret)
        except ValueError:
            return                                   # an output type the cache does not keep
        self.local.put(digest, blob)
        if self.redis is None:
            return
        leave = self.breaker.allow()
        if leave is None:
            self.count(model, fallbacks=1)
            return
        self.pool.submit(self._set, digest, blob, model, leave)

    def _set(self, digest: bytes, blob: bytes, model: str, leave: str) -> None:
        if leave == "closed" and not self.breaker.still_closed():
            self.count(model, fallbacks=1)           # opened while this waited for the pool
            return
        try:
            if self.ttl_s:
                self.redis.set(KEY_PREFIX + digest.hex(), blob, ex=self.ttl_s)
            else:
                self.redis.set(KEY_PREFIX + digest.hex(), blob)
            self.breaker.success()
        except Exception as e:
            self._failed("SET", e, model)

    def _failed(self, op: str, e: Exception, model: str) -> None:
        self.breaker.failure()
        self.count(model, redis_errors=1)
        log.debug("response cache: Redis %s failed (%s: %s); breaker %s", op, type(e).__name__, e, self.breaker.state)

    def _rejected(self, tier: str, e: CorruptEntry, digest: bytes, model: str = "") -> None:
        self.count(model, rejected=1)
        log.warning("response cache: rejected a %s entry %s: %s", tier, digest.hex()[:16], e)

    # -- statistics ---------------------------------------------------------------------------------
    def count(self, model: str, **add) -> None:
        with self._lock:
            s = self.stats[model]
            for k, v in add.items():
                setattr(s, k, getattr(s, k) + v)

    def describe(self) -> dict:
        with self._lock:
            models = {m: vars(s).copy() for m, s in self.stats.items() if m}
        return {"tier": self.tier, "local": {"bytes": self.local.bytes, "capacity": self.local.capacity,
                                            "entries": len(self.local), "evictions": self.local.evictions},
                "breaker": {"state": self.breaker.state, "opens": self.breaker.opens,
                            "failures": self.breaker.failures} if self.redis is not None else None,
                "models": models}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
        if self.redis is not None:
            try:
                self.redis.close()
            except Exception:
                pass


def register_metrics(cache: ResponseCache, registry) -> None:
    """Triton's cache metrics (nv_cache_*, per model) and the breaker's, on each scrape."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class _Collector:
        def collect(self):
            d = cache.describe()
            hits = CounterMetricFamily("nv_cache_num_hits_per_model", "Response cache hits", labels=["model"])
            misses = CounterMetricFamily("nv_cache_num_misses_per_model", "Response cache misses", labels=["model"])
            hit_us = CounterMetricFamily("nv_cache_hit_duration_per_model", "Response cache lookup time of hits (us)",
                                         labels=["model"])
            miss_us = CounterMetricFamily("nv_cache_miss_duration_per_model",
                                          "Response cache lookup and insertion time of misses (us)", labels=["model"])
            fallbacks = CounterMetricFamily("mcp_inference_response_cache_fallbacks",
                                            "Lookups and inserts served by the local cache while the breaker was open "
                                            "(the seed's cache_fallback)", labels=["model"])
            rejected = CounterMetricFamily("mcp_inference_response_cache_rejected",
                                           "Cache entries that did not verify and were dropped", labels=["model"])
            for m, s in d["models"].items():
                hits.add_metric([m], s["hits"])
                misses.add_metric([m], s["misses"])
                hit_us.add_metric([m], s["hit_ns"] / 1e3)
                miss_us.add_metric([m], s["miss_ns"] / 1e3)
                fallbacks.add_metric([m], s["fallbacks"])
                rejected.add_metric([m], s["rejected"])
            local = GaugeMetricFamily("mcp_inference_response_cache_local_bytes", "Bytes held by the local cache")
            local.add_metric([], d["local"]["bytes"])
            out = [hits, misses, hit_us, miss_us, fallbacks, rejected, local]
            if d["breaker"] is not None:
                state = GaugeMetricFamily("mcp_inference_response_cache_breaker_state",
                                          "Redis circuit breaker: 1 for the state it is in", labels=["state"])
                for name in (CircuitBreaker.CLOSED, CircuitBreaker.HALF_OPEN, CircuitBreaker.OPEN):
                    state.add_metric([name], 1.0 if d["breaker"]["state"] == name else 0.0)
                opens = CounterMetricFamily("mcp_inference_response_cache_breaker_opens", "Times the breaker opened")
                opens.add_metric([], d["breaker"]["opens"])
                out += [state, opens]
            return out

    registry.register(_Collector())
