"""Serialized xDS responses, nonce included, shared by every stream that sends the same content."""
from __future__ import annotations

import collections
import itertools


class ResponseBodies:
    """A response is built and serialized once per content (100 gateways at one
    version share one 5 MB EDS body), with nonce `str(serial)`, a serial unique
    to this content and increasing: a stream sends the stored bytes themselves
    when that nonce is new to it (ads_protocol), so a push to 2,000 streams is
    2,000 references to one buffer, not 2,000 joined copies. Bounded by total
    bytes, LRU.
    """

    def __init__(self, max_bytes: int = 256 << 20):
        self.max_bytes = max_bytes
        self.size = 0
        self._bodies: collections.OrderedDict[tuple, tuple[int, bytes]] = collections.OrderedDict()
        self._serials = itertools.count(1)
        self.hits = self.misses = 0

    def get(self, key: tuple, build) -> tuple[int, bytes]:
        """(serial, wire) stored under `key`, or `build()` (a response message) given
        nonce str(serial), serialized and stored."""
        found = self._bodies.get(key)
        if found is not None:
            self._bodies.move_to_end(key)
            self.hits += 1
            return found
        self.misses += 1
        serial = next(self._serials)
        msg = build()
        msg.nonce = str(serial)
        found = self._bodies[key] = (serial, msg.SerializeToString())
        self.size += len(found[1])
        while self.size > self.max_bytes and len(self._bodies) > 1:
            _, (_, old) = self._bodies.popitem(last=False)
            self.size -= len(old)
        return found
