"""eBPF QoS for the mesh: tc programs (C, loaded with bcc) that mark DSCP by QoS
class, socket mark, port, CIDR and TLS ALPN, and sample request latency; their
loaders, readers and `mcpctl bpf`. See bpf/README.md."""
