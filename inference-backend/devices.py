"""`--device`: which compute units a model runs on, resolved onto ONNX Runtime's own devices.

ONNX Runtime (>= 1.22) discovers the hardware and the execution providers (EPs) that can
drive it: `onnxruntime.get_ep_devices()` lists (EP, hardware device) pairs, each device
of type CPU, GPU or NPU. This module adds no device layer beside that; it only
- registers the plugin EPs whose packages are installed (`onnxruntime-ep-openvino`,
  `onnxruntime-qnn`, ...; `register_execution_provider_library`, once a process),
- parses the document's device lists (`npu:0,gpu:1`, `gpu:0`, `cpu`, `dsp:0`) and ORT's
  selection policies (`prefer-npu`, `prefer-gpu`, `prefer-cpu`, `max-performance`,
  `max-efficiency`, `min-power`),
- resolves each entry to one of ORT's pairs, or fails with a message listing what is
  there, and
- puts the result on a SessionOptions (`add_provider_for_devices`, in the list's order:
  ORT assigns each node to the first EP that takes it, the CPU EP last).

Indices count the pairs of one type in ORT's order: with the OpenVINO plugin on an Intel
CPU, `cpu:0` is the CPU EP and `cpu:1` OpenVINO's CPU device. `dsp:N` is the N-th NPU-type
device of Qualcomm's QNN EP (ORT has no DSP type: QNN lists its HTP/DSP as an NPU).
`auto` (the default) and the older `cuda:N` / `tensorrt:N` keep the named-provider plan
of runtime.provider_plan (TensorRT > CUDA > CPU), which the GPU check relies on.

What runs where (found on the machine this was written on, onnxruntime 1.32, AMD EPYC):
ORT lists one pair, CPU / CPUExecutionProvider. The OpenVINO plugin (PyPI
onnxruntime-ep-openvino 1.8) installs and registers, but offers devices only of Intel's
vendor id, so on this AMD CPU it adds none; on an Intel host it adds cpu:1 (and its GPU
and NPU where present). GPU (onnxruntime-gpu: CUDA, TensorRT) and NPU/DSP (QNN) were not
available to run.
"""
from __future__ import annotations

import importlib
import logging
import threading
from dataclasses import dataclass

import onnxruntime as ort

log = logging.getLogger("mcp26.inference")

# Plugin EP packages: (python module, EP name). Registered when importable.
PLUGIN_PACKAGES = (("onnxruntime_ep_openvino", "OpenVINOExecutionProvider"),
                   ("onnxruntime_qnn", "QNNExecutionProvider"))
# Named-provider forms kept from before the device list (runtime.provider_plan).
LEGACY_KINDS = ("auto", "cuda", "tensorrt", "trt")
TYPES = {"cpu": "CPU", "gpu": "GPU", "npu": "NPU", "dsp": "NPU"}
DSP_EPS = ("QNNExecutionProvider",)
POLICIES = {
    "prefer-cpu": "PREFER_CPU", "prefer-gpu": "PREFER_GPU", "prefer-npu": "PREFER_NPU",
    "max-performance": "MAX_PERFORMANCE", "max-efficiency": "MAX_EFFICIENCY", "min-power": "MIN_OVERALL_POWER",
}
CPU_EP = "CPUExecutionProvider"
MAX_ENTRIES = 16

_registered: set[str] = set()
_lock = threading.Lock()
_absent: set[str] = set()        # plugin packages not installed in this process


class DeviceError(ValueError):
    """A device list that names something absent or malformed; the message is for the operator."""


def register_plugins() -> list[str]:
    """Register each installed plugin EP library with ONNX Runtime (once a process)."""
    with _lock:
        for module, ep in PLUGIN_PACKAGES:
            if ep in _registered or module in _absent:
                continue
            try:
                mod = importlib.import_module(module)
            except ImportError:
                _absent.add(module)      # looked for once: a failed import searches sys.path again
                continue
            try:
                ort.register_execution_provider_library(ep, mod.get_library_path())
            except Exception as e:     # a plugin built for another ORT: say so, serve without it
                log.warning("plugin EP %s (%s) did not register with onnxruntime %s: %s", ep, module,
                            ort.__version__, e)
                continue
            _registered.add(ep)
        return sorted(_registered)


@dataclass(frozen=True)
class Device:
    """One of ORT's (EP, hardware device) pairs, named as `--device` names it."""
    kind: str              # cpu | gpu | npu
    index: int             # among the pairs of that kind, in ORT's order
    ep: str
    vendor: str
    vendor_id: int
    device_id: int
    ep_device: object      # onnxruntime.OrtEpDevice

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.index}"

    def describe(self) -> dict:
        return {"device": self.label, "type": self.kind.upper(), "execution_provider": self.ep,
                "vendor": self.vendor, "vendor_id": self.vendor_id, "device_id": self.device_id}


def devices() -> list[Device]:
    """Every (EP, device) pair ORT offers here, plugins registered first."""
    register_plugins()
    out, counts = [], {}
    for d in ort.get_ep_devices():
        kind = d.device.type.name.lower()
        i = counts.get(kind, 0)
        counts[kind] = i + 1
        out.append(Device(kind, i, d.ep_name, d.device.vendor, d.device.vendor_id, d.device.device_id, d))
    return out


def listing(found: list[Device]) -> str:
    return ", ".join(f"{d.label} ({d.ep})" for d in found) or "none"


@dataclass(frozen=True)
class Placement:
    """A resolved `--device`: what to put on a session's options.

    `devices`: the pairs of an explicit list, in priority order; `policy`: ORT's selection
    policy; `legacy`: the named-provider form (auto, cuda:N, tensorrt:N) for runtime.provider_plan."""
    spec: str
    devices: tuple = ()
    policy: str | None = None
    legacy: str | None = None

    @property
    def cpu_only(self) -> bool:
        return bool(self.devices) and all(d.ep == CPU_EP for d in self.devices)

    def describe(self) -> list[dict]:
        if self.devices:
            return [d.describe() for d in self.devices]
        return [{"device": self.spec, "policy": self.policy or "named providers"}]

    def apply(self, opts: ort.SessionOptions, ep_options: dict | None = None) -> list | None:
        """Put the placement on `opts`; the `providers` argument for InferenceSession (None
        when the options carry the devices)."""
        if self.policy:
            opts.set_provider_selection_policy(getattr(ort.OrtExecutionProviderDevicePolicy, self.policy))
            return None
        if self.cpu_only:
            return [CPU_EP]
        by_ep: dict[str, list] = {}     # one add_provider_for_devices call per EP, in first-listed order
        for d in self.devices:
            by_ep.setdefault(d.ep, []).append(d.ep_device)
        for ep, eps in by_ep.items():
            opts.add_provider_for_devices(eps, dict((ep_options or {}).get(ep, {})))
        return None


def parse(spec: str, flag: str = "--device") -> list[tuple[str, int | None]]:
    """`npu:0,gpu:1` -> [("npu", 0), ("gpu", 1)]; syntax only (DeviceError names the entry)."""
    if not isinstance(spec, str) or not spec.strip():
        raise DeviceError(f"{flag}: empty; expected a list such as cpu, gpu:0 or npu:0,gpu:1, or a policy "
                          f"(auto, {', '.join(POLICIES)})")
    entries = [e.strip() for e in spec.split(",")]
    if len(entries) > MAX_ENTRIES:
        raise DeviceError(f"{flag} {spec[:80]!r}: {len(entries)} entries; at most {MAX_ENTRIES}")
    out = []
    for entry in entries:
        kind, sep, index = entry.lower().partition(":")
        if kind in POLICIES or kind in LEGACY_KINDS:
            if len(entries) > 1:
                raise DeviceError(f"{flag} {spec!r}: {entry!r} stands alone, not in a list")
            if kind in POLICIES and sep:
                raise DeviceError(f"{flag} {entry!r}: a policy takes no index")
            if kind == "auto" and sep:
                raise DeviceError(f"{flag} {entry!r}: auto takes no index")
        elif kind not in TYPES:
            raise DeviceError(f"{flag} {spec!r}: unknown device {entry!r}; expected cpu, gpu:N, npu:N or dsp:N "
                              f"(a list: npu:0,gpu:1), auto, or a policy ({', '.join(POLICIES)})")
        if sep and not (index.isascii() and index.isdigit() and len(index) <= 4):
            raise DeviceError(f"{flag} {entry!r}: the index {index!r} is not a number (as in gpu:0)")
        out.append((kind, int(index) if sep else None))
    if len(set(out)) != len(out):
        raise DeviceError(f"{flag} {spec!r}: a device is listed twice")
    return out


def resolve(spec: str, flag: str = "--device") -> Placement:
    """Parse and resolve `spec` against what ORT offers here; DeviceError lists what is."""
    entries = parse(spec, flag)
    kind, index = entries[0]
    if kind in LEGACY_KINDS:
        return Placement(spec, legacy=f"{kind}:{index}" if index is not None else kind)
    if kind in POLICIES:
        return Placement(spec, policy=POLICIES[kind])
    found = devices()
    chosen = []
    for kind, index in entries:
        of_kind = [d for d in found if d.kind == TYPES[kind].lower() and (kind != "dsp" or d.ep in DSP_EPS)]
        if kind == "dsp":        # numbered among the DSP-capable pairs themselves
            of_kind = [Device("dsp", i, d.ep, d.vendor, d.vendor_id, d.device_id, d.ep_device)
                       for i, d in enumerate(of_kind)]
        name = f"{kind}:{index}" if index is not None else kind
        if not of_kind:
            raise DeviceError(f"{flag} {name}: no {kind.upper()} here; devices: {listing(found)}")
        if index is not None and index >= len(of_kind):
            raise DeviceError(f"{flag} {name}: there are {len(of_kind)} {kind.upper()} device(s) here "
                              f"({', '.join(d.label for d in of_kind)}); devices: {listing(found)}")
        chosen.append(of_kind[index or 0])
    return Placement(spec, devices=tuple(chosen))


def check(spec: str, flag: str = "--device") -> None:
    """Fail fast on a bad or absent `--device` (mcpctl serve, before loading anything)."""
    resolve(spec, flag)


def table(found: list[Device]) -> str:
    rows = [("DEVICE", "TYPE", "EXECUTION PROVIDER", "VENDOR", "VENDOR ID", "DEVICE ID")]
    rows += [(d.label, d.kind.upper(), d.ep, d.vendor, f"0x{d.vendor_id:04x}", f"0x{d.device_id:04x}") for d in found]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
