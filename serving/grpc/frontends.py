"""What can serve a gRPC port: the `--grpc-frontend` choices of the model server
(`mcpctl serve`), the Endpoint Picker (`mcpctl epp serve`) and the control plane
(`mcpctl xds serve`), defined once. Names only: the CLIs read it before they
import either server."""

LANE = "fast"          # serving.grpc.server: gRPC over serving.h2.connection's asyncio HTTP/2 (the default)
GRPCIO = "grpcio"      # grpcio's grpc.aio server
GRPC_FRONTENDS = (LANE, GRPCIO)
