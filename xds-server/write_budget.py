"""Keeping the control plane's resident memory down while it pushes megabytes to many proxies.

Two things, both measured on the 1,000-service benchmark (xds-server/README.md,
"Memory and scale"):

- `WriteBudget`: at most `limit` bytes of responses in gRPC's hands at once. A
  write holds a Python copy (the shared body + this stream's nonce) and
  gRPC core's copy until the proxy has read it, so a full push of 5 MB to
  2,000 proxies at once would hold ~20 GB. istiod bounds the same thing by
  the number of concurrent pushes (PILOT_PUSH_THROTTLE, 100); bytes bound
  what matters here, and small responses (an EDS delta) never wait.
- `trim()`: glibc keeps what a burst freed in its arenas (RSS stays at the
  burst's peak, ~75-115 MB free in arenas after a 100-proxy push); once the
  writes drain, malloc_trim(0) hands those pages back.
"""
from __future__ import annotations

import asyncio
import collections
import ctypes
import ctypes.util
import os

SMALL = 64 << 10          # responses under this are never held back


def _libc():
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        lib.malloc_trim.argtypes = [ctypes.c_size_t]
        return lib
    except (OSError, AttributeError):   # not glibc: nothing to trim
        return None


_LIBC = _libc()


def trim() -> bool:
    """Return freed heap pages to the OS (glibc); False where there is no malloc_trim."""
    if _LIBC is None:
        return False
    _LIBC.malloc_trim(0)
    return True


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class WriteBudget:
    """Bytes of responses being written, bounded; waiters are admitted in FIFO order.

    One write larger than the whole budget is admitted alone. A write is
    counted for at most `hold_s` seconds: a proxy that stops reading keeps
    its own buffers, but does not stall every other stream's pushes.
    """

    def __init__(self, limit: int = 128 << 20, hold_s: float = 5.0, on_drained=None):
        self.limit, self.hold_s = limit, hold_s
        self.used = 0
        self.written = 0                 # bytes through the budget since the last drain callback
        self.on_drained = on_drained     # called when the budget empties after big writes
        self._queue: collections.deque[tuple[int, asyncio.Future]] = collections.deque()

    async def write(self, context, wire: bytes) -> None:
        if len(wire) < SMALL:
            await context.write(wire)
            return
        n = await self._acquire(min(len(wire), self.limit))
        released = False

        def release():
            nonlocal released
            if not released:
                released = True
                self._release(n)
        timer = asyncio.get_running_loop().call_later(self.hold_s, release)
        try:
            await context.write(wire)
        finally:
            timer.cancel()
            release()

    async def _acquire(self, n: int) -> int:
        if not self._queue and (self.used == 0 or self.used + n <= self.limit):
            self.used += n
            return n
        fut = asyncio.get_running_loop().create_future()
        self._queue.append((n, fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():   # admitted just as we were cancelled
                self._release(n)
            raise
        return n

    def _release(self, n: int) -> None:
        self.used -= n
        self.written += n
        while self._queue and (self.used == 0 or self.used + self._queue[0][0] <= self.limit):
            m, fut = self._queue.popleft()
            if fut.done():               # its waiter was cancelled
                continue
            self.used += m
            fut.set_result(None)
        if self.used == 0 and self.on_drained is not None:
            self.on_drained()


class Trimmer:
    """Calls trim() once big writes have drained and stayed drained for `quiet_s`."""

    def __init__(self, budget: WriteBudget, min_bytes: int = 32 << 20, quiet_s: float = 0.5):
        self.budget, self.min_bytes, self.quiet_s = budget, min_bytes, quiet_s
        self.trims = 0
        self._timer: asyncio.TimerHandle | None = None
        budget.on_drained = self.drained

    def drained(self) -> None:
        if self.budget.written >= self.min_bytes:
            self.request()

    def request(self) -> None:
        """Trim once no big write is in flight (e.g. after a translation freed its temporaries)."""
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.quiet_s, self._fire)

    def _fire(self) -> None:
        self._timer = None
        if self.budget.used:             # a new burst began: its drain will call again
            return
        self.budget.written = 0
        if trim():
            self.trims += 1
