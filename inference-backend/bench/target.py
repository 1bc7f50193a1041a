"""What to send: the target URL, the model's metadata, and request payloads.

`-u http://HOST:PORT/v2/models/NAME[/versions/V][/infer]` benchmarks that
model: its metadata (GET /v2/models/NAME) says the inputs, and mcp-bench fills
them with seeded random data. `-u http://HOST:PORT/infer` (or `/v2/infer`) is
the server's short form for its default model: GET /v2 names it, the requests
go to the URL as given. Any other path is sent as a plain GET, which is how the
generator is calibrated against h2load on a target that answers fast.
"""
from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

import numpy as np

_MODEL_PATH = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?(?:/infer)?/?$")
_SHORT_FORM = re.compile(r"^(?:/v2)?/infer/?$")     # the server's default model (mcpctl serve --default-model)

# KServe v2 datatypes -> numpy (BYTES handled on its own).
DTYPES = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
    "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
    "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}


class TargetError(Exception):
    """Bad URL, unreachable server or unusable metadata: said in one line."""


@dataclass
class Target:
    host: str
    port: int
    path: str                 # as given
    model: str | None         # None: plain GET of `path`
    version: str | None
    short_form: bool = False  # /infer or /v2/infer: model is the server's default, requests go to `path`

    @property
    def infer_path(self) -> str:
        return self.path if self.short_form else self.model_path + "/infer"

    @property
    def authority(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def model_path(self) -> str:
        v = f"/versions/{self.version}" if self.version else ""
        return f"/v2/models/{self.model}{v}"


def parse_url(url: str, model: str | None = None, grpc: bool = False) -> Target:
    if "://" not in url:
        url = ("grpc://" if grpc else "http://") + url
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "grpc"):
        raise TargetError(f"-u {url}: scheme {u.scheme!r} not supported (http:// or, with --grpc, grpc://)")
    if not u.hostname:
        raise TargetError(f"-u {url}: no host")
    try:
        port = u.port or (8001 if grpc else 80)
    except ValueError as e:
        raise TargetError(f"-u {url}: {e}") from None
    path = u.path or "/"
    if u.query:
        path += "?" + u.query
    m = _MODEL_PATH.match(u.path or "")
    name = model or (m and urllib.parse.unquote(m["name"]))
    version = m["version"] if m else None
    short = not m and not grpc and bool(_SHORT_FORM.match(u.path or ""))
    if grpc and not name:
        raise TargetError(f"-u {url}: --grpc needs a model: /v2/models/NAME in the URL or --model NAME")
    return Target(u.hostname, port, path, name, version, short_form=short)


def _get_json(url: str, timeout: float, data: bytes | None = None):
    with urllib.request.urlopen(urllib.request.Request(url, data=data, method="POST" if data else "GET"),
                                timeout=timeout) as r:
        return json.loads(r.read())


def models_here(t: Target, timeout: float = 5.0) -> str:
    """The models the server at t says it has (Triton's repository index), for an error message."""
    try:
        index = _get_json(f"http://{t.authority}/v2/repository/index", timeout, b"{}")
        names = sorted({str(e.get("name")) for e in index if isinstance(e, dict)})
        return ", ".join(names) if names else "none"
    except (urllib.error.URLError, OSError, ValueError, TypeError):
        return "unknown (no KServe v2 repository index there)"


def no_model(url: str, t: Target, timeout: float = 5.0) -> TargetError:
    return TargetError(f"no model at {url}; models here: {models_here(t, timeout)}")


def resolve_default_model(t: Target, url: str, timeout: float = 5.0) -> str:
    """The model `/infer` stands for on t's server (GET /v2's default_model)."""
    try:
        doc = _get_json(f"http://{t.authority}/v2", timeout)
    except (urllib.error.URLError, OSError, ValueError) as e:
        if isinstance(e, urllib.error.HTTPError) and e.code == 404:
            raise no_model(url, t, timeout) from None
        raise TargetError(f"cannot reach http://{t.authority}/v2: {getattr(e, 'reason', e)}") from None
    name = doc.get("default_model") if isinstance(doc, dict) else None
    if not name:
        raise no_model(url, t, timeout)
    return name


def fetch_metadata(t: Target, timeout: float = 5.0) -> dict:
    """GET the model's KServe v2 metadata over REST."""
    url = f"http://{t.authority}{t.model_path}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise no_model(url, t, timeout) from None
        detail = e.read().decode("utf-8", "replace")[:200]
        raise TargetError(f"GET {url}: HTTP {e.code} {detail}".rstrip()) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise TargetError(f"cannot reach {url}: {reason}") from None
    except ValueError as e:
        raise TargetError(f"GET {url}: metadata is not JSON: {e}") from None


def parse_shapes(text: str | None) -> dict[str, list[int]]:
    """`--shape input0:1,3,224,224;input1:1,8` -> {name: dims}."""
    out: dict[str, list[int]] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(";"))):
        name, sep, dims = part.rpartition(":")
        try:
            shape = [int(d) for d in dims.split(",")]
        except ValueError:
            shape = []
        if not sep or not name or not shape or any(d <= 0 for d in shape):
            raise TargetError(f"--shape {part!r}: expected NAME:D1,D2,... with positive dims")
        out[name] = shape
    return out


def parse_inputs(specs: list[str] | None) -> dict | None:
    """`--input INPUT0:FP32:1,64` (repeatable): the inputs, so no metadata
    call is made (a server without one, or a wrong model name on purpose)."""
    if not specs:
        return None
    inputs = []
    for spec in specs:
        parts = spec.split(":")
        try:
            name, dtype, dims = parts
            shape = [int(d) for d in dims.split(",")]
        except ValueError:
            raise TargetError(f"--input {spec!r}: expected NAME:DATATYPE:D1,D2,...") from None
        if dtype.upper() not in DTYPES and dtype.upper() != "BYTES":
            raise TargetError(f"--input {spec!r}: datatype {dtype!r} is not a KServe v2 type")
        inputs.append({"name": name, "datatype": dtype.upper(), "shape": shape})
    return {"name": "(from --input)", "inputs": inputs}


def build_tensors(metadata: dict, shapes: dict[str, list[int]] | None = None,
                  seed: int = 0) -> list[tuple[str, str, list[int], np.ndarray]]:
    """(name, datatype, shape, values) for every input in the metadata.
    Variable dims (-1) become 1 (a single-item batch) unless --shape says."""
    shapes = shapes or {}
    inputs = metadata.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise TargetError(f"model {metadata.get('name')!r}: metadata lists no inputs")
    unknown = set(shapes) - {i.get("name") for i in inputs}
    if unknown:
        raise TargetError(f"--shape names unknown input(s) {sorted(unknown)}; the model has "
                          f"{[i.get('name') for i in inputs]}")
    rng = np.random.default_rng(seed)
    out = []
    for spec in inputs:
        name, dtype = spec.get("name"), str(spec.get("datatype", "")).upper()
        shape = shapes.get(name) or [d if d > 0 else 1 for d in spec.get("shape", [])]
        count = int(np.prod(shape)) if shape else 1
        if dtype == "BYTES":
            values = np.array([f"mcp-bench-{i}" for i in range(count)], dtype=object)
        elif dtype in DTYPES:
            np_type = DTYPES[dtype]
            if np.issubdtype(np_type, np.floating):
                values = rng.standard_normal(count).astype(np_type)
            elif np_type is np.bool_:
                values = rng.integers(0, 2, count).astype(bool)
            else:
                values = rng.integers(0, 100, count).astype(np_type)
        else:
            raise TargetError(f"input {name!r}: datatype {dtype!r} is not a KServe v2 type")
        out.append((name, dtype, shape, values))
    return out


# --binary-data auto: inputs larger than this go as the binary-tensor extension (as
# tritonclient.http sends them), smaller ones as JSON. A ResNet-50 image is 588 KiB of FP32:
# as JSON it is ~3 MB of text the server parses per request.
BINARY_AUTO_BYTES = 64 << 10


def use_binary(tensors, mode: str) -> bool:
    if mode not in ("auto", "always", "never"):
        raise TargetError(f"--binary-data {mode!r}: auto, always or never")
    if any(d == "BYTES" for _, d, _, _ in tensors):
        return False
    return mode == "always" or (mode == "auto" and sum(v.nbytes for *_, v in tensors) > BINARY_AUTO_BYTES)


def rest_body(tensors, priority_level: int | None, binary: bool = False) -> tuple[dict, bytes]:
    """(headers, body) of the infer request; `parameters.priority` is Triton's per-request
    priority. Binary: the JSON header, then each input's raw bytes (KServe's binary-tensor
    extension, `Inference-Header-Content-Length`)."""
    if binary:
        inputs = [{"name": n, "shape": s, "datatype": d, "parameters": {"binary_data_size": v.nbytes}}
                  for n, d, s, v in tensors]
    else:
        inputs = [{"name": n, "shape": s, "datatype": d, "data": v.tolist()} for n, d, s, v in tensors]
    body: dict = {"inputs": inputs}
    if priority_level is not None:
        body["parameters"] = {"priority": priority_level}
    head = json.dumps(body, separators=(",", ":")).encode()
    if not binary:
        return {"Content-Type": "application/json"}, head
    return ({"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(head))},
            head + b"".join(np.ascontiguousarray(v).tobytes() for *_, v in tensors))
