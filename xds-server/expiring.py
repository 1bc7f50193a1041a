"""What the decision loop holds in force at the control plane (class remaps, endpoint weights):
entries with an `expires_at`, keyed, bounded; read by translation (any thread), written by the
admin API (scheduler_actions.py)."""
from __future__ import annotations

import threading
import time


class ExpiringTable:
    def __init__(self, key, order, limit: int, over_limit: str):
        self._key, self._order, self._limit, self._over_limit = key, order, limit, over_limit
        self._lock = threading.Lock()
        self._entries: dict = {}

    def active(self, now: float | None = None) -> tuple:
        """The entries not yet expired, in `order`."""
        now = time.time() if now is None else now
        with self._lock:
            return tuple(sorted((e for e in self._entries.values() if e.expires_at > now), key=self._order))

    def put_all(self, entries) -> None:
        """All of them (replacing those of the same key), or, past the limit, none (ValueError)."""
        with self._lock:
            new = {self._key(e) for e in entries} - set(self._entries)
            if len(self._entries) + len(new) > self._limit:
                raise ValueError(self._over_limit)
            for e in entries:
                self._entries[self._key(e)] = e

    def remove_where(self, pred) -> int:
        """Removes the entries whose key satisfies `pred`; how many."""
        with self._lock:
            gone = [k for k in self._entries if pred(k)]
            for k in gone:
                del self._entries[k]
        return len(gone)

    def drop_expired(self, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        with self._lock:
            gone = [k for k, e in self._entries.items() if e.expires_at <= now]
            for k in gone:
                del self._entries[k]
        return bool(gone)
