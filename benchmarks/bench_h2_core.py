"""The HTTP/2 connection's own CPU per unary gRPC call, no sockets, no gRPC: serving.h2's
sans-IO connection beside python-hyper/h2's (the ecosystem's sans-IO HTTP/2), in one run.

    python -m benchmarks h2_core [--calls 20000] [--streams 1,16,64]

Each call is what a gRPC client sends (a HEADERS block as grpc-core encodes it, indexed after
the first call, and one DATA frame of a 1 KB message with END_STREAM) fed to the server
connection, and the server's answer (response headers, a DATA frame, trailers) taken out as
bytes; `--streams` calls at a time per batch of bytes, as c in-flight calls arrive together.
python-hyper/h2 is not a dependency of the project: its column is shown when `h2` imports
(pip install h2 in the venv, or PYTHONPATH to one that has it). Prints one table;
artifacts/bench/h2_core.json.
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import time

from hpack import Encoder

from mcp26.serving.h2.connection import H2Connection
from mcp26.serving.h2.events import DataReceived, RequestReceived
from mcp26.serving.h2.frames import DATA, END_STREAM, PREFACE, SETTINGS, WINDOW_UPDATE, frame
from mcp26.serving.h2.hpack_encoder import STATUS_200, literal

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIELDS = [(":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelInfer"),
          (":authority", "127.0.0.1:8001"), ("content-type", "application/grpc"), ("te", "trailers"),
          ("grpc-accept-encoding", "identity,deflate,gzip"), ("user-agent", "grpc-python/1.66.0 grpc-c/42.0.0")]
MESSAGE = b"\x00" + struct.pack(">I", 1024) + b"m" * 1024
RESPONSE_HEADERS = STATUS_200 + literal(b"content-type", b"application/grpc")
TRAILERS = literal(b"grpc-status", b"0")
# the client's preface: windows wide open (what it receives never waits for them)
CLIENT_START = (PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", 4, (1 << 31) - 1))
                + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", (1 << 31) - 1 - 65535)))


def client_batches(calls: int, streams: int) -> list[bytes]:
    """The client's bytes, `streams` calls per batch (indexed blocks, as grpc-core sends them)."""
    enc = Encoder()
    out, sid, batch = [], 1, []
    for i in range(calls):
        batch.append(frame(1, 0x4, sid, enc.encode(FIELDS)) + frame(DATA, END_STREAM, sid, MESSAGE))
        sid += 2
        if len(batch) == streams:
            out.append(b"".join(batch))
            batch = []
    if batch:
        out.append(b"".join(batch))
    return out


def ours(batches: list[bytes]) -> int:
    conn = H2Connection()
    conn.initiate()
    conn.receive(CLIENT_START, 0.0)
    conn.data_to_send()
    sent = 0
    for i, data in enumerate(batches):
        for ev in conn.receive(data, float(i)):
            if type(ev) is DataReceived and ev.end_stream:
                conn.send_answer(ev.stream, RESPONSE_HEADERS, MESSAGE, TRAILERS)
            elif type(ev) is RequestReceived:
                pass
        sent += len(conn.data_to_send())
    return sent


def hyper(batches: list[bytes]) -> int:
    import h2.config
    import h2.connection
    import h2.events
    import h2.settings
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
    conn.local_settings = h2.settings.Settings(client=False, initial_values={  # the windows ours opens
        h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20, h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1024})
    conn.initiate_connection()
    conn.increment_flow_control_window((16 << 20) - 65535)
    conn.receive_data(CLIENT_START)
    conn.data_to_send()
    headers = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    trailers = [(b"grpc-status", b"0")]
    sent = 0
    for data in batches:
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.DataReceived):
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded):
                sid = ev.stream_id
                conn.send_headers(sid, headers)
                conn.send_data(sid, MESSAGE)
                conn.send_headers(sid, trailers, end_stream=True)
        sent += len(conn.data_to_send())
    return sent


def per_call_us(fn, batches: list[bytes], calls: int, rounds: int = 3) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        fn(batches)
        best = min(best, time.process_time() - t0)
    return 1e6 * best / calls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--streams", default="1,16,64")
    args = ap.parse_args(argv)
    try:
        import h2  # noqa: F401
        have_h2 = True
    except ImportError:
        have_h2 = False
    rows = []
    for streams in (int(s) for s in args.streams.split(",")):
        batches = client_batches(args.calls, streams)
        row = {"streams": streams, "ours_us": per_call_us(ours, batches, args.calls)}
        if have_h2:
            row["h2_us"] = per_call_us(hyper, batches, args.calls)
        rows.append(row)
    load = os.getloadavg()
    print(f"\nHTTP/2 connection CPU per unary gRPC call (best of 3 x {args.calls} calls; load average "
          f"{load[0]:.2f})")
    print(f"{'calls per batch':>16} {'serving.h2 µs':>14} {'python-hyper h2 µs':>19} {'h2 / ours':>10}")
    for r in rows:
        other = f"{r['h2_us']:19.1f} {r['h2_us'] / r['ours_us']:9.1f}x" if "h2_us" in r else \
            f"{'(h2 not installed)':>19} {'':>10}"
        print(f"{r['streams']:>16} {r['ours_us']:14.1f} {other}")
    os.makedirs(os.path.join(ROOT, "artifacts", "bench"), exist_ok=True)
    with open(os.path.join(ROOT, "artifacts", "bench", "h2_core.json"), "w") as f:
        json.dump({"calls": args.calls, "load_average": load, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
