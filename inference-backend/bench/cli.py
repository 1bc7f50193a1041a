"""`mcp-bench`: load a KServe v2 model server over REST or gRPC.

  mcp-bench -c 16 -n 20000 -u http://127.0.0.1:8000/v2/models/mlp
  mcp-bench -c 1000 -n 10000 -u http://localhost:8080/infer --output-format csv > run.csv
  mcp-bench -c 64 --rate 2000 --duration 10 -u http://127.0.0.1:8000/v2/models/mlp \\
            --priority-mix critical=0.1,low=0.9 --output-format json
  mcp-bench --grpc -c 16 -n 20000 -u 127.0.0.1:8001/v2/models/mlp
"""
from __future__ import annotations

import argparse
import sys

from mcp26.inference.bench import report
from mcp26.inference.bench.runner import Config, run_sync
from mcp26.inference.bench.target import TargetError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mcp-bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-u", "--url", required=True,
                   help="http://HOST:PORT/v2/models/NAME (any other path: plain GET, for calibration)")
    p.add_argument("-c", "--concurrency", type=int, default=1,
                   help="requests in flight at most (HTTP/1.1: one keep-alive connection each)")
    p.add_argument("-n", "--requests", type=int, default=None,
                   help="requests to send (default 1000; with --duration alone, as many as fit)")
    p.add_argument("--duration", type=float, default=None, help="stop after S seconds")
    p.add_argument("--rate", type=float, default=None,
                   help="open loop at RPS requests/s, latency from each request's intended send time")
    p.add_argument("--grpc", action="store_true", help="KServe v2 gRPC instead of REST")
    p.add_argument("--connections", type=int, default=1, help="gRPC channels the streams share")
    p.add_argument("--grpc-client", choices=("h2", "grpcio"), default="h2",
                   help="h2 (default): mcp-bench's own HTTP/2 client, light on CPU; grpcio: grpcio's channel")
    p.add_argument("--priority-mix", default=None, metavar="NAME=FRAC,...",
                   help="e.g. critical=0.1,low=0.9: x-mcp-qos-class and parameters.priority per request")
    p.add_argument("--model", default=None, help="model name, if the URL does not say")
    p.add_argument("--shape", default=None, metavar="IN:D1,D2;...", help="shape for variable-size inputs")
    p.add_argument("--input", action="append", default=None, metavar="NAME:DATATYPE:D1,D2",
                   help="an input to send (repeatable); skips the GET of the model's metadata")
    p.add_argument("--binary-data", choices=("auto", "always", "never"), default="auto",
                   help="REST inputs as KServe's binary-tensor extension: auto (default) when they exceed 64 KiB, "
                        "always, never (JSON)")
    p.add_argument("--timeout", type=float, default=30.0, help="per-request timeout in seconds")
    p.add_argument("--warmup", type=int, default=0, help="requests sent first and not recorded")
    p.add_argument("--output-format", choices=("table", "csv", "json"), default="table",
                   help="csv and json add the server profiler's metrics over the run, where it has them")
    p.add_argument("--max-error-rate", type=float, default=0.01, metavar="SHARE",
                   help="exit 1 when more than this share of the requests failed, shed (429) ones included "
                        "(default 0.01: 1 %%)")
    p.add_argument("-o", "--output", default=None, help="write the report here instead of stdout")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = Config(url=args.url, concurrency=args.concurrency, requests=args.requests,
                 duration=args.duration, rate=args.rate, grpc=args.grpc,
                 priority_mix=args.priority_mix, model=args.model, shape=args.shape, inputs=args.input,
                 timeout=args.timeout, warmup=args.warmup, connections=args.connections,
                 grpc_client=args.grpc_client, server_profile=args.output_format != "table",
                 binary_data=args.binary_data)
    if not 0 <= args.max_error_rate <= 1:
        print(f"mcp-bench: --max-error-rate {args.max_error_rate}: a share between 0 and 1", file=sys.stderr)
        return 2
    try:
        result = run_sync(cfg)
    except (TargetError, ValueError) as e:
        print(f"mcp-bench: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    text = report.render(result, args.output_format)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text if text.endswith("\n") else text + "\n")
    else:
        try:
            print(text, flush=True)
        except BrokenPipeError:   # `mcp-bench ... | head`
            sys.stderr.close()
    return verdict(result, args.max_error_rate, args.output_format != "table")


def verdict(result: dict, max_error_rate: float, say_summary: bool) -> int:
    """0, or 1 where more than max_error_rate of the requests failed (said on stderr, with the classes)."""
    row = result["rows"][0]
    if say_summary:                 # the table has it already; CSV / JSON go to a file, this to the terminal
        print(report.summary_line(result), file=sys.stderr)
    profile = result.get("server_profile") or {}
    if "error" in profile:
        print(f"mcp-bench: no server profiler columns: {profile['error']}", file=sys.stderr)
    share = row["errors"] / row["requests"] if row["requests"] else 1.0
    if share > max_error_rate:
        classes = ", ".join(f"{k}={v}" for k, v in row["error_classes"].items()) or "none"
        print(f"mcp-bench: {row['errors']} of {row['requests']} requests failed ({100 * share:.1f} %), above "
              f"--max-error-rate {100 * max_error_rate:g} %; error classes: {classes}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
