"""Triton python-backend model: an ONNX file run with onnxruntime (CPU).

PyTriton's tritonserver ships only the python backend (no onnxruntime
backend), so this is how Triton serves the benchmark's ONNX models here. It is
copied into the model repository as MODEL/1/model.py and run by Triton's stub
inside .cache/peers/triton, never imported by mcp-mesh itself. Triton's
dynamic batcher hands execute() several requests at once; they run as one
onnxruntime call, as Triton's own onnxruntime backend would do.
"""
import json

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(params.get("intra_op_threads", {}).get("string_value", "0"))
        self.session = ort.InferenceSession(params["onnx_path"]["string_value"], opts,
                                            providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]

    def execute(self, requests):
        feeds = {name: [pb_utils.get_input_tensor_by_name(r, name).as_numpy() for r in requests]
                 for name in self.inputs}
        sizes = [a.shape[0] for a in feeds[self.inputs[0]]]
        batch = {name: arrays[0] if len(arrays) == 1 else np.concatenate(arrays) for name, arrays in feeds.items()}
        results = self.session.run(self.outputs, batch)
        responses, start = [], 0
        for n in sizes:
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor(name, value[start:start + n]) for name, value in zip(self.outputs, results)]))
            start += n
        return responses
