"""KServe ModelServer serving ONNX files with onnxruntime (CPU), for
benchmarks/bench_peers.py. Run by .cache/peers/kserve's interpreter, never
imported by mcp-mesh itself:

  python kserve_onnx_server.py --model NAME=PATH.onnx [--model ...] --http_port P --grpc_port Q

KServe's Python server has no dynamic batcher of its own (KServe batches in
a Go sidecar, the agent, in front of the pod), so each request is one
onnxruntime call, made on the event loop as KServe does with a sync predict().
The ModelServer binds 0.0.0.0: the benchmark runs it in a private network
namespace with only `lo` up.
"""
import argparse

import onnxruntime as ort
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer
from kserve import model_server
from kserve.utils.utils import generate_uuid


class OnnxModel(Model):
    def __init__(self, name: str, path: str, intra_op_threads: int):
        super().__init__(name)
        self.path, self.intra_op_threads = path, intra_op_threads

    def load(self) -> bool:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.intra_op_threads
        self.session = ort.InferenceSession(self.path, opts, providers=["CPUExecutionProvider"])
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.ready = True
        return True

    def __getstate__(self):
        # --workers > 1 pickles the models into each REST worker process; a
        # session does not pickle, so each worker opens its own on first use
        state = dict(self.__dict__)
        state["session"] = None
        return state

    def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        if self.session is None:
            self.load()
        feeds = {i.name: i.as_numpy() for i in payload.inputs}
        results = self.session.run(self.outputs, feeds)
        outputs = []
        for name, value in zip(self.outputs, results):
            out = InferOutput(name=name, shape=list(value.shape), datatype="FP32")
            # binary (raw_output_contents) over gRPC, JSON data over REST, as KServe's own servers do
            out.set_data_from_numpy(value, binary_data=payload.from_grpc)
            outputs.append(out)
        # a request without an id gets one, as KServe's own predictors do (get_predict_response)
        return InferResponse(response_id=payload.id or generate_uuid(), model_name=self.name, infer_outputs=outputs,
                             from_grpc=payload.from_grpc)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(parents=[model_server.parser])
    parser.add_argument("--model", action="append", required=True, help="NAME=PATH.onnx")
    parser.add_argument("--intra_op_threads", type=int, default=0)
    args, _ = parser.parse_known_args()
    models = []
    for spec in args.model:
        name, _, path = spec.partition("=")
        m = OnnxModel(name, path, args.intra_op_threads)
        m.load()
        models.append(m)
    ModelServer(http_port=args.http_port, grpc_port=args.grpc_port, workers=args.workers,
                # no per-request latency log line (ours logs none); --configure_logging false
                # (read by kserve's own parser) leaves the access log unconfigured, so silent
                enable_latency_logging=False).start(models)
