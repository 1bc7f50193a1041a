"""A Triton model repository on disk (`mcpctl serve --model-repository DIR`): its layout,
its config.pbtxt files, and what each means for this server.

Layout, as Triton's: `DIR/NAME/config.pbtxt` and `DIR/NAME/<version>/<default_model_filename,
model.onnx>`; version directories are positive integers (others are ignored, as Triton
does). config.pbtxt is parsed with Triton's own `inference.ModelConfig` message
(tritonclient's compiled model_config.proto) by protobuf's text_format: no hand parser.

What is served and how:
- platform `onnxruntime_onnx` / backend `onnxruntime`: an ONNX Runtime session, checked
  against the config's input / output (name, data_type, dims; with max_batch_size > 0 the
  dims leave the batch dimension out);
- platform `ensemble`: ensemble.py's DAG over the repository's other models;
- version_policy: latest { num_versions } (default 1), all, specific { versions }; the
  newest selected version is served, the others are listed (index) as UNAVAILABLE with
  that reason: one session per model name here;
- max_batch_size, dynamic_batching (preferred_batch_size, max_queue_delay_microseconds,
  priority_levels, default_priority_level, default_queue_policy, priority_queue_policy):
  the model's batcher settings; without dynamic_batching a request runs as it comes
  (no queue delay), as with Triton's default scheduler;
- instance_group: one group; count -> instances; kind KIND_CPU -> `cpu`, KIND_GPU with
  `gpus: [N]` -> `gpu:N`, KIND_AUTO -> the server's --device, KIND_MODEL -> the model's
  `parameters { key: "device" }` (our NPU / DSP kinds: a devices.py list such as
  `npu:0,cpu`); the `device` parameter may refine any kind;
- `parameters { key: "partition" }`: partition.py's stages (`cut=T1;T2` with
  `devices=cpu,cpu`), for one graph split across devices.
- input / output `reshape`: reshape.py's Reshape nodes at the graph's edges (ONNX files).
What is refused, with the file and field named: other platforms and backends,
more than one instance group, a group over several GPUs, sequence_batching.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from mcp26.mesh.batching_policy import BatcherSettings, QueuePolicy, settings_problems
from mcp26.inference import devices, model_format, reshape
from mcp26.inference.runtime import OnnxModel

log = logging.getLogger("mcp26.inference")
CONFIG = "config.pbtxt"
MAX_CONFIG_BYTES = 1 << 20           # a config.pbtxt is a few KiB; past this it is not one
ONNX_PLATFORMS = ("onnxruntime_onnx",)
ONNX_BACKENDS = ("onnxruntime", "")
ENSEMBLE = "ensemble"
MAX_INSTANCES = 64
DATA_TYPES = {v: k for k, v in {
    "BOOL": "TYPE_BOOL", "UINT8": "TYPE_UINT8", "UINT16": "TYPE_UINT16", "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64", "INT8": "TYPE_INT8", "INT16": "TYPE_INT16", "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64", "FP16": "TYPE_FP16", "FP32": "TYPE_FP32", "FP64": "TYPE_FP64",
    "BYTES": "TYPE_STRING", "BF16": "TYPE_BF16"}.items()}


class RepositoryError(ValueError):
    """A repository or model that cannot be served as written; the message names the file and field."""


@dataclass
class ModelEntry:
    """One model directory, parsed and checked (nothing loaded yet)."""
    name: str
    directory: str
    config_path: str
    config: mc.ModelConfig
    versions: list[str]                # selected by the version policy, oldest first
    skipped: list[str] = field(default_factory=list)     # present, not selected
    device: str | None = None          # devices.py's list, None: the server's --device
    instances: int = 1
    served_path: str = ""              # the file loaded: model_path, or its rewrite with reshapes

    @property
    def is_ensemble(self) -> bool:
        return self.config.platform == ENSEMBLE

    @property
    def version(self) -> str:
        return self.versions[-1]

    @property
    def model_path(self) -> str:
        return os.path.join(self.directory, self.version, self.config.default_model_filename or "model.onnx")

    def parameter(self, key: str) -> str | None:
        p = self.config.parameters.get(key)
        return p.string_value if p is not None else None

    def fail(self, fieldname: str, message: str) -> RepositoryError:
        return RepositoryError(f"{self.config_path}: model {self.name!r}: field {fieldname}: {message}")


def parse_config(path: str, name: str | None = None) -> mc.ModelConfig:
    """config.pbtxt -> Triton's ModelConfig; RepositoryError names file:line:column and the field."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise RepositoryError(f"{path}: {e.strerror or e}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise RepositoryError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes; not a model configuration")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RepositoryError(f"{path}: not UTF-8 text (byte {e.start})") from None
    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as e:
        line, col = e.GetLine(), e.GetColumn()
        where = f"{path}:{line}:{col}" if line else path
        msg = str(e)
        if line and msg.startswith(f"{line}:{col} : "):
            msg = msg[len(f"{line}:{col} : "):]
        raise RepositoryError(f"{where}: {msg}") from None
    except RecursionError:
        raise RepositoryError(f"{path}: nested too deeply to be a model configuration") from None
    if name is not None and config.name and config.name != name:
        raise RepositoryError(f"{path}: field name: {config.name!r} differs from its directory {name!r} "
                              f"(Triton requires them equal)")
    if name is not None and not config.name:
        config.name = name
    return config


def _versions(entry: ModelEntry) -> None:
    present = sorted((d for d in os.listdir(entry.directory)
                      if d.isascii() and d.isdigit() and int(d) > 0
                      and os.path.isdir(os.path.join(entry.directory, d))), key=int)
    if not entry.is_ensemble:
        filename = entry.config.default_model_filename or "model.onnx"
        present = [v for v in present if os.path.isfile(os.path.join(entry.directory, v, filename))]
        if not present:
            raise entry.fail("default_model_filename", f"no version directory holds {filename!r} "
                             f"(expected {entry.directory}/1/{filename})")
    elif not present:
        present = ["1"]        # an ensemble has no files; Triton still wants a version directory
    policy = entry.config.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        chosen = present
    elif which == "specific":
        wanted = [str(v) for v in policy.specific.versions]
        missing = [v for v in wanted if v not in present]
        if not wanted or missing:
            raise entry.fail("version_policy.specific.versions",
                             f"version(s) {', '.join(missing) or '(none listed)'} not in {entry.directory} "
                             f"(present: {', '.join(present)})")
        chosen = sorted(wanted, key=int)
    else:
        n = policy.latest.num_versions if which == "latest" else 1
        if n < 1:
            raise entry.fail("version_policy.latest.num_versions", f"must be at least 1, got {n}")
        chosen = present[-n:]
    entry.versions = chosen
    entry.skipped = [v for v in present if v not in chosen]


def _placement(entry: ModelEntry, default_device: str) -> None:
    c = entry.config
    param = entry.parameter("device")
    if len(c.instance_group) > 1:
        raise entry.fail("instance_group", f"{len(c.instance_group)} groups; this server runs one per model")
    group = c.instance_group[0] if c.instance_group else None
    kind = mc.ModelInstanceGroup.Kind.Name(group.kind) if group else "KIND_AUTO"
    count = group.count if group and group.count else 1
    if not 1 <= count <= MAX_INSTANCES:
        raise entry.fail("instance_group[0].count", f"must be 1..{MAX_INSTANCES}, got {count}")
    gpus = list(group.gpus) if group else []
    if kind == "KIND_CPU":
        device = param or "cpu"
    elif kind == "KIND_GPU":
        if len(gpus) > 1:
            raise entry.fail("instance_group[0].gpus", f"{gpus}: one GPU per model here")
        device = param or f"gpu:{gpus[0] if gpus else 0}"
    elif kind == "KIND_MODEL":
        if not param:
            raise entry.fail("instance_group[0].kind", "KIND_MODEL needs parameters { key: \"device\" } "
                             "naming its devices (npu:0, dsp:0, ...)")
        device = param
    else:
        device = param or default_device
    try:
        devices.parse(device, flag=f"{entry.config_path}: device")
    except devices.DeviceError as e:
        raise RepositoryError(f"model {entry.name!r}: {e}") from None
    entry.device, entry.instances = device, count


def _check_refused(entry: ModelEntry) -> None:
    c = entry.config
    if c.platform == ENSEMBLE:
        if not c.HasField("ensemble_scheduling") or not c.ensemble_scheduling.step:
            raise entry.fail("ensemble_scheduling", "an ensemble needs ensemble_scheduling { step [...] }")
    elif c.platform not in ONNX_PLATFORMS + ("",) or c.backend not in ONNX_BACKENDS or \
            (not c.platform and c.backend != "onnxruntime"):
        raise entry.fail("platform" if c.platform else "backend",
                         f"{c.platform or c.backend or '(none)'!r}: this server serves onnxruntime_onnx "
                         f"(backend onnxruntime) and ensemble")
    if c.max_batch_size < 0:
        raise entry.fail("max_batch_size", f"must be 0 or more, got {c.max_batch_size}")
    for kind in ("input", "output"):
        for i, t in enumerate(getattr(c, kind)):
            if not t.name:
                raise entry.fail(f"{kind}[{i}].name", "empty")
            if any(d < -1 or d == 0 for d in t.dims):
                raise entry.fail(f"{kind}[{i}].dims", f"{list(t.dims)}: each must be positive or -1")
    if c.HasField("sequence_batching"):
        raise entry.fail("sequence_batching", "not supported for repository models (use a decoder --model)")
    try:
        reshape.check(c)
    except reshape.ReshapeError as e:
        raise entry.fail(e.field, str(e)) from None


def read_model(root: str, name: str, default_device: str = "auto") -> ModelEntry:
    directory = os.path.join(root, name)
    path = os.path.join(directory, CONFIG)
    if not os.path.isfile(path):
        raise RepositoryError(f"{directory}: no {CONFIG} (Triton's auto-complete of a missing config is not done here)")
    entry = ModelEntry(name, directory, path, parse_config(path, name), [])
    _check_refused(entry)
    _versions(entry)
    if not entry.is_ensemble:
        _placement(entry, default_device)
        _reshaped(entry)
    return entry


def _reshaped(entry: ModelEntry) -> None:
    """entry.served_path: the model file, or its rewrite with the config's reshapes (reshape.py)."""
    entry.served_path = entry.model_path
    if not any(t.HasField("reshape") for t in (*entry.config.input, *entry.config.output)):
        return
    if model_format.is_container(entry.model_path):
        raise entry.fail("reshape", f"{entry.model_path} is a .mcp26bin; reshape applies to ONNX files "
                         f"(pack the model with its reshapes, or serve the .onnx)")
    try:
        entry.served_path = reshape.served_path(entry.model_path, entry.config)
    except reshape.ReshapeError as e:
        raise entry.fail(e.field, str(e)) from None


def scan(root: str, default_device: str = "auto") -> dict[str, ModelEntry]:
    """Every model directory under `root`, parsed and checked; the first problem is raised."""
    if not os.path.isdir(root):
        raise RepositoryError(f"--model-repository {root}: not a directory")
    names = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and not d.startswith("."))
    if not names:
        raise RepositoryError(f"--model-repository {root}: no model directories")
    return {n: read_model(root, n, default_device) for n in names}


def _queue_policy(p: mc.ModelQueuePolicy) -> QueuePolicy:
    return QueuePolicy(max_queue_size=p.max_queue_size, default_timeout_us=p.default_timeout_microseconds,
                       timeout_action=mc.ModelQueuePolicy.TimeoutAction.Name(p.timeout_action),
                       allow_timeout_override=p.allow_timeout_override)


def batcher_settings(entry: ModelEntry, base: BatcherSettings) -> BatcherSettings:
    """The model's batcher settings: its config over `base` (the server's preset or policy,
    which keeps the mesh's priority levels when the config sets none)."""
    c = entry.config
    out = replace(base, max_batch_size=max(1, c.max_batch_size), preferred_batch_sizes=(),
                  max_queue_delay_us=0, name=f"{entry.name}/config.pbtxt")
    if c.HasField("dynamic_batching"):
        d = c.dynamic_batching
        out = replace(out, preferred_batch_sizes=tuple(d.preferred_batch_size),
                      max_queue_delay_us=d.max_queue_delay_microseconds)
        if d.priority_levels:
            out = replace(out, priority_levels=d.priority_levels,
                          default_priority_level=d.default_priority_level or d.priority_levels)
        if d.HasField("default_queue_policy"):
            out = replace(out, default_queue_policy=_queue_policy(d.default_queue_policy))
        if d.priority_queue_policy:
            out = replace(out, queue_policies={int(k): _queue_policy(v) for k, v in d.priority_queue_policy.items()})
    problems = settings_problems(out)
    if problems:
        names = {"spec.maxBatchSize": "max_batch_size", "spec.preferredBatchSize": "dynamic_batching.preferred_batch_size",
                 "spec.defaultPriorityLevel": "dynamic_batching.default_priority_level"}
        f, m = problems[0]
        raise entry.fail(names.get(f, "dynamic_batching.priority_queue_policy"), m)
    return out


def check_against_model(entry: ModelEntry, model) -> None:
    """The config's input / output against the loaded session (runtime.OnnxModel)."""
    c = entry.config
    batched = c.max_batch_size > 0
    if batched and not model.batch_dim:
        raise entry.fail("max_batch_size", f"{c.max_batch_size}, but {entry.model_path} does not batch every "
                         f"input and output on dim 0; use max_batch_size: 0")
    for kind, specs in (("input", model.inputs), ("output", model.outputs)):
        for i, t in enumerate(getattr(c, kind)):
            spec = specs.get(t.name)
            if spec is None:
                raise entry.fail(f"{kind}[{i}].name", f"{t.name!r} is not an {kind} of {entry.model_path} "
                                 f"({', '.join(specs)})")
            dt = DATA_TYPES.get(mc.DataType.Name(t.data_type))
            if dt != spec.datatype:
                raise entry.fail(f"{kind}[{i}].data_type", f"{mc.DataType.Name(t.data_type)}, but the model's "
                                 f"{t.name!r} is {spec.datatype}")
            shape = spec.shape[1:] if batched else spec.shape
            dims = list(t.dims)
            if len(dims) != len(shape) or any(s != -1 and d != -1 and s != d for d, s in zip(dims, shape)):
                raise entry.fail(f"{kind}[{i}].dims", f"{dims}, but the model's {t.name!r} is {list(shape)}"
                                 f"{' past the batch dimension' if batched else ''}")


@dataclass
class Repository:
    """The directory a server serves from, and how it loads a model of it (ModelServer.add_entry)."""
    root: str
    default_device: str = "auto"
    base: BatcherSettings = field(default_factory=BatcherSettings)
    intra_op_threads: int | None = None
    fast_path: bool = True
    profile: bool = False

    def names(self) -> list[str]:
        try:
            return sorted(d for d in os.listdir(self.root)
                          if os.path.isfile(os.path.join(self.root, d, CONFIG)) and not d.startswith("."))
        except OSError:
            return []

    def load(self, models, name: str, _chain: tuple = ()):
        """Load (or reload from disk) model `name`, and first the step models of an ensemble
        that are not served yet; RepositoryError, and nothing changed for `name`, on a problem."""
        if name in _chain:
            raise RepositoryError(f"{self.root}: ensembles {' -> '.join(_chain + (name,))} include each other")
        if os.sep in name or name.startswith(".") or name not in self.names():
            raise RepositoryError(f"{self.root}: no model {name!r} (models: {', '.join(self.names()) or 'none'})")
        entry = read_model(self.root, name, self.default_device)
        if entry.is_ensemble:
            for step in entry.config.ensemble_scheduling.step:
                if step.model_name not in models.models and step.model_name in self.names():
                    self.load(models, step.model_name, _chain + (name,))
        return models.add_entry(entry, self.base, self.intra_op_threads, self.fast_path, self.profile)

    def load_all(self, models, only: list[str] | None = None) -> list:
        """Every model (or those in `only`, Triton's --load-model), plain models first, each
        ensemble after the models it runs."""
        entries = scan(self.root, self.default_device)
        if only:
            unknown = [n for n in only if n not in entries]
            if unknown:
                raise RepositoryError(f"--load-model {', '.join(unknown)}: not in {self.root} "
                                      f"(models: {', '.join(entries)})")
            entries = {n: entries[n] for n in only}
        out = [models.add_entry(e, self.base, self.intra_op_threads, self.fast_path, self.profile)
               for e in entries.values() if not e.is_ensemble]
        for e in entries.values():
            if e.is_ensemble and e.name not in models.models:
                out.append(self.load(models, e.name))
        return out

    def poll(self, models) -> list[str]:
        """Triton's poll mode, one pass: what changed in the directory since the models were
        loaded is applied, each change on its own (a bad model is logged and keeps serving as
        it was). New model: loaded. A new version (its policy's newest): swapped in under the
        queue (ServedModel.reload: no request dropped). A changed dynamic_batching: the batcher's
        settings. A changed ensemble: rebuilt. A model whose directory is gone: unloaded.
        Device or instance changes need a restart (logged). The changes, as lines for the log."""
        out = []
        names = self.names()
        for name in names:
            served = models.models.get(name)
            try:
                entry = read_model(self.root, name, self.default_device)
                if served is None:
                    self.load(models, name)
                    out.append(f"{name}: loaded")
                    continue
                old = served.entry
                if old is None or (entry.config == old.config and entry.versions == old.versions):
                    if not served.loaded and old is not None:
                        served.loaded = True
                        out.append(f"{name}: back in the directory, serving again")
                    continue
                served.loaded = True
                if entry.is_ensemble:
                    self.load(models, name)
                    out.append(f"{name}: ensemble rebuilt")
                    continue
                if (entry.device, entry.instances) != (old.device, old.instances):
                    out.append(f"{name}: instance_group / device changed ({old.device} x{old.instances} -> "
                               f"{entry.device} x{entry.instances}): not applied until a restart")
                    continue
                if entry.version != old.version:
                    check_against_model(entry, OnnxModel.load(name, entry.version, entry.served_path, "cpu",
                                                               1, warmup=False))     # before anything is swapped
                    served.reload(entry.served_path, entry.version)
                    out.append(f"{name}: version {old.version} -> {entry.version}")
                settings = batcher_settings(entry, self.base)
                if settings != served.batcher.settings:
                    served.reconfigure(settings)
                    out.append(f"{name}: batching from config.pbtxt applied")
                served.entry = entry
            except Exception as e:       # noqa: BLE001 - one model's problem must not stop the others' changes
                out.append(f"{name}: not applied, serving as before: {getattr(e, 'message', None) or e}")
        for name, served in models.models.items():
            if name not in names and served.entry is not None and served.loaded:
                served.loaded = False
                out.append(f"{name}: gone from the directory, unloaded")
        return out
