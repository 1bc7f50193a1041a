"""Loading the watched directory incrementally: re-parse only the files that changed.

Parsing YAML (with every field's line) is most of a reload: 1,000 files take
seconds here. The control plane keeps each file's parsed resources keyed by
(mtime, size, inode) and re-parses only what changed; the whole change set is
still checked as one (mesh.change_set.check_config), so the result is exactly
`mesh.change_set.load_config(directory)` — all or nothing. Resources are shared
between successive configs: validation and translation only read them, so
per-resource validation results are kept by resource object
(mesh.validation.ValidationCache) and only the re-parsed files' resources are
validated again; the cross-resource analyzers run on the whole set, but
after an endpoint-only change only those that read endpoints do, and after a
change to VirtualServices alone the per-route ones run on the changed routes
only (mesh.analyze.AnalysisCache).
"""
from __future__ import annotations

import os

from mcp26.mesh.analyze import AnalysisCache
from mcp26.mesh.change_set import check_config
from mcp26.mesh.diagnostics import ConfigError, Diagnostic
from mcp26.mesh.parse import parse_documents, read_config_file, unreadable, yaml_files
from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.mesh.validation import ValidationCache


class IncrementalLoader:
    def __init__(self):
        self._files: dict[str, tuple[tuple, list[Resource] | None, list[Diagnostic]]] = {}
        self.parsed = 0      # files parsed by the last load (tests, logs)
        self.validation = ValidationCache()   # .validated: resources validated by the last load
        self.analysis = AnalysisCache()       # .reused: analyzers whose findings the last load kept

    def __call__(self, directory: str) -> MeshConfig:
        if not os.path.isdir(directory):
            raise ConfigError([Diagnostic(f"config directory {directory!r} does not exist", file=directory)])
        resources: list[Resource] = []
        errors: list[Diagnostic] = []
        seen: dict = {}
        self.parsed = 0
        for path in yaml_files(directory):
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            except OSError as e:     # a symlink loop, a dangling permission: this file is rejected
                seen[path] = (None, None, [unreadable(path, e)])
                errors.extend(seen[path][2])
                continue
            key = (st.st_mtime_ns, st.st_size, st.st_ino)
            cached = self._files.get(path)
            if cached is None or cached[0] != key:
                cached = (key, *self._parse(path))
                self.parsed += 1
            seen[path] = cached
            if cached[1] is not None:
                resources.extend(cached[1])
            errors.extend(cached[2])
        self._files = seen            # files that are gone are forgotten
        if errors:
            self.validation.validated = 0
            raise ConfigError(errors)
        return check_config(MeshConfig(resources), self.validation, analysis=self.analysis)

    @staticmethod
    def _parse(path: str) -> tuple[list[Resource] | None, list[Diagnostic]]:
        try:   # only a regular file, at most MAX_FILE_BYTES (a FIFO or /dev/zero is an error)
            return parse_documents(read_config_file(path), file=path), []
        except ConfigError as e:
            return None, list(e.diagnostics)
