"""The config source: a directory of multi-document YAML files, watched.

Polled (stat of every YAML file every 50 ms) rather than inotify: it sees
editors' rename-over writes, bind mounts and Kubernetes ConfigMap symlink
swaps alike, and costs microseconds for a config directory's few files.
A change is applied once the directory has been still for `debounce`
seconds (about 100 ms), so a `cp *.yaml` or a half-written file becomes
one change set, loaded whole; `load` raising ConfigError rejects it whole.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Awaitable, Callable

from mesh.config import yaml_files

log = logging.getLogger("xds_server.source")


def fingerprint(directory: str) -> tuple:
    """What changes when any YAML file under `directory` is added, removed or written."""
    out = []
    for path in yaml_files(directory) if os.path.isdir(directory) else []:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue          # removed between listing and stat: the next poll sees it
        out.append((path, st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(out)


class DirectorySource:
    """Calls `on_change()` after each debounced change of `directory`."""

    def __init__(self, directory: str, on_change: Callable[[], Awaitable[None]],
                 poll: float = 0.05, debounce: float = 0.1):
        self.directory = directory
        self.on_change = on_change
        self.poll = poll
        self.debounce = debounce
        self.seen = fingerprint(directory)
        self.changes = 0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll)
            now = await asyncio.to_thread(fingerprint, self.directory)
            if now == self.seen:
                continue
            # Debounce: wait until nothing has changed for `debounce` seconds.
            still_since = time.monotonic()
            while time.monotonic() - still_since < self.debounce:
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
