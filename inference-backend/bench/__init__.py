"""mcp-bench: a load generator for KServe v2 inference servers (REST and gRPC).

Closed loop (-c workers, each sends its next request when the last returns)
and open loop (--rate: a precomputed schedule; latency counts from the
intended send time, so a slow server cannot hide behind a slow generator).
"""
