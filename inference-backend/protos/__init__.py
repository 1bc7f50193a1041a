"""KServe v2 gRPC messages and service stubs, generated from grpc_service.proto."""
