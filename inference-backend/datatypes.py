"""KServe v2 tensor datatypes <-> numpy, and the raw (binary) tensor encoding.

Raw tensors are little-endian and row-major; BYTES elements are each a
4-byte little-endian length followed by the bytes (the protocol's rule for
`raw_input_contents` and the HTTP binary-tensor extension alike).
"""
from __future__ import annotations

import struct
import sys

import numpy as np

from mcp26.inference.errors import InvalidArgument

# datatype -> numpy dtype (little-endian), as the protocol names them.
DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("<u1"), "UINT16": np.dtype("<u2"), "UINT32": np.dtype("<u4"), "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"), "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}

# ONNX Runtime's type strings -> datatype.
ORT_TYPES = {
    "tensor(bool)": "BOOL", "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16", "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64", "tensor(int8)": "INT8", "tensor(int16)": "INT16", "tensor(int32)": "INT32",
    "tensor(int64)": "INT64", "tensor(float16)": "FP16", "tensor(float)": "FP32", "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}

# datatype -> the InferTensorContents field that carries it (gRPC typed contents).
CONTENTS_FIELD = {
    "BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def datatype_of(array: np.ndarray) -> str:
    if array.dtype == object or array.dtype.kind in "SU":
        return "BYTES"
    for name, dt in DTYPES.items():
        if name != "BYTES" and array.dtype == dt:
            return name
    raise InvalidArgument(f"no KServe datatype for numpy dtype {array.dtype}")


def element_count(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def check_shape(name: str, shape) -> tuple[int, ...]:
    out = tuple(int(d) for d in shape)
    if any(d < 0 for d in out):
        raise InvalidArgument(f"input {name!r}: shape {list(out)} has a negative dimension")
    return out


def check_input(model: str, specs, name: str, datatype: str, shape: tuple[int, ...]) -> None:
    """The declared name, datatype and shape against the model's `specs` (name -> (datatype,
    shape), -1 any size): checked before any data is converted."""
    spec = specs.get(name)
    if spec is None:
        raise InvalidArgument(f"model {model!r} has no input {name!r}; inputs are {', '.join(specs)}")
    want_type, want_shape = spec
    if datatype != want_type:
        raise InvalidArgument(f"input {name!r}: datatype {datatype} given, model expects {want_type}")
    if len(shape) != len(want_shape) or any(e != -1 and e != g for e, g in zip(want_shape, shape)):
        raise InvalidArgument(f"input {name!r}: shape {list(shape)} does not match the model's "
                              f"{list(want_shape)} (-1 is any size)")


def from_raw(name: str, datatype: str, shape: tuple[int, ...], raw: bytes) -> np.ndarray:
    """Decode one raw tensor; the byte size must be exactly what shape and datatype imply."""
    count = element_count(shape)
    if datatype == "BYTES":
        items, offset = [], 0
        for _ in range(count):
            if offset + 4 > len(raw):
                raise InvalidArgument(f"input {name!r}: BYTES data ends after {len(items)} of {count} elements")
            (length,) = struct.unpack_from("<I", raw, offset)
            offset += 4
            if offset + length > len(raw):
                raise InvalidArgument(f"input {name!r}: BYTES element {len(items)} overruns the data")
            items.append(bytes(raw[offset:offset + length]))
            offset += length
        if offset != len(raw):
            raise InvalidArgument(f"input {name!r}: {len(raw) - offset} bytes left after {count} BYTES elements")
        return np.array(items, dtype=object).reshape(shape)
    dtype = DTYPES[datatype]
    expected = count * dtype.itemsize
    if len(raw) != expected:
        raise InvalidArgument(f"input {name!r}: {len(raw)} bytes of raw data, but shape {list(shape)} "
                              f"of {datatype} needs {expected}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def to_raw(array: np.ndarray) -> bytes:
    if array.dtype == object or array.dtype.kind in "SU":
        out = bytearray()
        for item in array.reshape(-1):
            b = item if isinstance(item, bytes) else str(item).encode()
            out += struct.pack("<I", len(b)) + b
        return bytes(out)
    order = array.dtype.byteorder
    if order in "<|" or order == "=" and sys.byteorder == "little":
        return array.tobytes()      # C order, little-endian already: as the protocol lays it
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def from_list(name: str, datatype: str, shape: tuple[int, ...], data) -> np.ndarray:
    """Decode JSON `data` (flat or nested, as the protocol allows) or typed gRPC contents.

    The data's element count is checked against the declared shape before anything is
    converted, and nesting deeper than the shape's rank is refused: a body whose data
    runs past its shape costs as much as the shape, not as much as the body."""
    count = element_count(shape)
    arr = _flat_numbers(data, count) if datatype != "BYTES" else None
    flat = data if arr is not None else _flat(name, data, count, shape)
    if datatype == "BYTES":
        if not all(isinstance(x, (str, bytes)) for x in flat):
            raise InvalidArgument(f"input {name!r}: BYTES data must be strings")
        return np.array([x.encode() if isinstance(x, str) else bytes(x) for x in flat], dtype=object).reshape(shape)
    dtype = DTYPES[datatype]
    if arr is None:
        try:
            arr = np.asarray(flat)
        except (ValueError, TypeError) as e:
            raise InvalidArgument(f"input {name!r}: data is not a list of {datatype} values ({e})") from None
    arr = arr.reshape(-1)
    if arr.size and arr.dtype.kind not in "biuf":
        raise InvalidArgument(f"input {name!r}: data holds {arr.dtype.kind!r} values, not {datatype}")
    if datatype == "BOOL":
        if arr.size and arr.dtype.kind != "b":
            raise InvalidArgument(f"input {name!r}: BOOL data must be true/false")
    elif dtype.kind in "iu" and arr.size and arr.dtype.kind == "f":
        raise InvalidArgument(f"input {name!r}: {datatype} data holds non-integer numbers")
    elif dtype.kind in "iu" and arr.size:
        info = np.iinfo(dtype)
        if arr.min() < info.min or arr.max() > info.max:
            raise InvalidArgument(f"input {name!r}: a value is out of range for {datatype}")
    return arr.astype(dtype, copy=False).reshape(shape)


def _flat_numbers(data, count: int) -> np.ndarray | None:
    """`data` as a 1-D array when it is a flat list of `count` numbers, the common case, in one C
    pass; None for anything else, which shows in the array (strings: kind U; None or a dict: O;
    nesting: more dimensions, or a ValueError) and goes the checked way (`_flat`)."""
    if type(data) is not list or len(data) != count or not count:
        return None
    try:
        arr = np.asarray(data)
    except (ValueError, TypeError):
        return None
    return arr if arr.ndim == 1 and arr.dtype.kind in "biuf" else None


def _flat(name: str, data, count: int, shape: tuple[int, ...]) -> list:
    if isinstance(data, (list, tuple)) and len(data) > max(count, shape[0] if shape else 1):
        # flat data has `count` items, nested data shape[0]: refused before walking it
        raise InvalidArgument(f"input {name!r}: {len(data)} elements for shape {list(shape)} ({count})")
    flat = _leaves(name, data, count, shape)
    if len(flat) != count:
        raise InvalidArgument(f"input {name!r}: {_count_text(flat, count)} elements for shape {list(shape)} ({count})")
    return flat


def _leaves(name: str, data, count: int, shape: tuple[int, ...]) -> list:
    """The scalars of `data` in order, without recursion, walking no further than `count` + 1
    of them, no deeper than the shape's rank and through no more lists than a nesting of
    that shape has (plus `count` + 1, for a nesting other than the shape's)."""
    if not isinstance(data, (list, tuple)):
        return [data]
    if not any(isinstance(x, (list, tuple)) for x in data):     # flat: the common case
        return data if len(data) <= count else data[:count + 1]
    max_depth, lists, prefix = max(1, len(shape)), count + 1, 1
    for d in shape:
        lists += prefix
        prefix *= d
    out: list = []
    stack = [iter(data)]
    while stack:
        for x in stack[-1]:
            if isinstance(x, (list, tuple)):
                lists -= 1
                if len(stack) >= max_depth or lists < 0:
                    raise InvalidArgument(f"input {name!r}: data is nested deeper or wider than its "
                                          f"shape {list(shape)}")
                stack.append(iter(x))
                break
            out.append(x)
            if len(out) > count:
                return out
        else:
            stack.pop()
    return out


def _count_text(flat: list, count: int) -> str:
    return f"more than {count}" if len(flat) > count else str(len(flat))


def to_list(array: np.ndarray) -> list:
    """Flat, JSON-ready values (BYTES as UTF-8 text where it decodes)."""
    if array.dtype == object or array.dtype.kind in "SU":
        out = []
        for x in array.reshape(-1):
            if isinstance(x, bytes):
                try:
                    out.append(x.decode())
                except UnicodeDecodeError:
                    out.append(x.decode("latin-1"))
            else:
                out.append(str(x))
        return out
    return array.reshape(-1).tolist()
