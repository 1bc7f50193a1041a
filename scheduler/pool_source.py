"""The InferencePool the picker serves, and its endpoints, read from the same
watched directory the control plane reads (not from the control plane over
xDS): the picker sits on the data path, so it must keep picking while the
control plane restarts, and it needs what xDS does not carry to a proxy --
workload labels, InferenceObjectives. A directory that fails validation
leaves the last good view in place, as the control plane does.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from mcp26.mesh.change_set import load_config
from mcp26.mesh.diagnostics import ConfigError
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


class PoolSource:
    """Loads DIR and keeps the view of pool NS/NAME; `refresh()` reloads when a file changed."""

    def __init__(self, directory: str, pool_ref: str):
        self.directory, self.pool_ref = directory, pool_ref
        self.view: PoolView | None = None
        self.error: str | None = None
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
            self.error = str(e)
            log.error("config rejected, keeping the last good pool view:\n%s", e)
            return False
        pool = find_pool(config, self.pool_ref)
        if pool is None:
            self.error = f"no InferencePool {self.pool_ref} in {self.directory}"
            log.error("%s", self.error)
            return False
        view = PoolView(pool, tuple(pool_endpoints(config, pool)), objective_priorities(config, pool))
        changed = view != self.view
        self.view, self.error = view, None
        if changed:
            log.info("pool %s: %d endpoint(s): %s", pool.ref, len(view.endpoints),
                     " ".join(e.key for e in view.endpoints))
        return changed
