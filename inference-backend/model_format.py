"""`.mcp26bin`: a served model's container, mapped in place by ONNX Runtime.

Layout (little-endian):

    0   magic  b"MCP26BIN"
    8   u16 major, u16 minor, u32 flags (0)
    16  u64 toc_offset, u64 toc_length
    32  sha256 of the table of contents (32 bytes): the file's identity
    64  table of contents (JSON, below), then the graph, then the chunks,
        each starting on a page (4096-byte) boundary

The table of contents names the source model (sha256 of its ONNX bytes), the
optimisation ONNX Runtime applied when packing, the graph (an ONNX ModelProto
whose initializers hold no data), the other files chunks come from (bases:
path relative to this file and their identity) and every initializer as a
chunk: name, dtype, shape, byte length, sha256, the file that holds it (0:
this one) and its offset there. Equal bytes are stored once (content
addressed); with a base, a chunk whose sha256 the base already holds is
referenced, not written, so a fine-tune that changes a few tensors ships
only those. A chunk is a whole initializer: ONNX Runtime needs each tensor
contiguous in one file, so a change anywhere in a tensor ships that tensor.

Why this load path (measured on builtin:mlp, 76 MB, 2 cores; the benchmark
`python -m benchmarks mcp26bin` gives the current figures):
- `SessionOptions.add_external_initializers` with OrtValues over mmap'd pages:
  ONNX Runtime copies them into the session (18.9k minor faults = the 76 MB
  touched, 0.10-0.19 s), so it is no faster than reading the ONNX file.
- ORT format, saved at the extended level: loaded with
  `session.use_ort_model_bytes_directly` and `..._for_initializers` the Python
  binding crashes (SIGSEGV: the bytes it was given do not outlive the call);
  without them 0.68 s and 93k minor faults, slower than the ONNX file.
- ONNX Runtime's own external-data loading, with every initializer's
  `location` pointing at this file (or a base) at its page-aligned offset:
  ONNX Runtime mmaps each range and uses it in place: 0 minor faults while
  loading, 1-10 ms. This is the path; the graph's `location`s are written at
  load time (relative to the files' common folder, as ONNX Runtime allows
  nothing else), so the file can be renamed or moved with its bases.
- Weight prepacking (`session.disable_prepacking`): ONNX Runtime repacks every
  GEMM weight into its own buffer when a session is made (a copy of the 76 MB,
  ~0.1 s); the mapped session turns it off, so nothing is copied. Its answers
  are bit-identical to the source ONNX model run with the same setting; with
  prepacking on, MLAS's packed GEMM rounds differently (up to 4e-7 on
  builtin:mlp). Unpacked, a GEMM-bound model computes up to ~2x slower, so the
  server settles (model_server._maybe_settle): it serves from the mapped session
  at once and builds, beside it, the session an ONNX file gets (all levels,
  prepacked), then swaps it in; from then the answers are the ONNX file's, bit
  for bit (tested), at its speed.

Optimisation: `basic` (default) is ONNX Runtime's level 1 (constant folding,
redundant-node elimination, Conv+BatchNorm folding...): provider-independent,
and loading the packed graph at the same level gives the same answers as the
source model at that level (tested). `--optimize` packs at `extended` (level 2:
fusions such as Gemm+Relu, for the CPU execution provider only; the file says
so, and loading it for another provider is refused). Layout transforms (level
3, `all`) are machine-specific and copy weights, so they are never packed: the
settled session applies them when it is made, as for an ONNX file.

Loading checks the header, the table's hash, the graph's hash, that every
chunk lies inside its file, and each base's identity; `verify()` (and
`mcpctl model inspect --verify`) hashes every chunk too, and a hot update
hashes the chunks that are not in the files the running version came from. Every error is a
`FormatError` naming the file and what is wrong.
"""
from __future__ import annotations

import collections
import hashlib
import json
import os
import struct
import tempfile
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

MAGIC = b"MCP26BIN"
MAJOR, MINOR = 1, 0
HEADER = struct.Struct("<8sHHIQQ32s")     # magic, major, minor, flags, toc offset, toc length, toc sha256
PAGE = 4096
SUFFIX = ".mcp26bin"
LEVELS = {"basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED"}
MAX_TOC = 64 << 20                         # a table larger than this is not one we wrote


class FormatError(ValueError):
    """A `.mcp26bin` file that cannot be used, said with the file and what is wrong."""


def is_container(path: str) -> bool:
    if path.endswith(SUFFIX):
        return True
    try:
        with open(path, "rb") as fh:
            return fh.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def _sha(data) -> str:
    return hashlib.sha256(data).hexdigest()


def _align(n: int) -> int:
    return (n + PAGE - 1) // PAGE * PAGE


# -- reading ---------------------------------------------------------------------------

@dataclass
class Container:
    """One parsed file: its table, and the files its chunks live in (index 0: itself)."""
    path: str
    toc: dict
    identity: str                    # sha256 of the table
    files: list[str]                 # absolute paths, index as in the chunks' "file"
    bases: list["Container"]

    @property
    def chunks(self) -> list[dict]:
        return self.toc["chunks"]

    @property
    def level(self) -> str:
        return self.toc["optimization"]["level"]

    def graph_bytes(self) -> bytes:
        g = self.toc["graph"]
        with open(self.path, "rb") as fh:
            fh.seek(g["offset"])
            data = fh.read(g["length"])
        if len(data) != g["length"]:
            raise FormatError(f"{self.path}: truncated: the graph ends at byte {g['offset'] + g['length']}, "
                              f"the file has {os.path.getsize(self.path)}")
        if _sha(data) != g["sha256"]:
            raise FormatError(f"{self.path}: hash mismatch: graph (sha256 {_sha(data)[:16]}..., "
                              f"table says {g['sha256'][:16]}...)")
        return data


def _header(path: str, fh) -> tuple:
    """The fixed header's fields (magic and major version checked)."""
    head = fh.read(HEADER.size)
    if len(head) < HEADER.size:
        raise FormatError(f"{path}: truncated: {len(head)} bytes, shorter than the {HEADER.size}-byte header")
    fields = HEADER.unpack(head)
    magic, major, minor = fields[:3]
    if magic != MAGIC:
        raise FormatError(f"{path}: bad magic {magic!r}: not a .mcp26bin file (expected {MAGIC!r})")
    if major != MAJOR:
        raise FormatError(f"{path}: format version {major}.{minor}; this server reads {MAJOR}.x")
    return fields


def _read_identity(path: str, fh) -> str:
    """A base's identity (its table of contents' sha256) from its header alone: the chunks
    this file takes from it are hashed in this file's own table (verify), so its table need
    not be read, which a hot update would pay each time (~0.7 ms for a ResNet-50's)."""
    return _header(path, fh)[6].hex()


def _read_header(path: str, fh) -> tuple[dict, str]:
    _magic, _major, _minor, _flags, toc_off, toc_len, toc_sha = _header(path, fh)
    size = os.fstat(fh.fileno()).st_size
    if toc_len > MAX_TOC or toc_off + toc_len > size:
        raise FormatError(f"{path}: truncated: the table of contents ends at byte {toc_off + toc_len}, "
                          f"the file has {size}")
    fh.seek(toc_off)
    raw = fh.read(toc_len)
    if hashlib.sha256(raw).digest() != toc_sha:
        raise FormatError(f"{path}: hash mismatch: table of contents (the header's sha256 differs)")
    try:
        toc = json.loads(raw)
        _check_toc(toc)
    except (ValueError, KeyError, TypeError) as e:
        raise FormatError(f"{path}: table of contents: {e}") from None
    return toc, toc_sha.hex()


def _check_toc(toc: dict) -> None:
    for key, kind in (("graph", dict), ("chunks", list), ("bases", list), ("optimization", dict)):
        if not isinstance(toc.get(key), kind):
            raise ValueError(f"field {key!r} missing or not a {kind.__name__}")
    if toc["optimization"].get("level") not in LEVELS:
        raise ValueError(f"optimization.level {toc['optimization'].get('level')!r}: expected one of {sorted(LEVELS)}")
    for i, c in enumerate(toc["chunks"]):
        for key, kind in (("name", str), ("dtype", str), ("shape", list), ("length", int), ("sha256", str),
                          ("file", int), ("offset", int)):
            if not isinstance(c.get(key), kind):
                raise ValueError(f"chunks[{i}].{key} missing or not a {kind.__name__}")
        if not 0 <= c["file"] <= len(toc["bases"]):
            raise ValueError(f"chunks[{i}] ({c['name']!r}): file {c['file']} names no base")
        if c["offset"] % PAGE:
            raise ValueError(f"chunks[{i}] ({c['name']!r}): offset {c['offset']} is not page-aligned")


def open_container(path: str, _depth: int = 0) -> Container:
    """Parse `path` and its bases; check everything but the chunks' hashes."""
    path = os.path.abspath(path)
    try:
        with open(path, "rb") as fh:
            toc, identity = _read_header(path, fh)
    except FileNotFoundError:
        raise FormatError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise FormatError(f"{path}: is a directory, not a .mcp26bin file") from None
    folder = os.path.dirname(path)
    files, bases = [path], []
    for i, b in enumerate(toc["bases"]):
        base_path = os.path.normpath(os.path.join(folder, b["path"]))
        if not os.path.isfile(base_path):
            raise FormatError(f"{path}: missing base: bases[{i}] {b['path']!r} (looked for {base_path}), "
                              f"identity {b['identity'][:16]}...")
        with open(base_path, "rb") as fh:
            base_identity = _read_identity(base_path, fh)
        if base_identity != b["identity"]:
            raise FormatError(f"{path}: wrong base: {base_path} has identity {base_identity[:16]}..., this file "
                              f"was packed against {b['identity'][:16]}... (the base changed since)")
        files.append(base_path)
        bases.append(Container(base_path, {}, base_identity, [base_path], []))
    sizes = [os.path.getsize(f) for f in files]
    g = toc["graph"]
    if g["offset"] + g["length"] > sizes[0]:
        raise FormatError(f"{path}: truncated: the graph ends at byte {g['offset'] + g['length']}, "
                          f"the file has {sizes[0]}")
    for c in toc["chunks"]:
        if c["offset"] + c["length"] > sizes[c["file"]]:
            raise FormatError(f"{files[c['file']]}: truncated chunk {c['name']!r}: it ends at byte "
                              f"{c['offset'] + c['length']}, the file has {sizes[c['file']]}")
    return Container(path, toc, identity, files, bases)


def file_keys(container: Container) -> list[str]:
    """`PATH@IDENTITY` of each file the chunks live in, index as in the chunks' "file"."""
    ids = [container.identity] + [b.identity for b in container.bases]
    return [f"{path}@{ident}" for path, ident in zip(container.files, ids)]


def verify(container: Container, trusted: frozenset = frozenset()) -> list[str]:
    """Hash every chunk where it lies, but those in the files `trusted` names (file_keys:
    a hot update trusts the files the running version was loaded from, by path and
    identity); the problems found (empty: all good)."""
    problems = []
    ids = file_keys(container)
    for c in container.chunks:
        if ids[c["file"]] in trusted:
            continue
        with open(container.files[c["file"]], "rb") as fh:
            fh.seek(c["offset"])
            h = hashlib.sha256()
            left = c["length"]
            while left:
                block = fh.read(min(left, 1 << 22))
                if not block:
                    break
                h.update(block)
                left -= len(block)
        if left or h.hexdigest() != c["sha256"]:
            problems.append(f"{container.files[c['file']]}: hash mismatch: chunk {c['name']!r} at byte "
                            f"{c['offset']} (sha256 {h.hexdigest()[:16]}..., table says {c['sha256'][:16]}...)")
    return problems


def session_source(container: Container) -> tuple[bytes, str]:
    """(model bytes, folder) for `onnxruntime.InferenceSession(bytes)` with
    `session.model_external_initializers_file_folder_path` = folder: every initializer
    points at its chunk, relative to the files' common folder (ONNX Runtime refuses
    absolute paths and `..` in external data locations)."""
    model = onnx.ModelProto()
    try:
        model.ParseFromString(container.graph_bytes())
    except Exception as e:      # protobuf's DecodeError
        raise FormatError(f"{container.path}: the graph is not an ONNX ModelProto: {e}") from None
    folder = os.path.commonpath([os.path.dirname(f) for f in container.files])
    locations = [os.path.relpath(f, folder) for f in container.files]     # once a file, not a chunk
    where = {c["name"]: c for c in container.chunks}
    for init in model.graph.initializer:
        c = where.get(init.name)
        if c is None:
            raise FormatError(f"{container.path}: initializer {init.name!r} of the graph has no chunk")
        del init.external_data[:]
        init.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", locations[c["file"]]),
                           ("offset", str(c["offset"])), ("length", str(c["length"]))):
            entry = init.external_data.add()
            entry.key, entry.value = key, value
    return model.SerializeToString(), folder


# -- writing ---------------------------------------------------------------------------

def optimize(source: str, level: str) -> onnx.ModelProto:
    """The source model after ONNX Runtime's offline optimisation at `level`, weights loaded."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[level])
    opts.log_severity_level = 3
    with tempfile.TemporaryDirectory(prefix="mcp26bin-") as tmp:
        out = os.path.join(tmp, "optimized.onnx")
        opts.optimized_model_filepath = out
        opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", "weights.bin")
        opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "0")
        try:
            ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])
        except Exception as e:
            raise FormatError(f"{source}: onnxruntime cannot load it: {e}") from None
        return onnx.load(out, load_external_data=True)


def pack(source: str, output: str, base: str | None = None, level: str = "basic") -> dict:
    """Write `output` from the ONNX file `source`; returns its table of contents."""
    if level not in LEVELS:
        raise FormatError(f"optimisation level {level!r}: expected one of {sorted(LEVELS)}")
    if is_container(source):
        raise FormatError(f"{source}: already a .mcp26bin file; pack the ONNX model")
    with open(source, "rb") as fh:
        source_sha = _sha(fh.read())
    try:
        source_ops = collections.Counter(n.op_type for n in onnx.load(source, load_external_data=False).graph.node)
    except Exception as e:          # onnx's DecodeError and friends
        raise FormatError(f"{source}: not an ONNX model: {e}") from None
    model = optimize(source, level)
    out_dir = os.path.dirname(os.path.abspath(output))
    known: dict[str, dict] = {}           # sha256 -> where the bytes already are
    bases = []
    if base is not None:
        try:
            b = open_container(base)
        except FormatError as e:
            raise FormatError(f"--base: {e}") from None
        if os.path.abspath(output) in b.files:
            raise FormatError(f"-o {output}: is the base (or one of its bases); the new file would reference "
                              f"chunks it overwrites")
        problems = verify(b)
        if problems:
            raise FormatError(f"--base {base}: " + "; ".join(problems))
        # the base's own files (itself and its bases) become ours, re-indexed
        index = {}
        for i, f in enumerate(b.files):
            index[i] = len(bases) + 1
            ident = b.identity if i == 0 else b.bases[i - 1].identity
            bases.append({"path": os.path.relpath(f, out_dir), "identity": ident})
        for c in b.chunks:
            known.setdefault(c["sha256"], {"file": index[c["file"]], "offset": c["offset"]})
    chunks, payload = [], []            # payload: (offset, bytes) written into this file
    for init in model.graph.initializer:
        array = numpy_helper.to_array(init)
        data = np.ascontiguousarray(array).tobytes()
        digest = _sha(data)
        entry = {"name": init.name, "dtype": str(array.dtype), "shape": list(array.shape),
                 "length": len(data), "sha256": digest}
        if digest not in known:
            known[digest] = {"file": 0, "offset": None, "data": data}
            payload.append(digest)
        chunks.append((entry, digest))
        init.ClearField("raw_data")
        for field in ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data"):
            init.ClearField(field)
        del init.external_data[:]
        init.data_location = onnx.TensorProto.EXTERNAL
    graph = model.SerializeToString()
    import onnxruntime as ort
    toc = {"format": "mcp26bin", "version": f"{MAJOR}.{MINOR}",
           "source": {"name": os.path.basename(source), "sha256": source_sha},
           "optimization": {"level": level, "onnxruntime": ort.__version__,
                            "provider": "CPUExecutionProvider" if level == "extended" else None,
                            "source_op_counts": dict(sorted(source_ops.items())),
                            "op_counts": dict(sorted(collections.Counter(n.op_type
                                                                         for n in model.graph.node).items()))},
           "graph": {"offset": 0, "length": len(graph), "sha256": _sha(graph)},
           "bases": bases, "chunks": []}
    # The table's length fixes every offset after it; offsets change the table's length:
    # lay out with a guess, re-lay until the table fits (converges in one or two rounds).
    room = 4096
    while True:
        graph_off = _align(HEADER.size + room)
        offset = _align(graph_off + len(graph))
        for digest in payload:
            known[digest]["offset"] = offset
            offset = _align(offset + len(known[digest]["data"]))
        toc["graph"]["offset"] = graph_off
        toc["chunks"] = [{**e, "file": known[d]["file"], "offset": known[d]["offset"]} for e, d in chunks]
        raw = json.dumps(toc, separators=(",", ":")).encode()
        if len(raw) <= room:
            break
        room = _align(len(raw) + 1024)
    end = offset
    tmp = output + ".tmp"       # then renamed: a server watching `output` never maps half a file
    try:
        with open(tmp, "wb") as fh:
            fh.write(HEADER.pack(MAGIC, MAJOR, MINOR, 0, HEADER.size, len(raw), hashlib.sha256(raw).digest()))
            fh.write(raw)
            fh.seek(graph_off)
            fh.write(graph)
            for digest in payload:
                fh.seek(known[digest]["offset"])
                fh.write(known[digest]["data"])
            fh.truncate(max(end, graph_off + len(graph)))
        os.replace(tmp, output)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return toc


def describe(container: Container) -> dict:
    """What `mcpctl model inspect` prints (and --output json gives)."""
    toc = container.toc
    own = sum(c["length"] for c in {c["sha256"]: c for c in toc["chunks"] if c["file"] == 0}.values())
    from_base = [c for c in toc["chunks"] if c["file"] != 0]
    return {
        "file": container.path, "identity": container.identity, "size": os.path.getsize(container.path),
        "version": toc.get("version"), "source": toc.get("source"), "optimization": toc["optimization"],
        "graph_bytes": toc["graph"]["length"], "chunks": len(toc["chunks"]), "chunk_bytes_here": own,
        "chunks_from_base": len(from_base), "chunk_bytes_from_base": sum(c["length"] for c in from_base),
        "bases": [{"path": b["path"], "identity": b["identity"]} for b in toc["bases"]],
        "table": [{"name": c["name"], "dtype": c["dtype"], "shape": c["shape"], "bytes": c["length"],
                   "sha256": c["sha256"],
                   "from": "this file" if c["file"] == 0 else toc["bases"][c["file"] - 1]["path"],
                   "offset": c["offset"]} for c in toc["chunks"]],
    }
