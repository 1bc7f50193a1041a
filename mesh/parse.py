"""Multi-document YAML -> mesh.resources.Resource, with the line of every field.

Files and directories of YAML are parsed whole: every parse error of every
file is collected before ConfigError is raised.
"""
from __future__ import annotations

import gc
import os
from typing import Any, Iterable

import yaml

from mesh.diagnostics import ConfigError, Diagnostic
from mesh.resources import MeshConfig, Resource

try:  # the C loader is much faster on large configs
    _Loader = yaml.CSafeLoader
except AttributeError:  # pragma: no cover
    _Loader = yaml.SafeLoader

YAML_SUFFIXES = (".yaml", ".yml")
_SCALARS = yaml.constructor.SafeConstructor()


class _DuplicateKey(Exception):
    """A key given twice in one mapping: PyYAML keeps the last silently, the
    Kubernetes API server rejects it, so a config must not mean either."""

    def __init__(self, key: str, field: str, line: int, first_line: int):
        super().__init__(field)
        self.key, self.field, self.line, self.first_line = key, field, line, first_line


def _to_python(node: yaml.Node, path: str, lines: dict) -> Any:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            child = f"{path}.{key}" if path else str(key)
            if key in out:
                raise _DuplicateKey(key, child, key_node.start_mark.line + 1, lines[child])
            out[key] = _to_python(value_node, child, lines)
            lines[child] = key_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_to_python(v, f"{path}[{i}]", lines) for i, v in enumerate(node.value)]
    # Scalars: the safe constructor resolves ints, bools, nulls and floats.
    value = _SCALARS.construct_object(node, deep=True)
    # The constructor memoizes every node it builds (constructed_objects):
    # without this, a long-running control plane keeps every scalar it ever parsed.
    _SCALARS.constructed_objects.clear()
    return value


def parse_documents(text: str, file: str = "<input>") -> list[Resource]:
    """Parse one multi-document YAML text into resources (no semantic checks)."""
    # Composing holds every node of the text at once, and the cyclic GC would
    # rescan that growing heap over and over (5 MB of YAML: ~30 s instead of
    # ~3 s). Nodes and specs form no cycles, so refcounting frees them.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _parse_documents(text, file)
    finally:
        if enabled:
            gc.enable()


def _parse_documents(text: str, file: str) -> list[Resource]:
    try:
        nodes = list(yaml.compose_all(text, Loader=_Loader))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        line = mark.line + 1 if mark else 0
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError([Diagnostic(f"malformed YAML: {problem}", file=file, line=line)]) from None
    out, errors = [], []
    for node in nodes:
        if node is None:
            continue
        lines: dict = {}
        line = node.start_mark.line + 1
        try:
            doc = _to_python(node, "", lines)
        except _DuplicateKey as dup:
            errors.append(Diagnostic(f"malformed YAML: key {dup.key!r} already set in this "
                                     f"mapping (line {dup.first_line})", file=file, line=dup.line, field=dup.field))
            continue
        if doc is None:
            continue
        if not isinstance(doc, dict):
            errors.append(Diagnostic("a document must be a mapping with apiVersion, kind, metadata", file=file, line=line))
            continue
        meta = doc.get("metadata") or {}
        if not isinstance(meta, dict):
            errors.append(Diagnostic("metadata must be a mapping", file=file, line=lines.get("metadata", line), field="metadata"))
            continue
        kind = doc.get("kind")
        name = meta.get("name")
        ref = f"{kind}/{meta.get('namespace') or 'default'}/{name}"
        for key in ("apiVersion", "kind"):
            if not isinstance(doc.get(key), str) or not doc.get(key):
                errors.append(Diagnostic(f"{key} is required", file=file, line=line, resource=ref, field=key))
        if not isinstance(name, str) or not name:
            errors.append(Diagnostic("metadata.name is required", file=file, line=lines.get("metadata", line), resource=ref, field="metadata.name"))
        spec = doc.get("spec", {})
        if spec is None:
            spec = {}
        if not isinstance(spec, dict):
            errors.append(Diagnostic("spec must be a mapping", file=file, line=lines.get("spec", line), resource=ref, field="spec"))
            continue
        out.append(Resource(
            api_version=str(doc.get("apiVersion") or ""), kind=str(kind or ""), name=str(name or ""),
            namespace=str(meta.get("namespace") or "default"), spec=spec, file=file, line=line,
            labels=dict(meta.get("labels") or {}), annotations=dict(meta.get("annotations") or {}),
            lines=lines,
        ))
    if errors:
        raise ConfigError(errors)
    return out


def yaml_files(directory: str) -> list[str]:
    """The YAML files of a config directory, recursively, in a stable order."""
    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for f in sorted(files):
            if f.endswith(YAML_SUFFIXES) and not f.startswith("."):
                found.append(os.path.join(root, f))
    return found


def load_files(paths: Iterable[str]) -> MeshConfig:
    """Parse every file; all parse errors are collected before raising."""
    resources, errors = [], []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            resources.extend(parse_documents(text, file=path))
        except ConfigError as e:
            errors.extend(e.diagnostics)
        except (OSError, UnicodeDecodeError) as e:
            errors.append(Diagnostic(f"cannot read: {e}", file=path))
    if errors:
        raise ConfigError(errors)
    return MeshConfig(resources)


def load_dir(directory: str) -> MeshConfig:
    if not os.path.isdir(directory):
        raise ConfigError([Diagnostic(f"config directory {directory!r} does not exist", file=directory)])
    return load_files(yaml_files(directory))
