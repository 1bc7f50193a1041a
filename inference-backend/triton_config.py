"""A served model and its batcher in Triton's model_config.proto terms (ModelConfig RPC,
GET /v2/models/NAME/config).

What maps to what:
- max_batch_size: the batcher's max_batch_size when every input and output is batched
  on dim 0 (dims then leave the batch dimension out, as Triton's do), else 0 (dims are
  the full shapes);
- input / output: name, data_type (TYPE_FP32 ...; BYTES is TYPE_STRING), dims (-1 for a
  variable dimension);
- dynamic_batching: preferred_batch_size, max_queue_delay_microseconds,
  priority_levels, default_priority_level, default_queue_policy and
  priority_queue_policy (timeout_action, default_timeout_microseconds,
  allow_timeout_override, max_queue_size), exactly the settings the batcher runs with
  (preset, policy file or POST /admin/policy: the current ones);
- instance_group: `--instances` (count) of kind KIND_GPU (CUDA / TensorRT / a listed GPU),
  KIND_CPU, or KIND_MODEL (an NPU or DSP: Triton has no kind for them; `parameters.placement`
  says which device and EP, in devices.py's names); the
  reserved lane (a second compute thread for levels 1..N only) and the fast path are
  not Triton fields: they are in `parameters` (reserved_lane_levels, idle_dispatch),
  with execution_provider;
- platform onnxruntime_onnx, backend onnxruntime; not decoupled; no response cache.
"""
from __future__ import annotations

import json

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor

from mcp26.inference.protos import triton_extensions_pb2 as tpb

DATA_TYPES = {"BOOL": "TYPE_BOOL", "UINT8": "TYPE_UINT8", "UINT16": "TYPE_UINT16", "UINT32": "TYPE_UINT32",
              "UINT64": "TYPE_UINT64", "INT8": "TYPE_INT8", "INT16": "TYPE_INT16", "INT32": "TYPE_INT32",
              "INT64": "TYPE_INT64", "FP16": "TYPE_FP16", "FP32": "TYPE_FP32", "FP64": "TYPE_FP64",
              "BYTES": "TYPE_STRING", "BF16": "TYPE_BF16"}


def _queue_policy(p) -> dict:
    return {"timeout_action": p.timeout_action, "default_timeout_microseconds": p.default_timeout_us,
            "allow_timeout_override": p.allow_timeout_override, "max_queue_size": p.max_queue_size}


def repository_doc(served) -> dict:
    """A model from a repository: its config.pbtxt as Triton parsed it, with where it runs."""
    entry = served.entry
    doc = json_format.MessageToDict(entry.config, preserving_proto_field_name=True,
                                    always_print_fields_with_no_presence=True)
    _numbers(entry.config, doc)
    params = doc.setdefault("parameters", {})
    params["placement"] = {"string_value": json.dumps(served.model.where())}
    if not entry.is_ensemble:
        params["execution_provider"] = {"string_value": served.model.provider}
        doc.setdefault("default_model_filename", "model.onnx")
        doc.setdefault("platform", "onnxruntime_onnx")
        doc.setdefault("backend", "onnxruntime")
    return doc


_INT64 = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
          FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}


def _numbers(message, doc: dict) -> None:
    """64-bit integers as JSON numbers, as Triton's REST config has them (protobuf's JSON
    mapping writes them as strings)."""
    for f in message.DESCRIPTOR.fields:
        key = f.name
        if key not in doc:
            continue
        if f.type in _INT64:
            doc[key] = [int(v) for v in doc[key]] if isinstance(doc[key], list) else int(doc[key])
        elif f.type == FieldDescriptor.TYPE_MESSAGE:
            value = getattr(message, key)
            if f.message_type.GetOptions().map_entry:
                vf = f.message_type.fields_by_name["value"]
                for k, v in value.items():
                    if vf.type == FieldDescriptor.TYPE_MESSAGE:
                        _numbers(v, doc[key][str(k)])
                    elif vf.type in _INT64:
                        doc[key][str(k)] = int(doc[key][str(k)])
            elif isinstance(doc[key], list):
                for m, d in zip(value, doc[key]):
                    _numbers(m, d)
            else:
                _numbers(value, doc[key])


def config_doc(served) -> dict:
    """Triton's JSON form of the model's configuration."""
    if getattr(served, "entry", None) is not None:
        return repository_doc(served)
    m, s = served.model, served.batcher.settings
    batched = m.batch_dim
    dims = (lambda shape: list(shape[1:])) if batched else (lambda shape: list(shape))
    return {
        "name": served.name, "platform": "onnxruntime_onnx", "backend": "onnxruntime",
        "max_batch_size": s.max_batch_size if batched else 0,
        "input": [{"name": t.name, "data_type": DATA_TYPES[t.datatype], "dims": dims(t.shape)}
                  for t in m.inputs.values()],
        "output": [{"name": t.name, "data_type": DATA_TYPES[t.datatype], "dims": dims(t.shape)}
                   for t in m.outputs.values()],
        "dynamic_batching": {
            "preferred_batch_size": list(s.preferred_batch_sizes),
            "max_queue_delay_microseconds": s.max_queue_delay_us,
            "preserve_ordering": False,
            "priority_levels": s.priority_levels,
            "default_priority_level": s.default_priority_level,
            "default_queue_policy": _queue_policy(s.default_queue_policy),
            "priority_queue_policy": {str(level): _queue_policy(p) for level, p in sorted(s.queue_policies.items())},
        },
        "instance_group": [{"name": f"{served.name}_0", "kind": "KIND_CPU" if m.device == "cpu" else
                            "KIND_GPU" if m.device in ("gpu", "cuda", "tensorrt") else "KIND_MODEL",
                            "count": served.batcher.instances,
                            "gpus": [_device_id(m)] if m.device in ("gpu", "cuda", "tensorrt") else []}],
        "default_model_filename": "model.onnx",
        "parameters": {
            "execution_provider": {"string_value": m.provider},
            "placement": {"string_value": json.dumps(m.where())},     # devices.py's names: where it runs
            "reserved_lane_levels": {"string_value": str(s.reserved_lane_levels)},
            "idle_dispatch": {"string_value": "true" if served.batcher.idle_dispatch else "false"},
            "qos_policy": {"string_value": s.name},
        },
        "model_transaction_policy": {"decoupled": False},
        "response_cache": {"enable": getattr(served, "cache", None) is not None},
    }


def _device_id(model) -> int:
    placed = [d for d in model.where() if d.get("type") == "GPU"]
    if placed:
        return int(placed[0]["device"].partition(":")[2])
    kind, _, index = model.requested_device.partition(":")
    return int(index) if index.isdigit() else 0


def config_message(served) -> tpb.ModelConfig:
    # tpb.ModelConfig has the fields this server fills in for --model; a repository's
    # (ensemble_scheduling, ...) are in the REST answer, Triton's whole message
    return json_format.ParseDict(config_doc(served), tpb.ModelConfig(), ignore_unknown_fields=True)
