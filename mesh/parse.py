"""Multi-document YAML -> mesh.resources.Resource, with the line of every field.

Files and directories of YAML are parsed whole: every parse error of every
file is collected before ConfigError is raised.

Hostile input is bounded (a config directory is written by people and tools,
not always carefully): only regular files of at most MAX_FILE_BYTES are read
(a `.yaml` symlink to /dev/zero or a FIFO is an error, not a hang); anchors
and aliases are expanded under go-yaml v3's "excessive aliasing" budget, the
rule Kubernetes' YAML decoder applies, so 767 bytes of nested aliases (a
"billion laughs") is rejected after a few thousand nodes instead of growing
to gigabytes; a recursive alias and nesting deeper than MAX_DEPTH are errors.
"""
from __future__ import annotations

import errno
import gc
import os
import re
import stat
from typing import Any, Iterable

import yaml

from mcp26.mesh.diagnostics import ConfigError, Diagnostic
from mcp26.mesh.resources import MeshConfig, Resource

try:  # the C loader is much faster on large configs
    _Loader = yaml.CSafeLoader
except AttributeError:  # pragma: no cover
    _Loader = yaml.SafeLoader



# go-yaml reads two things differently from PyYAML (YAML 1.1), and a file the
# API server accepts must load here the same way:
#  - a plain scalar in a flow collection ends at ':' only when a blank follows
#    (go-yaml scannerc.go, yaml_parser_scan_plain_scalar), so `[001:db8::]` is
#    the string "001:db8::", where PyYAML ends it at ':' before ']' or ','
#    and makes a mapping (or a parse error) of an IPv6 address;
#  - no sexagesimal numbers: `1:20` is the string "1:20", not 80.
class _GoResolver(yaml.resolver.Resolver):
    pass


_GoResolver.yaml_implicit_resolvers = {
    first: [(tag, re.compile(rx.pattern
                             .replace("\n                    |[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+", "")
                             .replace("\n                    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\\.[0-9_]*", ""),
                             rx.flags))
            for tag, rx in entries]
    for first, entries in yaml.resolver.Resolver.yaml_implicit_resolvers.items()}


class _GoFlowScanner(yaml.scanner.Scanner):
    def scan_plain(self):
        """PyYAML's scan_plain with go-yaml's end of a plain scalar."""
        blanks = "\0 \t\r\n\x85\u2028\u2029"
        chunks, spaces = [], []
        start_mark = end_mark = self.get_mark()
        indent = self.indent + 1
        while self.peek() != "#":
            length = 0
            while True:
                ch = self.peek(length)
                if ch in blanks or (ch == ":" and self.peek(length + 1) in blanks) \
                        or (self.flow_level and ch in ",?[]{}"):
                    break
                length += 1
            if length == 0:
                break
            self.allow_simple_key = False
            chunks.extend(spaces)
            chunks.append(self.prefix(length))
            self.forward(length)
            end_mark = self.get_mark()
            spaces = self.scan_plain_spaces(indent, start_mark)
            if not spaces or self.peek() == "#" or (not self.flow_level and self.column < indent):
                break
        return yaml.tokens.ScalarToken("".join(chunks), True, start_mark, end_mark)


class _GoFlowLoader(yaml.reader.Reader, _GoFlowScanner, yaml.parser.Parser, yaml.composer.Composer,
                    yaml.constructor.SafeConstructor, _GoResolver):
    def __init__(self, stream):
        yaml.reader.Reader.__init__(self, stream)
        _GoFlowScanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        yaml.constructor.SafeConstructor.__init__(self)
        _GoResolver.__init__(self)


class _FastLoader(_Loader):
    yaml_implicit_resolvers = _GoResolver.yaml_implicit_resolvers


# Where the two scanners could differ: a ':' right before a flow indicator.
# Only such texts pay for the pure-Python scanner.
_FLOW_COLON = re.compile(r"\S:[,\[\]{}]")


def _loader_for(text: str):
    return _GoFlowLoader if _FLOW_COLON.search(text) else _FastLoader


YAML_SUFFIXES = (".yaml", ".yml")
_SCALARS = yaml.constructor.SafeConstructor()

MAX_FILE_BYTES = 64 << 20   # the 1,000-service benchmark directory is 5 MB in all
MAX_DEPTH = 200             # Istio resources nest a dozen levels; Python recursion ends near 1,000

# go-yaml v3 (decode.go, allowedAliasRatio): once more than 100 nodes were decoded
# inside alias expansions and more than 1,000 in all, the share decoded inside
# aliases may be 99 % up to 400,000 nodes, falling linearly to 10 % at 4,000,000.
_ALIAS_RATIO_LOW, _ALIAS_RATIO_HIGH = 400_000, 4_000_000


def _allowed_alias_ratio(decoded: int) -> float:
    if decoded <= _ALIAS_RATIO_LOW:
        return 0.99
    if decoded >= _ALIAS_RATIO_HIGH:
        return 0.10
    return 0.99 - 0.89 * (decoded - _ALIAS_RATIO_LOW) / (_ALIAS_RATIO_HIGH - _ALIAS_RATIO_LOW)


class _Unsafe(Exception):
    """A document whose expansion is refused (aliasing, recursion, depth)."""

    def __init__(self, message: str, line: int, field: str):
        super().__init__(message)
        self.message, self.line, self.field = message, line, field


class _Budget:
    """The work one file's documents may cost, counted as go-yaml counts it."""

    def __init__(self):
        self.decoded = 0          # nodes turned into Python values (every path, aliases expanded)
        self.aliased = 0          # of those, nodes reached through an alias
        self.seen: set[int] = set()    # collections decoded once: a second visit is through an alias
        self.stack: set[int] = set()   # the collections being decoded: meeting one again is a cycle
        self.alias_depth = 0

    def enter(self, node: yaml.Node, path: str, depth: int) -> bool:
        """Count one mapping or sequence; True if it is reached through an alias
        (decoded before: the composer shares an anchored node between its uses)."""
        key = id(node)
        if key in self.stack:
            raise _Unsafe("recursive alias: a node contains itself", node.start_mark.line + 1, path)
        if depth > MAX_DEPTH:
            raise _Unsafe(f"nested deeper than {MAX_DEPTH} levels", node.start_mark.line + 1, path)
        alias = key in self.seen
        self.seen.add(key)
        self.count(node, path, alias)
        return alias

    def count(self, node: yaml.Node, path: str, alias: bool = False) -> None:
        self.decoded += 1
        if self.alias_depth or alias:
            self.aliased += 1
            if (self.aliased > 100 and self.decoded > 1000
                    and self.aliased / self.decoded > _allowed_alias_ratio(self.decoded)):
                raise _Unsafe(f"excessive aliasing: {self.aliased} of {self.decoded} nodes decoded "
                              "came from anchors and aliases (a YAML alias bomb?)",
                              node.start_mark.line + 1, path)


def read_config_file(path: str) -> str:
    """The text of one config file: a regular file of at most MAX_FILE_BYTES, UTF-8.

    Opened non-blocking and checked on the open descriptor, so a FIFO or a device
    swapped in between a stat and the open cannot block the reader either.
    Raises ConfigError naming the file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ConfigError([unreadable(path, e)]) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError([Diagnostic(f"cannot read: not a regular file ({_file_type(st.st_mode)}); "
                                          "only regular files (or symlinks to them) are read", file=path)])
        if st.st_size > MAX_FILE_BYTES:
            raise ConfigError([Diagnostic(f"cannot read: {st.st_size} bytes, over the limit of "
                                          f"{MAX_FILE_BYTES} bytes per file", file=path)])
        chunks, size = [], 0
        while True:      # read at most the cap (+1 to notice a file that grew meanwhile)
            chunk = os.read(fd, min(1 << 20, MAX_FILE_BYTES + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_FILE_BYTES:
                raise ConfigError([Diagnostic(f"cannot read: over the limit of {MAX_FILE_BYTES} "
                                              "bytes per file", file=path)])
    except OSError as e:
        raise ConfigError([unreadable(path, e)]) from None
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError([Diagnostic(f"cannot read: not UTF-8 ({e.reason} at byte {e.start})",
                                      file=path)]) from None


def unreadable(path: str, e: OSError) -> Diagnostic:
    """The diagnostic for a config file the OS would not let us read (stat or open)."""
    reason = e.strerror or str(e)
    if e.errno == errno.ELOOP:
        reason += " (a symlink loop?)"
    return Diagnostic(f"cannot read: {reason}", file=path)


def _file_type(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


class _DuplicateKey(Exception):
    """A key given twice in one mapping: PyYAML keeps the last silently, the
    Kubernetes API server rejects it, so a config must not mean either."""

    def __init__(self, key: str, field: str, line: int, first_line: int):
        super().__init__(field)
        self.key, self.field, self.line, self.first_line = key, field, line, first_line


def _to_python(node: yaml.Node, path: str, lines: dict, budget: _Budget, depth: int = 0) -> Any:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
        alias = budget.enter(node, path, depth)
        budget.stack.add(id(node))
        budget.alias_depth += alias
        try:
            if isinstance(node, yaml.SequenceNode):
                return [_to_python(v, f"{path}[{i}]", lines, budget, depth + 1) for i, v in enumerate(node.value)]
            out = {}
            for key_node, value_node in node.value:
                key = str(key_node.value)
                child = f"{path}.{key}" if path else str(key)
                if key in out:
                    raise _DuplicateKey(key, child, key_node.start_mark.line + 1, lines[child])
                out[key] = _to_python(value_node, child, lines, budget, depth + 1)
                lines[child] = key_node.start_mark.line + 1
            return out
        finally:
            budget.stack.discard(id(node))
            budget.alias_depth -= alias
    budget.count(node, path)
    # Scalars: the safe constructor resolves ints, bools, nulls and floats.
    value = _SCALARS.construct_object(node, deep=True)
    # The constructor memoizes every node it builds (constructed_objects):
    # without this, a long-running control plane keeps every scalar it ever parsed.
    _SCALARS.constructed_objects.clear()
    return value


def yaml_error_message(problem: str, text: str, mark) -> str:
    """A YAML syntax error as an editor shows it: the column, the line with a caret under the
    spot (a tab drawn as '→'), and what a tab there means."""
    if mark is None:
        return f"malformed YAML: {problem}"
    lines = text.splitlines()
    source = lines[mark.line] if 0 <= mark.line < len(lines) else ""
    hint = ""
    if "\t" in source[:mark.column + 1]:
        hint = " (a tab: YAML indents with spaces only)"
    shown = source.replace("\t", "→")[:200]
    caret = " " * min(mark.column, len(shown)) + "^"
    return f"malformed YAML at column {mark.column + 1}: {problem}{hint}\n    {shown}\n    {caret}"


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


def _documents(doc, lines: dict, line: int) -> list[tuple]:
    """A document, or the items of a `kind: List` (what `kubectl get -o yaml`
    writes), each with its own field lines."""
    if not (isinstance(doc, dict) and doc.get("kind") == "List" and isinstance(doc.get("items"), list)):
        return [(doc, lines, line)]
    out = []
    for i, item in enumerate(doc["items"]):
        prefix = f"items[{i}]"
        sub = {k[len(prefix) + 1:]: v for k, v in lines.items() if k.startswith(prefix + ".")}
        out.append((item, sub, lines.get(prefix, line)))
    return out


def _parse_documents(text: str, file: str) -> list[Resource]:
    try:
        nodes = list(yaml.compose_all(text, Loader=_loader_for(text)))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        line = mark.line + 1 if mark else 0
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError([Diagnostic(yaml_error_message(problem, text, mark), file=file, line=line)]) from None
    out, errors = [], []
    budget = _Budget()      # one per file: aliases cannot cross documents, the work adds up
    for node in nodes:
        if node is None:
            continue
        lines: dict = {}
        line = node.start_mark.line + 1
        try:
            doc = _to_python(node, "", lines, budget)
        except _DuplicateKey as dup:
            errors.append(Diagnostic(f"malformed YAML: key {dup.key!r} already set in this "
                                     f"mapping (line {dup.first_line})", file=file, line=dup.line, field=dup.field))
            continue
        except _Unsafe as bad:
            # Name the resource when its head was readable (kind and name come before a spec).
            head = node.value if isinstance(node, yaml.MappingNode) else []
            meta = {str(k.value): v for k, v in head}
            names = {str(k.value): str(v.value) for k, v in (meta["metadata"].value if isinstance(
                meta.get("metadata"), yaml.MappingNode) else []) if isinstance(v, yaml.ScalarNode)}
            kind = meta["kind"].value if isinstance(meta.get("kind"), yaml.ScalarNode) else None
            ref = f"{kind}/{names.get('namespace') or 'default'}/{names['name']}" if kind and names.get("name") else ""
            field = bad.field if len(bad.field) <= 120 else bad.field[:120] + "..."
            errors.append(Diagnostic(f"refused YAML: {bad.message}", file=file, line=bad.line,
                                     resource=ref, field=field))
            continue
        for doc, lines, line in _documents(doc, lines, line):
            if doc is None:
                continue
            res = resource_from_document(doc, file, line, lines, errors)
            if res is not None:
                out.append(res)
    if errors:
        raise ConfigError(errors)
    return out


def resource_from_document(doc, file: str, line: int, lines: dict, errors: list[Diagnostic]) -> Resource | None:
    """One Kubernetes object (a YAML document, or an object the API server sent) as a Resource,
    or None with the reasons appended to `errors`. The directory and the Kubernetes source
    (mcp26.mesh.kube_source) both build their resources here, so they agree field for field."""
    if not isinstance(doc, dict):
        errors.append(Diagnostic("a document must be a mapping with apiVersion, kind, metadata", file=file, line=line))
        return None
    meta = doc.get("metadata") or {}
    if not isinstance(meta, dict):
        errors.append(Diagnostic("metadata must be a mapping", file=file, line=lines.get("metadata", line), field="metadata"))
        return None
    kind = doc.get("kind")
    name = meta.get("name")
    ref = f"{kind or '(no kind)'}/{meta.get('namespace') or 'default'}/{name or '(no name)'}"
    for key in ("apiVersion", "kind"):
        if not isinstance(doc.get(key), str) or not doc.get(key):
            errors.append(Diagnostic(f"{key} is required", file=file, line=line, resource=ref, field=key))
    if not isinstance(name, str) or not name:
        errors.append(Diagnostic("metadata.name is required", file=file, line=lines.get("metadata", line), resource=ref, field="metadata.name"))
    spec = doc.get("spec", {})
    api = str(doc.get("apiVersion") or "/")
    if "spec" not in doc and ("/" not in api or api.startswith("discovery.k8s.io/")):
        # A core (v1) kind such as Secret or Endpoints, and an EndpointSlice,
        # keep their fields beside metadata (type, data, subsets, endpoints):
        # they are its spec here.
        spec = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "metadata")}
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        errors.append(Diagnostic("spec must be a mapping", file=file, line=lines.get("spec", line), resource=ref, field="spec"))
        return None
    return Resource(
        api_version=str(doc.get("apiVersion") or ""), kind=str(kind or ""), name=str(name or ""),
        namespace=str(meta.get("namespace") or "default"), spec=spec, file=file, line=line,
        labels=dict(meta.get("labels") or {}), annotations=dict(meta.get("annotations") or {}),
        lines=lines, status=doc["status"] if isinstance(doc.get("status"), dict) else {},
    )


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
            resources.extend(parse_documents(read_config_file(path), file=path))
        except ConfigError as e:
            errors.extend(e.diagnostics)
    if errors:
        raise ConfigError(errors)
    return MeshConfig(resources)


def load_dir(directory: str) -> MeshConfig:
    if not os.path.isdir(directory):
        raise ConfigError([Diagnostic(f"config directory {directory!r} does not exist", file=directory)])
    return load_files(yaml_files(directory))
