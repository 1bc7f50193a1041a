"""Compiled components serialized to disk, so a restart deserializes (~0.2 s) instead of
compiling (~15 s on a free core).

Key: the component's sha256, the wasmtime version and what of the engine's configuration changes
code (fuel, epoch interruption): a serialized component is machine code for exactly that engine,
and wasmtime refuses one from another version or configuration, so such a file is never
reused; it is recompiled and rewritten. Files are written whole, then renamed.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import pathlib
import tempfile
import time
from dataclasses import dataclass

from wasmtime import Engine, WasmtimeError
from wasmtime.component import Component

log = logging.getLogger("mcp26.scheduler.plugins")

WASMTIME_VERSION = importlib.metadata.version("wasmtime")


def default_dir() -> pathlib.Path:
    base = os.environ.get("MCP_POLICY_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mcp-mesh", "policy")
    return pathlib.Path(base)


@dataclass
class Loaded:
    component: Component
    sha256: str
    from_cache: bool
    seconds: float


class CompiledCache:
    def __init__(self, directory: str | os.PathLike | None = None):
        self.dir = pathlib.Path(directory) if directory else default_dir()
        self.hits = self.misses = 0

    def path_for(self, sha256: str, engine_key: str) -> pathlib.Path:
        tag = hashlib.sha256(f"{WASMTIME_VERSION}|{engine_key}".encode()).hexdigest()[:16]
        return self.dir / f"{sha256}-{tag}.cwasm"

    def load(self, engine: Engine, wasm: bytes, engine_key: str) -> Loaded:
        sha = hashlib.sha256(wasm).hexdigest()
        path = self.path_for(sha, engine_key)
        t0 = time.perf_counter()
        if path.exists():
            try:
                component = Component.deserialize_file(engine, str(path))
                self.hits += 1
                return Loaded(component, sha, True, time.perf_counter() - t0)
            except WasmtimeError as e:             # another build of wasmtime, or a torn file
                log.warning("compiled plugin %s unusable, recompiling: %s", path, e)
        component = Component(engine, wasm)
        seconds = time.perf_counter() - t0
        self.misses += 1
        self._store(path, component)
        return Loaded(component, sha, False, seconds)

    def _store(self, path: pathlib.Path, component: Component) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(component.serialize())
            os.replace(tmp, path)
        except OSError as e:                       # a read-only cache only costs the next start
            log.warning("cannot cache compiled plugin at %s: %s", path, e)
