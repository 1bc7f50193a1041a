"""One ONNX graph split into pipelined stages (inference.partition): every cut gives the
unsplit graph's results (max abs diff <= 1e-5, FP32); the cost-chosen cut is a valid one;
bad cuts are refused naming the tensor; the cut moves under load with no run failing and
every answer its own; a stage on a GPU or NPU runs where one is here."""
from __future__ import annotations

import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from mcp26.inference import devices
from mcp26.inference import partition as P
from mcp26.inference.examples.build_repository import build


@pytest.fixture(scope="module")
def vision(tmp_path_factory):
    return f"{build(str(tmp_path_factory.mktemp('mm') / 'repo'))}/vision/1/model.onnx"


@pytest.fixture(scope="module")
def reference(vision):
    s = ort.InferenceSession(vision, providers=["CPUExecutionProvider"])
    return lambda x: s.run(None, {"IMAGE": x})[0]


def _x(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, 32, 32)).astype(np.float32)


def test_every_valid_cut_gives_the_unsplit_result(vision, reference):
    graph = onnx.load(vision)
    cuts = P.valid_cuts(graph)
    assert len(cuts) >= 4
    x = _x(7)
    for cut in cuts:
        stages = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
                  for m in P.split(graph, [cut])]
        mid = stages[0].run(None, {"IMAGE": x})[0]
        out = stages[1].run(None, {cut: mid})[0]
        assert np.abs(out - reference(x)).max() <= 1e-5, cut


def test_the_pipeline_over_micro_batches_equals_the_unsplit_graph(vision, reference):
    m = P.PartitionedModel.load_partitioned("vision", "1", vision, P.Spec.parse("stages=3;micro=3"),
                                            intra_op_threads=2)
    try:
        assert len(m.where()) == 3 and m.pipeline.cuts == sorted(m.pipeline.cuts, key=P.valid_cuts(m.graph).index)
        for n in (1, 5, 16):
            x = _x(n, n)
            assert np.abs(m.run({"IMAGE": x})["EMBEDDING"] - reference(x)).max() <= 1e-5
        # the cost model saw the real per-node times of ORT's profiler
        assert sum(m.costs.values()) > 0 and set(m.eps.values()) == {"CPUExecutionProvider"}
    finally:
        m.pipeline.stop()


@pytest.mark.adversarial
@pytest.mark.parametrize("spec,says", [
    ("cut=nope", "cut 'nope': no node"), ("cut=conv2,conv2", "at the same place"), ("stages=1", "at least 2 stages"),
    ("stages=2;devices=cpu", "2 stages but 1 devices"), ("stages=x", "expected a number"),
    ("colour=red", "unknown key 'colour'"), ("stages=2;devices=cpu,npu:3", "no NPU here")])
def test_bad_specs_are_refused_naming_what(vision, spec, says):
    if "npu" in spec and "npu" in {d.kind for d in devices.devices()}:
        pytest.skip("an NPU is here")
    with pytest.raises(ValueError) as e:
        P.PartitionedModel.load_partitioned("vision", "1", vision, P.Spec.parse(spec), intra_op_threads=1)
    assert says in str(e.value), str(e.value)


def test_a_cut_that_leaves_two_tensors_crossing_is_refused(vision):
    graph = onnx.load(vision)
    # inside a residual block the skip tensor and the branch both cross: not a single-tensor cut
    inner = next(n.output[0] for n in graph.graph.node if n.output[0] not in P.valid_cuts(graph)
                 and n.op_type == "BatchNormalization" and n is not graph.graph.node[1])
    with pytest.raises(P.PartitionError) as e:
        P.split(graph, [inner])
    assert f"cut {inner!r}: later nodes need more than it" in str(e.value)


def test_the_cut_moves_under_load_with_no_failure_and_no_reordering(vision, reference):
    m = P.PartitionedModel.load_partitioned("vision", "1", vision, P.Spec.parse("stages=2;micro=2"),
                                            intra_op_threads=2)
    cuts = P.valid_cuts(m.graph)
    inputs = [_x(1 + i % 5, i) for i in range(12)]
    expected = [reference(x) for x in inputs]
    failures, wrong, runs = [], [], [0]
    stop = threading.Event()

    def client(k: int) -> None:
        i = k
        while not stop.is_set():
            try:
                out = m.run({"IMAGE": inputs[i % 12]})["EMBEDDING"]
            except Exception as e:         # noqa: BLE001 - counted, asserted below
                failures.append(e)
                return
            if out.shape != expected[i % 12].shape or np.abs(out - expected[i % 12]).max() > 1e-5:
                wrong.append(i)
            runs[0] += 1
            i += 4
    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    try:
        swaps = [m.move_to([cuts[j % len(cuts)]]) for j in range(1, 13)]
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        m.pipeline.stop()
    assert not failures and not wrong and runs[0] > 12, (failures[:1], wrong[:5], runs)
    assert len(m.swaps) == 12 and all(s.swap_seconds < s.seconds for s in swaps)


def test_dynamic_moves_the_cut_towards_the_faster_stage(vision):
    m = P.PartitionedModel.load_partitioned("vision", "1", vision, P.Spec.parse("stages=2;dynamic=1"),
                                            intra_op_threads=2)
    try:
        first = P.valid_cuts(m.graph)[0]
        m.move_to([first])                   # nearly everything on stage 1: it is the bottleneck
        for s in m.pipeline.stages:
            s.busy_s, s.runs = 0.0, 0
        for _ in range(P.WINDOW):
            m.run({"IMAGE": _x(8)})
        assert m.swaps[-1].cuts_from == [first] and m.pipeline.cuts != [first]
    finally:
        m.pipeline.stop()


@pytest.mark.parametrize("kind", ["gpu", "npu"])
def test_a_stage_on_an_accelerator(vision, reference, kind):
    if kind not in {d.kind for d in devices.devices()}:
        pytest.skip(f"no {kind.upper()} here ({devices.listing(devices.devices())}); "
                    f"benchmarks/gpu_check.sh runs the partition rows where one is lent")
    m = P.PartitionedModel.load_partitioned("vision", "1", vision, P.Spec.parse(f"stages=2;devices=cpu,{kind}:0"))
    try:
        x = _x(8)
        assert np.abs(m.run({"IMAGE": x})["EMBEDDING"] - reference(x)).max() <= 1e-4
    finally:
        m.pipeline.stop()
