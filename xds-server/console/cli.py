"""`mcpctl console`: serve the console page for the local mesh."""
from __future__ import annotations

import asyncio
import sys
import urllib.parse

from mcp26.mesh import cli_context


def _url(value: str) -> str:
    """HOST:PORT or http(s)://HOST:PORT, as --control-plane takes them."""
    url = value if "://" in value else f"http://{value}"
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.netloc:
        raise ValueError(f"{value!r} is not HOST:PORT or an http(s)://HOST:PORT URL")
    return url.rstrip("/")


def register(subparsers) -> None:
    p = subparsers.add_parser("console", help="web console: proxies, routes, endpoints, latency, ModelInfer over gRPC-Web")
    p.add_argument("--host", default="127.0.0.1", help="address the console listens on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=15100, help="console HTTP port (default 15100)")
    cli_context.add_control_plane_flag(p, legacy=("--xds-admin",))
    p.add_argument("--backend", default="", help="inference backend HTTP URL (its /metrics feeds the latency plot)")
    p.add_argument("--grpc-web", default="http://127.0.0.1:8080", help="the Envoy listener the page sends gRPC-Web to")
    p.add_argument("--envoy-admin", default="", help="a gateway Envoy's admin URL, for the health it observes")
    p.add_argument("--picker", default="", metavar="URL",
                   help="the Endpoint Picker's admin URL (mcpctl epp serve; its /stats: picks and refusals)")
    p.add_argument("--decision-loop", default="", metavar="URL",
                   help="the decision loop's admin URL (mcpctl scheduler run; its /status: the last decisions)")
    p.add_argument("--model", default="", help="model name pre-filled in the ModelInfer form")
    p.add_argument("--latency-metric", default=None,
                   help="histogram in the backend's /metrics, labelled by qos_class or priority_level "
                        "(default mcp_inference_request_duration_seconds)")
    p.add_argument("--latency-window", type=float, default=10.0, metavar="SECONDS",
                   help="each latency point is the p50/p99 of the requests in the last SECONDS (default 10)")
    p.add_argument("--scrape-interval", type=float, default=1.0, metavar="SECONDS",
                   help="how often the backend's /metrics is read and the page refreshes (default 1)")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from mcp26.xds.console.server import ConsoleOptions, run
    try:
        urls = {k: _url(v) if v else "" for k, v in
                (("xds_admin", cli_context.url(args)), ("backend", args.backend),
                 ("grpc_web", args.grpc_web), ("envoy_admin", args.envoy_admin),
                 ("picker", args.picker), ("decision_loop", args.decision_loop))}
    except ValueError as e:        # cli_context.ContextError included
        print(f"mcpctl console: {e}", file=sys.stderr)
        return 2
    if args.latency_window <= 0 or args.scrape_interval <= 0:
        print("mcpctl console: --latency-window and --scrape-interval must be positive", file=sys.stderr)
        return 2
    options = ConsoleOptions(model=args.model, window_s=args.latency_window, scrape_s=args.scrape_interval, **urls)
    if args.latency_metric:
        options.latency_metric = args.latency_metric
    try:
        asyncio.run(run(options, args.host, args.port))
    except OSError as e:
        print(f"mcpctl console: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    return 0
