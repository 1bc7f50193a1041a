"""A proxyless gRPC client, run as its own process (grpcio's xDS client is one per process,
fixed at first use by GRPC_XDS_BOOTSTRAP):

    GRPC_XDS_BOOTSTRAP=bootstrap.json python xds_grpc_client.py xds:///HOST:PORT N [KEY=VALUE ...]

calls /mesh.test.Echo/Who N times with the given metadata and prints JSON
{"counts": {backend name: n, "error CODE": n}}. The backends answer their own name.
"""
from __future__ import annotations

import json
import sys
import time

import grpc

WHO = "/mesh.test.Echo/Who"


def main(argv: list[str]) -> int:
    target, n = argv[0], int(argv[1])
    metadata = tuple(tuple(kv.split("=", 1)) for kv in argv[2:])
    channel = grpc.insecure_channel(target)
    who = channel.unary_unary(WHO)   # raw bytes both ways
    # First call waits until the xDS resources have arrived.
    deadline = time.monotonic() + 8
    while True:
        try:
            who(b"", metadata=metadata, timeout=5, wait_for_ready=True)
            break
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    counts: dict[str, int] = {}
    for _ in range(n):
        try:
            key = who(b"", metadata=metadata, timeout=5).decode()
        except grpc.RpcError as e:
            key = f"error {e.code().name}"
        counts[key] = counts.get(key, 0) + 1
    print(json.dumps({"counts": counts}))
    channel.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
