"""The harness tests, benchmarks and `mcpctl demo` share: a real Envoy, the control plane, upstreams, ports, gRPC-Web frames, certificates, process stopping."""
