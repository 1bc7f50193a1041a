"""`--device` lists resolved on ONNX Runtime's own devices (inference.devices): the good forms
place a real session; every bad form is one DeviceError naming the entry and, for an absent
device, listing what this machine has. GPU/NPU placements are exercised by
benchmarks/gpu_check.sh where such a device is lent; here they must be refused."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from mcp26.inference import devices
from mcp26.inference.runtime import OnnxModel

HERE = devices.devices()
TYPES_HERE = {d.kind for d in HERE}


@pytest.fixture(scope="module")
def relu_file(tmp_path_factory):
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])])
    path = tmp_path_factory.mktemp("dev") / "relu.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return str(path)


def test_the_listing_is_what_onnxruntime_reports():
    assert [(d.ep, d.kind) for d in HERE] == [(d.ep_name, d.device.type.name.lower()) for d in ort.get_ep_devices()]
    assert [d.label for d in HERE if d.kind == "cpu"][0] == "cpu:0"


@pytest.mark.parametrize("spec,parsed", [
    ("npu:0,gpu:1", [("npu", 0), ("gpu", 1)]), ("gpu:0", [("gpu", 0)]), ("cpu", [("cpu", None)]),
    ("dsp:0", [("dsp", 0)]), (" CPU:0 ", [("cpu", 0)]), ("prefer-npu", [("prefer-npu", None)]),
    ("auto", [("auto", None)]), ("cuda:1", [("cuda", 1)])])
def test_the_document_forms_parse(spec, parsed):
    assert devices.parse(spec) == parsed


@pytest.mark.adversarial
@pytest.mark.parametrize("spec,says", [
    ("", "empty"), ("   ", "empty"), ("banana", "unknown device 'banana'"), ("gpu:x", "index 'x' is not a number"),
    ("gpu:-1", "index '-1' is not a number"), ("gpu:١", "is not a number"), ("gpu:99999", "is not a number"),
    ("cpu,cpu", "listed twice"), ("auto,cpu", "'auto' stands alone"), ("prefer-gpu:0", "takes no index"),
    ("npu:0,", "unknown device ''"), (",".join(["cpu"] * 17), "at most 16"), ("cpu;gpu", "unknown device")])
def test_malformed_lists_name_the_entry(spec, says):
    with pytest.raises(devices.DeviceError) as e:
        devices.resolve(spec)
    assert says in str(e.value) and "--device" in str(e.value)


@pytest.mark.parametrize("spec", ["npu:0,gpu:1", "npu:0", "gpu:1", "dsp:0", "cpu:7"])
def test_an_absent_device_lists_what_is_here(spec):
    first = spec.split(",")[0]
    if first.split(":")[0] in TYPES_HERE and first != "cpu:7":
        pytest.skip(f"this machine has a {first.split(':')[0].upper()}: {devices.listing(HERE)}")
    with pytest.raises(devices.DeviceError) as e:
        devices.resolve(spec)
    msg = str(e.value)
    assert msg.startswith(f"--device {first}: ") and f"devices: {devices.listing(HERE)}" in msg
    assert "cpu:0 (CPUExecutionProvider)" in msg


def test_cpu_places_a_session_on_the_cpu_ep(relu_file):
    m = OnnxModel.load("relu", "1", relu_file, device="cpu", warmup=False)
    assert m.session.get_providers() == ["CPUExecutionProvider"] and m.device == "cpu"
    assert m.where() == [HERE[0].describe()]
    out = m.run({"x": np.array([[-1, 2, -3, 4]], np.float32)})["y"]
    assert out.tolist() == [[0, 2, 0, 4]]


def test_a_policy_is_handed_to_onnxruntime(relu_file):
    # prefer-npu with no NPU here: ORT's policy falls back to the CPU EP itself
    m = OnnxModel.load("relu", "1", relu_file, device="prefer-npu", warmup=False)
    if "npu" in TYPES_HERE:
        pytest.skip("an NPU is here: the policy's choice is the NPU's EP")
    assert m.session.get_providers()[-1] == "CPUExecutionProvider" and m.placement.policy == "PREFER_NPU"


@pytest.mark.parametrize("kind", ["gpu", "npu"])
def test_an_accelerator_placement_runs_where_one_is_here(relu_file, kind):
    if kind not in TYPES_HERE:
        pytest.skip(f"no {kind.upper()} on this machine ({devices.listing(HERE)}): "
                    f"benchmarks/gpu_check.sh runs this where one is lent")
    m = OnnxModel.load("relu", "1", relu_file, device=f"{kind}:0,cpu", warmup=False)
    assert m.where()[0]["type"] == kind.upper()
    assert m.run({"x": np.array([[-1, 2, -3, 4]], np.float32)})["y"].tolist() == [[0, 2, 0, 4]]


def test_an_installed_plugin_ep_registers_with_onnxruntime():
    ov = pytest.importorskip("onnxruntime_ep_openvino", reason="the openvino extra is not installed "
                             "(pip install '.[openvino]')")
    assert "OpenVINOExecutionProvider" in devices.register_plugins()
    assert devices.register_plugins() == devices.register_plugins()      # once a process
    mine = [d for d in devices.devices() if d.ep == "OpenVINOExecutionProvider"]
    intel = any(d.vendor_id == 0x8086 for d in devices.devices())
    if not intel:      # its factory offers devices of Intel's vendor id only
        assert mine == [], mine
    else:
        assert mine and mine[0].label.split(":")[0] in ("cpu", "gpu", "npu")
    assert ov.get_ep_name() == "OpenVINOExecutionProvider"
