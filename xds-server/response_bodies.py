"""Serialized xDS responses without their nonce, shared by every stream that sends the same content."""
from __future__ import annotations

import collections


class ResponseBodies:
    """A response is built and serialized once per content (100 gateways at one
    version share one 5 MB EDS body); each stream appends its own nonce field,
    which protobuf parses as a merge of the two. Bounded by total bytes, LRU.
    """

    def __init__(self, max_bytes: int = 256 << 20):
        self.max_bytes = max_bytes
        self.size = 0
        self._bodies: collections.OrderedDict[tuple, bytes] = collections.OrderedDict()
        self.hits = self.misses = 0

    def get(self, key: tuple, build) -> bytes:
        """The body stored under `key`, or `build()` (a message) serialized and stored."""
        body = self._bodies.get(key)
        if body is not None:
            self._bodies.move_to_end(key)
            self.hits += 1
            return body
        self.misses += 1
        body = build().SerializeToString()
        self._bodies[key] = body
        self.size += len(body)
        while self.size > self.max_bytes and len(self._bodies) > 1:
            _, old = self._bodies.popitem(last=False)
            self.size -= len(old)
        return body
