"""An ext_proc server that answers every message at once and always picks the
same endpoint (`python -m benchmarks.epp_null_processor PORT ENDPOINT`): the
cost of a Python gRPC ext_proc conversation with no decision in it, so that
bench_epp can split the picker's overhead into the protocol's and its own."""
from __future__ import annotations

import asyncio
import sys

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from mesh import endpoint_picker as epp


class NullPicker(pb_grpc.ExternalProcessorServicer):
    def __init__(self, endpoint: str):
        self.endpoint = endpoint

    async def Process(self, request_iterator, context):
        async for request in request_iterator:
            kind = request.WhichOneof("request")
            if kind == "request_body":
                out = pb.ProcessingResponse()
                opt = out.request_body.response.header_mutation.set_headers.add()
                opt.header.key, opt.header.raw_value = epp.DESTINATION_ENDPOINT, self.endpoint.encode()
                out.dynamic_metadata.fields[epp.DESTINATION_NAMESPACE].struct_value.fields[
                    epp.DESTINATION_ENDPOINT].string_value = self.endpoint
                yield out
            elif kind == "request_headers":
                yield pb.ProcessingResponse(request_headers=pb.HeadersResponse())
            elif kind == "response_headers":
                yield pb.ProcessingResponse(response_headers=pb.HeadersResponse())
            else:
                yield pb.ProcessingResponse(response_body=pb.BodyResponse())


async def main(port: int, endpoint: str) -> None:
    server = grpc.aio.server()
    pb_grpc.add_ExternalProcessorServicer_to_server(NullPicker(endpoint), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print('{"event": "ready"}', flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2]))
