"""`.mcp26bin` (inference-backend/model_format.py): pack, inspect, verify and load round
trips, incremental packs against a base, and every kind of bad file, said by name."""
from __future__ import annotations

import json
import os
import resource
import shutil
import struct

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from mcp26.inference import model_format
from mcp26.inference.runtime import OnnxModel
from mcp26.mesh.cli import main as mcpctl

WIDTH, LAYERS = 256, 6


def small_mlp(seed: int = 1, changed: tuple = ()) -> onnx.ModelProto:
    """Gemm+Relu layers; the layers in `changed` get other weights (a "fine-tune" of them)."""
    nodes, inits, x = [], [], "x"
    for i in range(LAYERS):
        rng = np.random.default_rng(seed * 1000 + i + (7919 if i in changed else 0))
        inits += [numpy_helper.from_array((rng.standard_normal((WIDTH, WIDTH)) / 16).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array((0.01 * rng.standard_normal(WIDTH)).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [f"g{i}"]),
                  helper.make_node("Relu", [f"g{i}"], [f"h{i}"])]
        x = f"h{i}"
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", WIDTH])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def write(tmp_path, name: str, model: onnx.ModelProto) -> str:
    path = str(tmp_path / name)
    onnx.save(model, path)
    return path


def reference(path: str, level: str, x: np.ndarray) -> np.ndarray:
    """The source model run by ONNX Runtime at the packed level, prepacking off (as the loader runs it)."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, model_format.LEVELS[level])
    opts.add_session_config_entry("session.disable_prepacking", "1")
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


X = np.random.default_rng(5).standard_normal((3, WIDTH)).astype(np.float32)


@pytest.mark.parametrize("level", ["basic", "extended"])
def test_pack_load_round_trip_answers_bit_identical(tmp_path, level):
    src = write(tmp_path, "m.onnx", small_mlp())
    out = str(tmp_path / "m.mcp26bin")
    toc = model_format.pack(src, out, level=level)
    assert toc["optimization"]["level"] == level
    c = model_format.open_container(out)
    assert model_format.verify(c) == []
    assert all(ch["offset"] % 4096 == 0 for ch in c.chunks)
    assert sorted(ch["name"] for ch in c.chunks) == sorted(f"{k}{i}" for i in range(LAYERS) for k in "wb")
    model = OnnxModel.load("m", "1", out, "cpu", 1, warmup=False)
    y = model.run({"x": X})["y"]
    assert np.array_equal(y, reference(src, level, X))
    if level == "extended":     # the fusions are in the packed graph: Gemm+Relu became FusedGemm
        graph = onnx.ModelProto.FromString(c.graph_bytes())
        assert {n.op_type for n in graph.graph.node} >= {"FusedGemm"}


def test_load_maps_the_weights_in_place(tmp_path):
    """Making the session touches none of the chunk pages (ONNX Runtime maps them): minor faults
    while loading stay far below the pages the weights span."""
    src = write(tmp_path, "m.onnx", small_mlp())
    out = str(tmp_path / "m.mcp26bin")
    model_format.pack(src, out)
    OnnxModel.load("m", "1", out, "cpu", 1, warmup=False)          # onnxruntime's own first-use costs
    weight_pages = sum(c["length"] for c in model_format.open_container(out).chunks) // 4096
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    OnnxModel.load("m", "1", out, "cpu", 1, warmup=False)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < weight_pages / 4, (faults, weight_pages)


def test_inspect_and_verify_commands(tmp_path, capsys):
    src = write(tmp_path, "m.onnx", small_mlp())
    out = str(tmp_path / "m.mcp26bin")
    assert mcpctl(["model", "pack", src, "-o", out]) == 0
    capsys.readouterr()
    assert mcpctl(["model", "inspect", out, "--verify"]) == 0
    text = capsys.readouterr().out
    assert "optimisation basic" in text and "every chunk's sha256 matches" in text and "w3" in text
    assert mcpctl(["model", "inspect", out, "--output", "json"]) == 0
    info = json.loads(capsys.readouterr().out)
    with open(src, "rb") as fh:
        import hashlib
        assert info["source"]["sha256"] == hashlib.sha256(fh.read()).hexdigest()
    assert info["chunks"] == 2 * LAYERS and info["chunks_from_base"] == 0


def test_incremental_pack_ships_only_changed_chunks(tmp_path):
    v1 = write(tmp_path, "v1.onnx", small_mlp())
    v2 = write(tmp_path, "v2.onnx", small_mlp(changed=(4,)))     # one layer of six fine-tuned
    model_format.pack(v1, str(tmp_path / "v1.mcp26bin"))
    toc = model_format.pack(v2, str(tmp_path / "v2.mcp26bin"), base=str(tmp_path / "v1.mcp26bin"))
    here = {c["name"] for c in toc["chunks"] if c["file"] == 0}
    assert here == {"w4", "b4"}
    full = os.path.getsize(tmp_path / "v1.mcp26bin")
    assert os.path.getsize(tmp_path / "v2.mcp26bin") < 0.25 * full
    y = OnnxModel.load("m", "2", str(tmp_path / "v2.mcp26bin"), "cpu", 1, warmup=False).run({"x": X})["y"]
    assert np.array_equal(y, reference(v2, "basic", X))
    # a third version against the second: its chunks come from both files, resolved through the chain
    v3 = write(tmp_path, "v3.onnx", small_mlp(changed=(4, 5)))
    sub = tmp_path / "next"
    sub.mkdir()
    toc3 = model_format.pack(v3, str(sub / "v3.mcp26bin"), base=str(tmp_path / "v2.mcp26bin"))
    assert [b["path"] for b in toc3["bases"]] == ["../v2.mcp26bin", "../v1.mcp26bin"]
    y3 = OnnxModel.load("m", "3", str(sub / "v3.mcp26bin"), "cpu", 1, warmup=False).run({"x": X})["y"]
    assert np.array_equal(y3, reference(v3, "basic", X))


@pytest.fixture
def packed(tmp_path):
    src = write(tmp_path, "m.onnx", small_mlp())
    out = tmp_path / "m.mcp26bin"
    model_format.pack(src, str(out))
    return out


def _load_error(path) -> str:
    with pytest.raises(ValueError) as e:
        OnnxModel.load("m", "1", str(path), "cpu", 1, warmup=False)
    return str(e.value)


@pytest.mark.adversarial
def test_bad_magic(packed):
    data = bytearray(packed.read_bytes())
    data[:8] = b"NOTMCP26"
    packed.write_bytes(bytes(data))
    assert _load_error(packed) == f"{packed}: bad magic b'NOTMCP26': not a .mcp26bin file (expected b'MCP26BIN')"


@pytest.mark.adversarial
def test_truncated_file(packed):
    size = packed.stat().st_size
    with open(packed, "r+b") as fh:
        fh.truncate(size - 5000)
    msg = _load_error(packed)
    assert msg.startswith(f"{packed}: truncated chunk ") and f"the file has {size - 5000}" in msg
    with open(packed, "r+b") as fh:
        fh.truncate(20)
    assert "shorter than the 64-byte header" in _load_error(packed)


@pytest.mark.adversarial
def test_chunk_hash_mismatch_found_by_verify(packed, capsys):
    c = model_format.open_container(str(packed))
    w2 = next(ch for ch in c.chunks if ch["name"] == "w2")
    with open(packed, "r+b") as fh:
        fh.seek(w2["offset"] + 100)
        fh.write(b"\xff\xff\xff\xff")
    problems = model_format.verify(model_format.open_container(str(packed)))
    assert len(problems) == 1 and problems[0].startswith(f"{packed}: hash mismatch: chunk 'w2' at byte")
    assert mcpctl(["model", "inspect", str(packed), "--verify"]) == 1
    assert "hash mismatch: chunk 'w2'" in capsys.readouterr().err


@pytest.mark.adversarial
def test_table_tampered_or_malformed(packed):
    data = bytearray(packed.read_bytes())
    at = data.index(b'"level":"basic"')
    data[at + 9:at + 14] = b"BASIC"                 # the table no longer matches its hash
    packed.write_bytes(bytes(data))
    assert _load_error(packed) == f"{packed}: hash mismatch: table of contents (the header's sha256 differs)"
    # a table whose hash matches but whose fields are wrong: named by field
    toc = json.dumps({"graph": {}, "chunks": [{"name": "w0"}], "bases": [],
                      "optimization": {"level": "basic"}}).encode()
    import hashlib
    head = struct.pack("<8sHHIQQ32s", b"MCP26BIN", 1, 0, 0, 64, len(toc), hashlib.sha256(toc).digest())
    packed.write_bytes(head + toc)
    assert _load_error(packed) == f"{packed}: table of contents: chunks[0].dtype missing or not a str"
    head = struct.pack("<8sHHIQQ32s", b"MCP26BIN", 9, 0, 0, 64, len(toc), hashlib.sha256(toc).digest())
    packed.write_bytes(head + toc)
    assert _load_error(packed) == f"{packed}: format version 9.0; this server reads 1.x"


@pytest.mark.adversarial
def test_missing_and_changed_base(tmp_path):
    v1 = write(tmp_path, "v1.onnx", small_mlp())
    v2 = write(tmp_path, "v2.onnx", small_mlp(changed=(1,)))
    model_format.pack(v1, str(tmp_path / "v1.mcp26bin"))
    model_format.pack(v2, str(tmp_path / "v2.mcp26bin"), base=str(tmp_path / "v1.mcp26bin"))
    with pytest.raises(model_format.FormatError, match="is the base .* chunks it overwrites"):
        model_format.pack(v2, str(tmp_path / "v1.mcp26bin"), base=str(tmp_path / "v2.mcp26bin"))
    shutil.move(tmp_path / "v1.mcp26bin", tmp_path / "elsewhere.mcp26bin")
    msg = _load_error(tmp_path / "v2.mcp26bin")
    assert msg.startswith(f"{tmp_path / 'v2.mcp26bin'}: missing base: bases[0] 'v1.mcp26bin' (looked for "
                          f"{tmp_path / 'v1.mcp26bin'})")
    # a base re-packed from another model has another identity: refused, not mixed in
    model_format.pack(write(tmp_path, "v9.onnx", small_mlp(seed=9)), str(tmp_path / "v1.mcp26bin"))
    assert "wrong base: " in _load_error(tmp_path / "v2.mcp26bin")
    with pytest.raises(model_format.FormatError, match=r"^--base: .*v2.mcp26bin.nope: no such file$"):
        model_format.pack(v2, str(tmp_path / "v3.mcp26bin"), base=str(tmp_path / "v2.mcp26bin.nope"))


@pytest.mark.adversarial
def test_not_a_model_at_all(tmp_path):
    p = tmp_path / "x.mcp26bin"
    p.write_bytes(b"MCP26BIN" + os.urandom(10_000))
    assert _load_error(p).startswith(f"{p}: ")
    p.write_bytes(b"")
    assert "shorter than the 64-byte header" in _load_error(p)
    with pytest.raises(model_format.FormatError, match="already a .mcp26bin"):
        model_format.pack(str(p), str(tmp_path / "y.mcp26bin"))
