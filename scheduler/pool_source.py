"""The InferencePool the picker serves, and its endpoints, read where the control
plane reads them (not from the control plane over xDS): the picker sits on the
data path, so it must keep picking while the control plane restarts, and it
needs what xDS does not carry to a proxy -- workload labels, InferenceObjectives.

- PoolSource: the watched directory (WorkloadEntries are the endpoints);
- KubePoolSource: the Kubernetes API server, as the upstream picker reads it:
  the pool's namespace only (its Pods, InferencePools and InferenceObjectives,
  so its Role needs get/list/watch on those three there), through the mesh's
  informers (mesh/kube_source.py); a Pod is an endpoint once it has a podIP.

A change set that fails validation leaves the last good view in place, as the
control plane does.
"""
from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field

from mcp26.mesh.change_set import load_config
from mcp26.mesh.diagnostics import ConfigError
from mcp26.mesh.kube_source import KINDS, KubeApi, KubeSource
from mcp26.mesh.resources import MeshConfig
from mcp26.mesh.inference_pool import Endpoint, InferencePool, find_pool, objective_priorities, pool_endpoints

log = logging.getLogger("scheduler.pool")


@dataclass(frozen=True)
class PoolView:
    pool: InferencePool
    endpoints: tuple[Endpoint, ...]
    objectives: dict = field(default_factory=dict)     # InferenceObjective name -> priority


def fingerprint(directory: str) -> tuple:
    """(name, size, mtime) of every YAML file: cheap to poll."""
    out = []
    for name in sorted(os.listdir(directory)):
        if name.endswith((".yaml", ".yml", ".json")):
            try:
                st = os.stat(os.path.join(directory, name))
            except OSError:
                continue
            out.append((name, st.st_size, st.st_mtime_ns))
    return tuple(out)


class _Pool:
    """The view of pool NS/NAME, kept from the last config that had it."""

    def __init__(self, pool_ref: str, where: str):
        self.pool_ref, self.where = pool_ref, where
        self.view: PoolView | None = None
        self.error: str | None = None

    def _take(self, config: MeshConfig) -> bool:
        """The view from `config` (validated); True when it changed."""
        pool = find_pool(config, self.pool_ref)
        if pool is None:
            self.error = f"no InferencePool {self.pool_ref} in {self.where}"
            log.error("%s", self.error)
            return False
        view = PoolView(pool, tuple(pool_endpoints(config, pool)), objective_priorities(config, pool))
        changed = view != self.view
        self.view, self.error = view, None
        if changed:
            log.info("pool %s: %d endpoint(s): %s", pool.ref, len(view.endpoints),
                     " ".join(e.key for e in view.endpoints))
        return changed

    def _rejected(self, e: ConfigError) -> bool:
        self.error = str(e)
        log.error("config rejected, keeping the last good pool view:\n%s", e)
        return False

    async def start(self) -> None:
        """Ready to refresh (the API server's first lists read)."""

    async def stop(self) -> None:
        """Its watches ended."""


class PoolSource(_Pool):
    """Loads DIR and keeps the view of pool NS/NAME; `refresh()` reloads when a file changed."""

    def __init__(self, directory: str, pool_ref: str):
        super().__init__(pool_ref, directory)
        self.directory = directory
        self._seen: tuple | None = None

    def refresh(self) -> bool:
        """Reload if the directory changed; True when the view changed."""
        try:
            seen = fingerprint(self.directory)
        except OSError as e:
            self.error = f"{self.directory}: {e}"
            return False
        if seen == self._seen:
            return False
        self._seen = seen
        try:
            config = load_config(self.directory)
        except ConfigError as e:
            return self._rejected(e)
        return self._take(config)


POOL_KINDS = tuple(k for k in KINDS if k.kind in ("Pod", "InferencePool", "InferenceObjective"))


class KubePoolSource(_Pool):
    """The pool NS/NAME, its Pods and InferenceObjectives from the API server, namespace NS."""

    def __init__(self, api: KubeApi, pool_ref: str, debounce: float = 0.05):
        super().__init__(pool_ref, f"the Kubernetes API at {api.client.configuration.host}")
        self.source = KubeSource(api, on_change=self._changed, debounce=debounce, kinds=POOL_KINDS,
                                 namespace=pool_ref.split("/", 1)[0])
        self._dirty = True

    async def _changed(self) -> None:
        self._dirty = True

    async def start(self, wait: float = 10.0) -> None:
        """The informers started, and their first lists read if they come within `wait` s; if
        not (a Role that does not allow them, an API server away), the picker serves anyway:
        not ready, and `error` says why, until they come."""
        self.source.start()
        try:
            await asyncio.wait_for(self.source.synced(), wait)
        except asyncio.TimeoutError:
            self._unsynced()

    async def stop(self) -> None:
        await self.source.stop()

    def _unsynced(self) -> bool:
        waiting = [i for i in self.source.informers if not i.synced.is_set()]
        if waiting:
            self.error = (f"waiting for the API server's first list of {', '.join(i.kind.plural for i in waiting)}"
                          + "".join(f"; {i.last_error}" for i in waiting if i.last_error))
        return bool(waiting)

    def refresh(self) -> bool:
        """Rebuild the view if the API server's objects changed; True when it changed."""
        failure = self.source.failure
        if failure:
            self.error = failure
        if self._unsynced():
            return False
        if not self._dirty:
            return False
        self._dirty = False
        try:
            config = self.source.loader()
        except ConfigError as e:
            return self._rejected(e)
        return self._take(config)
