"""The config source: a directory of multi-document YAML files, watched.

inotify wakes the watcher (inotify.py); whether anything changed is decided
by the directory's fingerprint (path, mtime, size, inode of every YAML
file), which also sees editors' rename-over writes and Kubernetes ConfigMap
symlink swaps. Where inotify is unavailable the fingerprint is polled.
A change is applied once the directory has been still for `debounce`
seconds (about 100 ms), so a `cp *.yaml` or a half-written file becomes
one change set, loaded whole; `load` raising ConfigError rejects it whole.
A file the OS will not stat (a symlink loop) is part of the fingerprint, and
any error in one round is logged and the watch goes on; should the watch task
end anyway, `failure` says why and /healthz turns 503.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Awaitable, Callable

from mcp26.mesh.parse import yaml_files

log = logging.getLogger("mcp26.xds.watch")


def fingerprint(directory: str) -> tuple:
    """What changes when any YAML file under `directory` is added, removed or written.

    A file that cannot be stat'ed (a symlink loop: ELOOP, no permission) is part of
    the fingerprint with its errno: the loader reports it as a rejected file, and
    the watch goes on (an OSError here once ended the watch task silently)."""
    out = []
    for path in yaml_files(directory) if os.path.isdir(directory) else []:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue          # removed between listing and stat: the next poll sees it
        except OSError as e:
            out.append((path, "error", e.errno, 0))
            continue
        out.append((path, st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(out)


class DirectorySource:
    """Calls `on_change()` after each debounced change of `directory`.

    With inotify (Linux), events wake the watcher at once and a fingerprint
    every `safety_poll` seconds catches anything inotify cannot see (the
    directory itself replaced); without it, the fingerprint is polled.
    """

    def __init__(self, directory: str, on_change: Callable[[], Awaitable[None]],
                 poll: float = 0.05, debounce: float = 0.1, use_inotify: bool = True,
                 safety_poll: float = 2.0, max_debounce: float = 10.0):
        self.directory = directory
        self.on_change = on_change
        self.poll = poll
        self.debounce = debounce
        self.use_inotify = use_inotify
        self.safety_poll = safety_poll
        self.max_debounce = max_debounce   # as istiod's PILOT_DEBOUNCE_MAX: a directory that never
                                           # stops changing is still applied every so often
        self.seen = fingerprint(directory)
        self.changes = 0
        self.inotify = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        if self.use_inotify and os.path.isdir(self.directory):
            try:
                from mcp26.xds.inotify import Inotify
                self.inotify = Inotify(self.directory)
                loop.add_reader(self.inotify.fd, self._on_events)
            except (OSError, AttributeError) as e:   # not Linux, or out of watches: poll
                log.info("inotify unavailable (%s); polling %s", e, self.directory)
                self.inotify = None
        self._task = loop.create_task(self._watch())
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task) -> None:
        if not self._stopping:
            log.error("the watch of %s stopped: %s; no further change will be applied",
                      self.directory, self.failure)

    @property
    def failure(self) -> str | None:
        """Why the watch is not running (None while it runs, before start and after stop())."""
        task = self._task
        if task is None or not task.done() or self._stopping:
            return None
        if task.cancelled():
            return "watch task cancelled"
        exc = task.exception()
        return f"watch task ended: {type(exc).__name__}: {exc}" if exc else "watch task ended"

    def _on_events(self) -> None:
        if self.inotify.drain():
            self._wake.set()

    async def stop(self) -> None:
        self._stopping = True
        if self.inotify is not None:
            asyncio.get_running_loop().remove_reader(self.inotify.fd)
            self.inotify.close()
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _woken(self, timeout: float) -> bool:
        """Wait for an inotify event (True) or `timeout` (False). The flag is cleared
        after waking, not before waiting: an event that came while we were busy counts."""
        try:
            await asyncio.wait_for(self._wake.wait(), timeout)
            woke = True
        except asyncio.TimeoutError:
            woke = False
        self._wake.clear()
        return woke

    async def _watch(self) -> None:
        # Not `while True`: Python 3.11's asyncio.wait_for drops a cancel that lands as the
        # event it waits on is set (a file written as the server stops), and stop() then
        # waited for ever on a watch that went on polling (cpython gh-86296, fixed in 3.12).
        while not self._stopping:
            try:
                await self._watch_once()
            except asyncio.CancelledError:
                raise
            except Exception:     # one bad round (a file system error) must not end the watch
                log.exception("watching %s failed; retrying", self.directory)
                await asyncio.sleep(max(self.poll, self.debounce))

    async def _watch_once(self) -> None:
        """Wait for a change, debounce it, apply it."""
        if self.inotify is not None:
            await self._woken(self.safety_poll)
        else:
            await asyncio.sleep(self.poll)
        now = await asyncio.to_thread(fingerprint, self.directory)
        if now == self.seen or self._stopping:
            return
        # Debounce: wait until nothing has changed for `debounce` seconds.
        first_seen = time.monotonic()
        if self.inotify is not None:
            while (time.monotonic() - first_seen < self.max_debounce
                   and await self._woken(self.debounce)):
                pass
            now = await asyncio.to_thread(fingerprint, self.directory)
        else:
            still_since = time.monotonic()
            while (time.monotonic() - still_since < self.debounce
                   and time.monotonic() - first_seen < self.max_debounce):
                await asyncio.sleep(min(self.poll, self.debounce / 4))
                later = await asyncio.to_thread(fingerprint, self.directory)
                if later != now:
                    now, still_since = later, time.monotonic()
        self.seen = now
        self.changes += 1
        try:
            await self.on_change()
        except Exception:  # a failed apply must not stop the watch
            log.exception("applying the change in %s failed", self.directory)
