"""An ext_proc server that answers every message at once and always picks the
same endpoint (`python -m benchmarks.epp_null_processor PORT ENDPOINT [fast|grpcio]`): the
cost of a Python gRPC ext_proc conversation with no decision in it, so that
the overhead benchmark (benchmarks/epp_overhead.py) can split the picker's
overhead into the protocol's and its own. It follows the mode Envoy announces
(`protocol_config`), as the picker does: BUFFERED (answer the headers, pick
on the body), FULL_DUPLEX_STREAMED (hold the headers' answer until the body
has ended, then answer both, the body echoed) or NONE (pick on the headers,
as the picker does a live session's next turn; one message)."""
from __future__ import annotations

import asyncio
import sys

import grpc
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from mcp26.mesh import endpoint_picker as epp
from mcp26.serving.grpc.server import GrpcLane, start_server

DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
NO_BODY = processing_mode_pb2.ProcessingMode.NONE


class NullPicker(pb_grpc.ExternalProcessorServicer):
    def __init__(self, endpoint: str):
        self.endpoint = endpoint

    def _pick(self, phase: str) -> pb.ProcessingResponse:
        out = pb.ProcessingResponse()
        opt = getattr(out, phase).response.header_mutation.set_headers.add()
        opt.header.key, opt.header.raw_value = epp.DESTINATION_ENDPOINT, self.endpoint.encode()
        out.dynamic_metadata.fields[epp.DESTINATION_NAMESPACE].struct_value.fields[
            epp.DESTINATION_ENDPOINT].string_value = self.endpoint
        return out

    @staticmethod
    def _echo(phase: str, body: bytes, end: bool) -> pb.ProcessingResponse:
        out = pb.ProcessingResponse()
        s = getattr(out, phase).response.body_mutation.streamed_response
        s.body, s.end_of_stream = body, end
        return out

    async def Process(self, request_iterator, context):
        duplex_in = duplex_out = no_body = False
        body = bytearray()
        async for request in request_iterator:
            if request.HasField("protocol_config"):
                duplex_in = request.protocol_config.request_body_mode == DUPLEX
                duplex_out = request.protocol_config.response_body_mode == DUPLEX
                no_body = request.protocol_config.request_body_mode == NO_BODY
            kind = request.WhichOneof("request")
            if kind == "request_headers":
                if request.request_headers.end_of_stream or no_body:
                    yield self._pick(kind)
                elif not duplex_in:
                    yield pb.ProcessingResponse(request_headers=pb.HeadersResponse())
            elif kind == "request_body":
                if not duplex_in:
                    yield self._pick(kind)
                    continue
                body += request.request_body.body
                if request.request_body.end_of_stream:
                    yield self._pick("request_headers")
                    yield self._echo(kind, bytes(body), True)
            elif kind == "response_headers":
                yield pb.ProcessingResponse(response_headers=pb.HeadersResponse())
            elif kind == "response_body":
                if duplex_out:
                    yield self._echo(kind, request.response_body.body, request.response_body.end_of_stream)
                else:
                    yield pb.ProcessingResponse(response_body=pb.BodyResponse())
            elif kind == "request_trailers":
                yield pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
            else:
                yield pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


async def main(port: int, endpoint: str, frontend: str = "fast") -> None:
    """On the gRPC server the picker runs on by default (serving.grpc.server), or grpc.aio."""
    server = GrpcLane(4 << 20, 4 << 20) if frontend == "fast" else grpc.aio.server()
    pb_grpc.add_ExternalProcessorServicer_to_server(NullPicker(endpoint), server)
    await start_server(server, "127.0.0.1", port, "the null processor's port")
    print('{"event": "ready"}', flush=True)
    await asyncio.Event().wait()        # until the benchmark stops this process


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], *sys.argv[3:4]))
