"""The floor under any Python grpc.aio model server: ModelInfer on grpc.aio
(uvloop), one onnxruntime run in the handler, nothing else - no batcher, no
metrics, no parameters, no checks. KServe's ModelServer is grpc.aio plus its
dataplane; ours is grpc.aio plus the batcher and the protocol's extras. What
this reaches at c=1 bounds what either can (bench_peers: the `grpc-floor`
reference column; never judged against a floor).

    python grpc_aio_floor.py MODEL_NAME ONNX_PATH PORT     (prints "ready" when listening)
"""
from __future__ import annotations

import sys

import grpc
import numpy as np
import onnxruntime as ort
import uvloop

from mcp26.inference.protos import grpc_service_pb2 as pb


def main(name: str, path: str, port: int) -> None:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    inp, out = session.get_inputs()[0], session.get_outputs()[0]
    width = inp.shape[1]
    metadata = pb.ModelMetadataResponse(
        name=name, versions=["1"], platform="onnxruntime_onnx",
        inputs=[pb.ModelMetadataResponse.TensorMetadata(name=inp.name, datatype="FP32", shape=[-1, width])],
        outputs=[pb.ModelMetadataResponse.TensorMetadata(name=out.name, datatype="FP32", shape=[-1, out.shape[1]])])

    async def infer(request, context):
        x = np.frombuffer(request.raw_input_contents[0], np.float32).reshape(-1, width)
        (y,) = session.run([out.name], {inp.name: x})
        response = pb.ModelInferResponse(model_name=name, model_version="1", id=request.id)
        response.outputs.add(name=out.name, datatype="FP32", shape=list(y.shape))
        response.raw_output_contents.append(y.tobytes())
        return response

    async def model_metadata(request, context):
        return metadata

    async def serve():
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {
            "ModelInfer": grpc.unary_unary_rpc_method_handler(
                infer, pb.ModelInferRequest.FromString, pb.ModelInferResponse.SerializeToString),
            "ModelMetadata": grpc.unary_unary_rpc_method_handler(
                model_metadata, pb.ModelMetadataRequest.FromString, pb.ModelMetadataResponse.SerializeToString),
        }),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()

    uvloop.run(serve())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
