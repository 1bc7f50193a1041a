"""The Wasm modules a change set's WasmPlugins name, read when the change set is loaded.

Translation embeds a module's bytes inline (translate/wasm_plugins.py: Envoy
runs exactly the bytes that were checked), but never reads a file: the server
reads every HTTP WasmPlugin's module here, after the YAML is loaded and before
anything is translated, checks it against the plugin's `sha256`, and hands the
bytes to translation in its Overlay. A missing, unreadable or mismatched
module rejects the change set whole, each bad plugin named by file:line and
`spec.url`, and the last good config keeps being served.

`url` is file:// or a plain path; other schemes are not fetched (there is no
network to fetch from, and istio-agent's cache is not ours). A module must be
a regular file (a FIFO or /dev/zero is an error, not a hang) of at most
MAX_MODULE_BYTES: it travels inline in one ECDS resource.

The store keeps the bytes by their SHA-256 (plugins naming the same bytes
share one copy), at most `max_bytes` of them, least recently used dropped
first, and which file had which SHA-256 by (path, device, inode, size,
mtime): a reload of unchanged files reads no module again. What a loaded
config holds stays held by its Overlay whatever the store drops.
"""
from __future__ import annotations

import hashlib
import os
import stat
import threading
from collections import OrderedDict
from urllib.parse import unquote, urlsplit

from mcp26.mesh.diagnostics import ConfigError
from mcp26.mesh.resources import MeshConfig
from mcp26.xds.translate.overlay import WasmModule

KIND = "WasmPlugin"
MAX_MODULE_BYTES = 32 << 20      # ADS messages are at most 64 MiB (server.MAX_MESSAGE); the filter is 35 KB
MAX_CACHED_BYTES = 128 << 20     # module bytes kept between loads
MAX_CACHED_FILES = 1024          # (file identity -> SHA-256) entries kept between loads


def module_path(url) -> str:
    """The local file a WasmPlugin url names (file:// or a path); other schemes are not fetched."""
    if not isinstance(url, str) or not url:
        raise ValueError(f"expected a file:// URL or a path, not {url!r}")
    u = urlsplit(url)
    if u.scheme == "file":
        return unquote(u.path)
    if u.scheme == "":
        return url
    raise ValueError(f"url scheme {u.scheme!r} is not supported here (use file://)")


class WasmModuleStore:
    """Reads and checks a config's Wasm modules (thread-safe); keeps their bytes by SHA-256, bounded."""

    def __init__(self, max_bytes: int = MAX_CACHED_BYTES, max_files: int = MAX_CACHED_FILES):
        self.max_bytes, self.max_files = max_bytes, max_files
        self._lock = threading.Lock()
        self._by_sha: OrderedDict[str, bytes] = OrderedDict()
        self._by_file: OrderedDict[tuple, str] = OrderedDict()
        self.reads = 0          # module files read (tests)

    @property
    def cached_bytes(self) -> int:
        with self._lock:
            return sum(len(b) for b in self._by_sha.values())

    def load(self, config: MeshConfig) -> dict[str, WasmModule]:
        """{url: WasmModule} of every HTTP WasmPlugin in `config` (what translation may embed);
        ConfigError naming each plugin whose module cannot be read or does not match its sha256."""
        out: dict[str, WasmModule] = {}
        errors = []
        for res in config.of_kind(KIND):
            if (res.spec.get("type") or "HTTP") != "HTTP":
                continue            # translation builds HTTP filters only
            try:
                url = res.spec["url"]
                module = out.get(url) if isinstance(url, str) else None
                module = module or self._module(url)
                want = res.spec.get("sha256")
                if want and module.sha256 != str(want).lower():
                    raise ValueError(f"{module_path(url)}: sha256 {module.sha256} does not match {want}")
            except (OSError, ValueError, KeyError) as e:
                errors.append(res.diagnostic("spec.url", f"cannot load the Wasm module: {e}"))
                continue
            out[url] = module
        if errors:
            raise ConfigError(errors)
        return out

    def _module(self, url) -> WasmModule:
        path = module_path(url)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{path}: not a regular file")
            if st.st_size > MAX_MODULE_BYTES:
                raise ValueError(f"{path}: {st.st_size} bytes, over the limit of {MAX_MODULE_BYTES} bytes per module")
            ident = (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            with self._lock:
                sha = self._by_file.get(ident)
                code = self._by_sha.get(sha) if sha else None
                if code is not None:
                    self._by_file.move_to_end(ident)
                    self._by_sha.move_to_end(sha)
                    return WasmModule(sha, code)
            code = _read(fd, path)
        finally:
            os.close(fd)
        sha = hashlib.sha256(code).hexdigest()
        with self._lock:
            self.reads += 1
            code = self._by_sha.get(sha, code)       # the same bytes under another name: one copy
            self._by_sha[sha] = code
            self._by_sha.move_to_end(sha)
            self._by_file[ident] = sha
            self._by_file.move_to_end(ident)
            self._shrink(keep=sha)
        return WasmModule(sha, code)

    def _shrink(self, keep: str) -> None:
        total = sum(len(b) for b in self._by_sha.values())
        for sha in list(self._by_sha):
            if total <= self.max_bytes:
                break
            if sha != keep:
                total -= len(self._by_sha.pop(sha))
        while len(self._by_file) > self.max_files:
            self._by_file.popitem(last=False)


def _read(fd: int, path: str) -> bytes:
    chunks, size = [], 0
    while True:          # at most the cap (+1 to notice a file that grew since the fstat)
        chunk = os.read(fd, min(1 << 20, MAX_MODULE_BYTES + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_MODULE_BYTES:
            raise ValueError(f"{path}: over the limit of {MAX_MODULE_BYTES} bytes per module")
