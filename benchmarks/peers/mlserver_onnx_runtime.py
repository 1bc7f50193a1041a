"""A minimal MLServer runtime serving an ONNX file with onnxruntime (CPU).

MLServer ships no ONNX runtime of its own; this is the peer of
benchmarks/bench_inference.py. It is copied into the peer's model folder and
imported by MLServer inside .cache/peers/mlserver, never by mcp-mesh itself.
"""
import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxRuntime(MLModel):
    async def load(self) -> bool:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int((self.settings.parameters.extra or {}).get("intra_op_threads", 0))
        self.session = ort.InferenceSession(self.settings.parameters.uri, opts,
                                            providers=["CPUExecutionProvider"])
        self.ready = True
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {i.name: NumpyCodec.decode_input(i) for i in payload.inputs}
        names = [o.name for o in self.session.get_outputs()]
        outputs = self.session.run(names, feeds)
        return InferenceResponse(model_name=self.name, outputs=[
            NumpyCodec.encode_output(name=n, payload=np.asarray(v)) for n, v in zip(names, outputs)])
