"""A REST infer body -> tensors: bounded work, and large JSON parsed away from the event loop.

REST and gRPC share one asyncio loop, so whatever one request's decoding costs,
every other request waits for it. What bounds it:

- JSON nested deeper than MAX_JSON_DEPTH is refused (400) before it is parsed
  (json.loads would recurse ~1000 levels and fail with RecursionError).
- Each input's declared name, datatype and shape are checked against the model,
  and its data's element count against the shape, before any value is
  converted (datatypes.check_input, datatypes.from_list).
- JSON over INLINE_JSON_BYTES is parsed and converted in a parser process (one,
  spawned on first use), never on the loop: json.loads holds the GIL for its
  whole run, so a thread would not help. Its address space is capped (a
  nested `[[1],[1],...]` body takes ~35x its size in Python lists); a body that
  needs more is a 413. At most MAX_QUEUED_LARGE large bodies wait for it (429
  beyond), so large bodies compete with each other, not with everyone else.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import multiprocessing
import re
from typing import NamedTuple

import numpy as np

from mcp26.inference import datatypes, json_codec
from mcp26.inference.errors import InvalidArgument, Overloaded, TooLarge

MAX_JSON_DEPTH = 64                 # a tensor's rank (numpy: <= 64) plus the document's own levels
INLINE_JSON_BYTES = 256 << 10       # json.loads of this much takes ~2 ms: fine on the loop
MAX_QUEUED_LARGE = 4
MIN_PARSER_MEMORY = 512 << 20       # the parser's address-space allowance beyond its start-up size

# The parameters anything downstream reads (ServedModel.prepare, decoder.sequence_context,
# QosAdmission.priority, the REST answer); others are accepted and dropped.
READ_PARAMETERS = ("priority", "timeout", "sequence_id", "sequence_start", "sequence_end", "binary_data_output")

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def json_depth(text: bytes, limit: int = MAX_JSON_DEPTH) -> int:
    """How deep `text`'s arrays and objects nest (stops counting past `limit`); brackets
    inside strings do not count. C and numpy speed: ~10 ms per MB of brackets."""
    brackets = _STRING.sub(b"", text).translate(None, _NOT_BRACKETS)
    depth, top = 0, 0
    for i in range(0, len(brackets), 1 << 20):       # chunks keep the int32 temporaries small
        b = np.frombuffer(brackets[i:i + (1 << 20)], np.uint8)
        steps = np.where((b == ord("[")) | (b == ord("{")), 1, -1).astype(np.int32)
        levels = np.cumsum(steps) + depth
        top = max(top, int(levels.max()))
        if top > limit:
            return top
        depth = int(levels[-1])
    return top


def parse_json(text: bytes, memory: int | None = None) -> dict:
    """`memory`: what the parser may allocate (the parser process's allowance), None: no cap."""
    # Fewer brackets than the limit cannot nest deeper than it: the scan is for the rest.
    if text.count(b"[") + text.count(b"{") > MAX_JSON_DEPTH and json_depth(text) > MAX_JSON_DEPTH:
        raise InvalidArgument(f"request body nests JSON deeper than {MAX_JSON_DEPTH} levels")
    try:
        doc = json.loads(text) if memory is not None and _may_exhaust(text, memory) else json_codec.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidArgument(f"request body is not JSON: {e}") from None
    except RecursionError:          # not reached after json_depth; kept so it can never be a 500
        raise InvalidArgument(f"request body nests JSON deeper than {MAX_JSON_DEPTH} levels") from None
    if not isinstance(doc, dict):
        raise InvalidArgument("request body must be a JSON object")
    return doc


def _may_exhaust(text: bytes, memory: int) -> bool:
    """Whether `text`'s Python objects may not fit in `memory`. Where it cannot allocate, orjson
    ends the process (SIGSEGV: a nested `[[1],...]` bomb under the parser's cap), json.loads
    raises MemoryError, which becomes a 413 that says so; so a body near the cap is parsed by
    json.loads (~7x slower), the rest by orjson. An array costs ~72 bytes, an element ~32."""
    return text.count(b"[") * 72 + text.count(b",") * 32 > memory // 2


def decode_inputs(doc: dict, binary: bytes, model: str, specs) -> dict[str, np.ndarray]:
    """The request's input tensors; `specs` is the model's name -> (datatype, shape)."""
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise InvalidArgument("request needs a non-empty 'inputs' list")
    arrays, offset = {}, 0
    for i, t in enumerate(inputs):
        if not isinstance(t, dict):
            raise InvalidArgument(f"inputs[{i}] must be an object")
        name, datatype, shape = t.get("name"), t.get("datatype"), t.get("shape")
        if not isinstance(name, str) or not isinstance(datatype, str) or not isinstance(shape, list) or \
                not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
            raise InvalidArgument(f"inputs[{i}] needs name (string), datatype (string) and shape (list of integers)")
        if name in arrays:
            raise InvalidArgument(f"input {name!r} is given twice")
        if datatype not in datatypes.DTYPES:
            raise InvalidArgument(f"input {name!r}: unknown datatype {datatype!r}")
        shape = datatypes.check_shape(name, shape)
        datatypes.check_input(model, specs, name, datatype, shape)
        params = t.get("parameters") or {}
        size = params.get("binary_data_size") if isinstance(params, dict) else None
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(binary):
                raise InvalidArgument(f"input {name!r}: binary_data_size {size!r} runs past the "
                                      f"{len(binary)} bytes of binary data")
            arrays[name] = datatypes.from_raw(name, datatype, shape, binary[offset:offset + size])
            offset += size
        else:
            if "data" not in t:
                raise InvalidArgument(f"input {name!r} has neither 'data' nor parameters.binary_data_size")
            arrays[name] = datatypes.from_list(name, datatype, shape, t["data"])
    if offset != len(binary):
        raise InvalidArgument(f"{len(binary) - offset} bytes of binary data belong to no input")
    return arrays


def requested_outputs(doc: dict, params: dict, max_outputs: int) -> tuple[list[str], dict[str, bool]]:
    outputs = doc.get("outputs")
    if outputs is None:
        return [], {}
    if not isinstance(outputs, list):
        raise InvalidArgument("'outputs' must be a list")
    if len(outputs) > max_outputs:     # each may be asked for once (ServedModel.prepare)
        raise InvalidArgument(f"{len(outputs)} outputs requested; the model has {max_outputs}")
    names, binary = [], {}
    default_binary = bool(params.get("binary_data_output", False))
    for i, o in enumerate(outputs):
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise InvalidArgument(f"outputs[{i}] needs a name")
        names.append(o["name"])
        p = o.get("parameters") or {}
        binary[o["name"]] = bool(p.get("binary_data", default_binary)) if isinstance(p, dict) else default_binary
    return names, binary


class Body(NamedTuple):
    """What the front end needs of a decoded body: small, whatever the body's size
    (the parser process sends it back, and unpickling holds the GIL too)."""
    doc: dict                       # `id` (a string) and `parameters`, as far as they are read
    arrays: dict[str, np.ndarray]
    outputs: list[str]
    binary_outputs: dict[str, bool]
    parameters: dict


def decode_body(json_part: bytes, binary: bytes, model: str, specs, max_outputs: int,
                memory: int | None = None) -> Body:
    doc = parse_json(json_part, memory)
    arrays = decode_inputs(doc, binary, model, specs)
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidArgument("'parameters' must be an object")
    params = {k: params[k] for k in READ_PARAMETERS if k in params}
    names, binary_out = requested_outputs(doc, params, max_outputs)
    lite = {"parameters": params}
    if "id" in doc:
        if not isinstance(doc["id"], str):
            raise InvalidArgument("'id' must be a string")
        lite["id"] = doc["id"]
    return Body(lite, arrays, names, binary_out, params)


_allowance: int | None = None       # in the parser process: its address-space allowance


def _parse_in_worker(json_part: bytes, binary: bytes, model: str, specs, max_outputs: int) -> Body:
    try:
        return decode_body(json_part, binary, model, specs, max_outputs, _allowance)
    except MemoryError:
        raise TooLarge(f"request body of {len(json_part)} bytes of JSON needs more memory to parse than "
                       f"the parser process may use; send large tensors binary "
                       f"(Inference-Header-Content-Length)") from None


def _start_parser(allowance: int) -> None:
    """Parser process start: end with the server (even a SIGKILLed one, as the priority
    worker does), and cap its address space at its size now plus `allowance`."""
    import ctypes
    import resource
    import signal
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)     # PR_SET_PDEATHSIG
    with open("/proc/self/status") as fh:
        vm = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + allowance, resource.getrlimit(resource.RLIMIT_AS)[1]))
    global _allowance
    _allowance = allowance


class BodyDecoder:
    """Decodes REST infer bodies: small ones inline, large JSON in the parser process."""

    def __init__(self, max_body_bytes: int):
        self.allowance = max(MIN_PARSER_MEMORY, 8 * max_body_bytes)
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._queued = 0

    @staticmethod
    def decode_inline(json_part: bytes, binary: bytes, model) -> Body:
        """A body whose JSON is at most INLINE_JSON_BYTES, decoded on the caller's thread."""
        return decode_body(json_part, binary, model.name, model.input_specs, len(model.outputs))

    async def decode(self, json_part: bytes, binary: bytes, model) -> Body:
        """`model`: the served OnnxModel (its name, input specs and outputs)."""
        if len(json_part) <= INLINE_JSON_BYTES:
            return self.decode_inline(json_part, binary, model)
        if self._queued >= MAX_QUEUED_LARGE:
            raise Overloaded(f"{self._queued} large JSON bodies are already waiting to be parsed; "
                             f"retry, or send large tensors binary (Inference-Header-Content-Length)")
        self._queued += 1
        if self._pool is None:
            # spawn, not fork: this process runs gRPC's threads
            self._pool = concurrent.futures.ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn"), initializer=_start_parser,
                initargs=(self.allowance,))
        pool = self._pool
        try:
            return await asyncio.get_running_loop().run_in_executor(
                pool, _parse_in_worker, json_part, bytes(binary), model.name, model.input_specs, len(model.outputs))
        except concurrent.futures.process.BrokenProcessPool:
            if self._pool is pool:      # it died (killed?): the next large body starts another
                self._pool = None
                pool.shutdown(wait=False, cancel_futures=True)
            raise TooLarge("the request body's parser process died; the body is too large to parse") from None
        finally:
            self._queued -= 1

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
