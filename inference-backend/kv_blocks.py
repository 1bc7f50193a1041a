"""The decoder's KV cache, kept in blocks that sequences share by token prefix.

A sequence's past keys/values are a list of full blocks of BLOCK_TOKENS
tokens plus a private tail (the last, partial block). A full block is named
by the hash chain of every token up to its end (and the model version), as
vLLM's automatic prefix caching does, so two sequences whose token prefixes
are equal name the same blocks, and the cache keeps one copy with a reference
count. A request whose prompt starts with cached blocks runs only the rest.

Reclaim: a block no sequence references stays cached (a later prompt with the
same prefix reuses it) until it has been idle `idle_s` seconds (5 by default,
the seed's rule), or the budget needs its bytes (least recently released
first). Only when no unreferenced block is left does the budget evict a whole
sequence (least recently used); that sequence's next step is then a miss,
recomputed from its token history (with what prefix blocks are still cached),
so answers stay exact.

Exactness: a block is reused only for the very same tokens at the very same
positions (its hash covers the whole prefix), and at least one token of a
prompt is always run, since its logits are the answer.

Thread use: the compute thread plans and commits steps; request threads end
sequences and read stats; a reclaimer thread drops idle blocks. One lock.
"""
from __future__ import annotations

import collections
import hashlib
import threading
import time
import weakref
from dataclasses import dataclass, field

import numpy as np

BLOCK_TOKENS = 16
DEFAULT_IDLE_S = 5.0
MAX_HISTORIES = 100_000      # token histories of live sequences kept (their KV may be evicted)


def root_digest(version: str) -> bytes:
    """The chain's start: blocks of another model version never match."""
    return hashlib.blake2b(b"mcp-kv-v1\0" + version.encode(), digest_size=16).digest()


def block_digest(parent: bytes, tokens) -> bytes:
    return hashlib.blake2b(parent + np.asarray(tokens, "<i8").tobytes(), digest_size=16).digest()


def prefix_digests(tokens: list[int], version: str, block_tokens: int = BLOCK_TOKENS) -> list[bytes]:
    """The digest of every full block of `tokens`, in order."""
    out, d = [], root_digest(version)
    for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
        d = block_digest(d, tokens[start:start + block_tokens])
        out.append(d)
    return out


@dataclass(eq=False)
class Block:
    digest: bytes
    key: np.ndarray              # [1, heads, block_tokens, head_dim]
    value: np.ndarray
    refs: int = 0
    released_at: float = 0.0    # when refs last fell to 0

    @property
    def nbytes(self) -> int:
        return self.key.nbytes + self.value.nbytes


class BlockPool:
    """Full blocks by digest, with reference counts; unreferenced ones in LRU order."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.blocks: dict[bytes, Block] = {}
        self.free: collections.OrderedDict[bytes, Block] = collections.OrderedDict()  # refs == 0, oldest first
        self.bytes = 0               # every block held
        self.used_bytes = 0          # blocks some sequence references
        self.reclaimed_idle = 0
        self.evicted = 0

    def match(self, digests: list[bytes]) -> list[Block]:
        """The cached blocks of the longest prefix of `digests` (not yet acquired)."""
        out = []
        for d in digests:
            b = self.blocks.get(d)
            if b is None:
                break
            out.append(b)
        return out

    def acquire(self, b: Block) -> Block:
        if b.refs == 0:
            self.free.pop(b.digest, None)
            self.used_bytes += b.nbytes
        b.refs += 1
        return b

    def release(self, b: Block) -> None:
        b.refs -= 1
        if b.refs == 0:
            self.used_bytes -= b.nbytes
            b.released_at = self.clock()
            if b.digest in self.blocks:
                self.free[b.digest] = b       # most recently released last
                self.free.move_to_end(b.digest)

    def put(self, digest: bytes, key: np.ndarray, value: np.ndarray) -> Block:
        """The block for `digest`, acquired: the cached one if another sequence made it first."""
        b = self.blocks.get(digest)
        if b is None:
            b = Block(digest, key, value)
            self.blocks[digest] = b
            self.bytes += b.nbytes
        return self.acquire(b)

    def _drop(self, b: Block) -> None:
        del self.blocks[b.digest]
        self.bytes -= b.nbytes

    def reclaim_idle(self, idle_s: float, now: float | None = None) -> int:
        now = self.clock() if now is None else now
        n = 0
        while self.free:
            digest, b = next(iter(self.free.items()))
            if now - b.released_at < idle_s:
                break
            del self.free[digest]
            self._drop(b)
            n += 1
        self.reclaimed_idle += n
        return n

    def evict_lru(self) -> bool:
        if not self.free:
            return False
        _, b = self.free.popitem(last=False)
        self._drop(b)
        self.evicted += 1
        return True


@dataclass(eq=False)
class SeqKV:
    """One live sequence's past: shared full blocks + its private tail."""
    blocks: list[Block]
    tail_key: np.ndarray
    tail_value: np.ndarray
    version: str

    @property
    def tail_bytes(self) -> int:
        return self.tail_key.nbytes + self.tail_value.nbytes


@dataclass(eq=False)
class StepPlan:
    """What the compute thread feeds for one step of a sequence, and what it then stores."""
    sid: object
    history: list[int]           # tokens before this step
    new: list[int]               # this step's tokens
    ids: np.ndarray              # [1, T] tokens to run (prefix from the cache left out)
    past_key: np.ndarray         # [1, H, P, D]
    past_value: np.ndarray
    blocks: list[Block]          # acquired full blocks the past starts with
    hit: bool | None             # None: a new sequence; True: its KV was held; False: evicted, recomputed
    reused: int = 0              # tokens taken from prefix blocks instead of being run
    recomputed: int = 0          # tokens of the history run again
    version: str = ""
    ended: bool = field(default=False)   # end() came while the step ran: commit releases instead

    @property
    def past_length(self) -> int:
        return int(self.past_key.shape[2])


class KVCache:
    """Per-sequence KV over shared blocks, within `capacity_bytes` (see the module docstring)."""

    def __init__(self, capacity_bytes: int, block_tokens: int = BLOCK_TOKENS, idle_s: float = DEFAULT_IDLE_S,
                 clock=time.monotonic):
        self.capacity_bytes = capacity_bytes
        self.block_tokens = block_tokens
        self.idle_s = idle_s
        self.pool = BlockPool(clock)
        self._seqs: collections.OrderedDict = collections.OrderedDict()      # sid -> SeqKV, LRU first
        self._history: collections.OrderedDict = collections.OrderedDict()   # sid -> tokens fed so far
        self._inflight: dict = {}                                            # sid -> StepPlan being run
        self.tail_bytes = 0
        self.hits = self.misses = self.evictions = 0       # per continuing step: was its KV held?
        self.prefix_queries = self.prefix_hits = 0         # tokens looked up in / found in the block cache
        self._lock = threading.RLock()
        self._reclaimer: threading.Thread | None = None

    # -- sizes ---------------------------------------------------------------------------
    @property
    def bytes(self) -> int:
        """Every byte held: referenced blocks, cached unreferenced blocks, tails."""
        return self.pool.bytes + self.tail_bytes

    def used_bytes(self) -> int:
        return self.pool.used_bytes + self.tail_bytes

    def utilization(self) -> float:
        """In vLLM's sense: the share of the budget live sequences hold (cached,
        unreferenced blocks are free space that happens to remember something)."""
        if self.capacity_bytes <= 0:
            return 0.0
        return min(1.0, self.used_bytes() / self.capacity_bytes)

    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def history_length(self, sid) -> int:
        """For request threads (a racy read is fine: a history only grows)."""
        h = self._history.get(sid)
        return len(h) if h is not None else 0

    def history(self, sid) -> list[int] | None:
        return self._history.get(sid)

    # -- the compute thread ------------------------------------------------------------
    def plan(self, sid, new: list[int], start: bool, version: str, empty: np.ndarray) -> StepPlan:
        """The past for this step: the sequence's own if held, else its history's (and a
        new prompt's) prefix from the block cache, the rest to be run. `empty`: a
        [1, H, 0, D] past."""
        with self._lock:
            if start:
                self._drop_seq(sid)
                self._history.pop(sid, None)
            history = self._history.get(sid)
            entry = self._seqs.get(sid) if history is not None else None
            if entry is not None and entry.version == version:
                self.hits += 1
                self._seqs.move_to_end(sid)
                keys = [b.key for b in entry.blocks] + [entry.tail_key]
                values = [b.value for b in entry.blocks] + [entry.tail_value]
                blocks = [self.pool.acquire(b) for b in entry.blocks]   # held by the plan too, until commit
                plan = StepPlan(sid, history, new, np.asarray([new], np.int64), np.concatenate(keys, axis=2),
                                np.concatenate(values, axis=2), blocks, True, version=version)
            else:
                if entry is not None:
                    self._drop_seq(sid)          # another model version's past
                hit = None if history is None else False
                history = history or []
                if hit is False:
                    self.misses += 1
                tokens = history + new
                # At least one token is run: its logits are the answer.
                digests = prefix_digests(tokens[:len(tokens) - 1], version, self.block_tokens)
                blocks = [self.pool.acquire(b) for b in self.pool.match(digests)] if self.capacity_bytes > 0 else []
                reused = len(blocks) * self.block_tokens
                self.prefix_queries += len(tokens)
                self.prefix_hits += reused
                if blocks:
                    pk = np.concatenate([b.key for b in blocks], axis=2)
                    pv = np.concatenate([b.value for b in blocks], axis=2)
                else:
                    pk = pv = empty
                plan = StepPlan(sid, history, new, np.asarray([tokens[reused:]], np.int64), pk, pv, blocks, hit,
                                reused=reused, recomputed=max(0, len(history) - reused), version=version)
            self._inflight[sid] = plan
            return plan

    def commit(self, plan: StepPlan, present_key: np.ndarray, present_value: np.ndarray, end: bool) -> None:
        """Store the step's present (full blocks into the shared pool, the rest as the tail)."""
        with self._lock:
            if self._inflight.get(plan.sid) is plan:
                del self._inflight[plan.sid]
            tokens = plan.history + plan.new
            if plan.ended:
                end = True
            self._drop_seq(plan.sid)
            blocks = plan.blocks            # acquired by plan(): now the sequence's references
            if self.capacity_bytes > 0:
                bt = self.block_tokens
                covered = len(blocks) * bt
                digest = blocks[-1].digest if blocks else root_digest(plan.version)
                while covered + bt <= present_key.shape[2]:
                    digest = block_digest(digest, tokens[covered:covered + bt])
                    blocks.append(self.pool.put(digest, np.ascontiguousarray(present_key[:, :, covered:covered + bt]),
                                                np.ascontiguousarray(present_value[:, :, covered:covered + bt])))
                    covered += bt
                entry = SeqKV(blocks, np.ascontiguousarray(present_key[:, :, covered:]),
                              np.ascontiguousarray(present_value[:, :, covered:]), plan.version)
            else:
                entry = SeqKV(blocks, present_key[:, :, :0], present_value[:, :, :0], plan.version)
            if end:
                for b in entry.blocks:          # the blocks stay cached, unreferenced, for the next prompt
                    self.pool.release(b)
                self._history.pop(plan.sid, None)
            else:
                self._history[plan.sid] = tokens
                self._history.move_to_end(plan.sid)
                while len(self._history) > MAX_HISTORIES:
                    old, _ = self._history.popitem(last=False)
                    self._drop_seq(old)
                if self.capacity_bytes > 0:
                    self._seqs[plan.sid] = entry
                    self.tail_bytes += entry.tail_bytes
                else:
                    for b in entry.blocks:
                        self.pool.release(b)
            self._enforce()

    def abort(self, plan: StepPlan) -> None:
        """The run failed: give back what the plan holds; the sequence keeps its history."""
        with self._lock:
            if self._inflight.get(plan.sid) is plan:
                del self._inflight[plan.sid]
            for b in plan.blocks:
                self.pool.release(b)
            plan.blocks = []

    # -- any thread ----------------------------------------------------------------------
    def end(self, sid) -> None:
        with self._lock:
            plan = self._inflight.get(sid)
            if plan is not None:
                plan.ended = True       # a step is running: its commit releases
            self._drop_seq(sid)
            self._history.pop(sid, None)

    def reclaim(self, now: float | None = None) -> None:
        with self._lock:
            self.pool.reclaim_idle(self.idle_s, now)
            self._enforce(reclaim=False)

    def start_reclaimer(self) -> None:
        """A daemon thread dropping idle unreferenced blocks even when no request comes."""
        if self._reclaimer is not None:
            return
        interval = min(1.0, max(0.05, self.idle_s / 4))
        ref = weakref.ref(self)

        def loop():
            while True:
                time.sleep(interval)
                cache = ref()
                if cache is None:
                    return
                cache.reclaim()
                del cache
        self._reclaimer = threading.Thread(target=loop, name="kv-reclaim", daemon=True)
        self._reclaimer.start()

    def _drop_seq(self, sid) -> None:
        entry = self._seqs.pop(sid, None)
        if entry is not None:
            self.tail_bytes -= entry.tail_bytes
            for b in entry.blocks:
                self.pool.release(b)

    def _enforce(self, reclaim: bool = True) -> None:
        if reclaim:
            self.pool.reclaim_idle(self.idle_s)
        while self.bytes > self.capacity_bytes:
            if self.pool.evict_lru():
                continue
            if not self._seqs:
                break           # what is left is held by steps being run
            sid, _ = next(iter(self._seqs.items()))
            self._drop_seq(sid)
            self.evictions += 1

    def stats(self) -> dict:
        with self._lock:
            return {"sequences": len(self._history), "cached": len(self._seqs), "bytes": self.bytes,
                    "used_bytes": self.used_bytes(), "capacity_bytes": self.capacity_bytes,
                    "utilization": self.utilization(), "hits": self.hits, "misses": self.misses,
                    "evictions": self.evictions, "hit_rate": self.hit_rate(),
                    "block_tokens": self.block_tokens, "blocks": len(self.pool.blocks),
                    "blocks_free": len(self.pool.free), "blocks_reclaimed_idle": self.pool.reclaimed_idle,
                    "blocks_evicted": self.pool.evicted, "prefix_queries": self.prefix_queries,
                    "prefix_hits": self.prefix_hits, "prefix_hit_rate": self.prefix_hit_rate(),
                    "idle_seconds": self.idle_s}
