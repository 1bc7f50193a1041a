"""`mcpctl route explain` and `mcpctl proxy-config`, registered through the `mcp26.mcpctl` entry
point (pyproject.toml) as a part's commands are: explain sits above the control plane's modules,
so mcp26.xds.cli does not import it."""
from __future__ import annotations

import json
import sys

PROXY_CONFIG_KINDS = ("listeners", "routes", "clusters", "endpoints", "secret")


def register(subparsers) -> None:
    route = subparsers.add_parser("route", help="explain which route rule a request takes, before deploying")
    rsub = route.add_subparsers(dest="route_command", metavar="COMMAND", required=True)
    ex = rsub.add_parser("explain", help="run one request through the routes DIR translates to, traced to file:line",
                         description="Translate DIR for one proxy as the control plane would, run the request "
                                     "through its route configuration with Envoy's matching rules, and say which "
                                     "VirtualService rule matched, which were passed over and why, and where the "
                                     "request goes.")
    ex.add_argument("dir", metavar="DIR", help="the config directory (as `mcpctl xds serve --config-dir`)")
    ex.add_argument("--host", required=True, help="the request's Host (:authority), e.g. reviews.example.com")
    ex.add_argument("--port", type=int, help="the proxy's listener port (default: its only HTTP listener)")
    ex.add_argument("--path", default="/", help="the request path, with any ?query (default /)")
    ex.add_argument("--method", default="GET", help="the request method (default GET)")
    ex.add_argument("-H", "--header", action="append", default=[], metavar="NAME:VALUE",
                    help="a request header (repeatable; a name given twice gets both values)")
    who = ex.add_mutually_exclusive_group()
    who.add_argument("--gateway", metavar="NS/NAME",
                     help="explain for the gateway Envoy of this Gateway (default: the only Gateway in DIR)")
    who.add_argument("--sidecar", metavar="NS", help="explain for a sidecar in namespace NS instead")
    ex.add_argument("-o", "--output", choices=("text", "json"), default="text", help="output format (default text)")
    ex.set_defaults(func=_route_explain)

    pc = subparsers.add_parser("proxy-config", help="a proxy's listeners, routes, clusters ... in istioctl's shapes")
    pc.add_argument("kind", choices=PROXY_CONFIG_KINDS, metavar="KIND",
                    help=f"what to show: {', '.join(PROXY_CONFIG_KINDS)}")
    pc.add_argument("node", metavar="NODE", help="the proxy's node id, as `mcpctl proxy-status` lists it")
    pc.add_argument("--admin-address", default="127.0.0.1:18001",
                    help="the control plane's admin HOST:PORT (default 127.0.0.1:18001)")
    pc.add_argument("--envoy-admin", metavar="ADDR",
                    help="also read the proxy's own /config_dump at this Envoy admin HOST:PORT and flag differences")
    pc.add_argument("-o", "--output", choices=("short", "json", "yaml"), default="short",
                    help="short: istioctl's table (default); json, yaml: the resources")
    pc.set_defaults(func=_proxy_config)


def _route_explain(args) -> int:
    from mcp26.xds.explain import envoy_match
    from mcp26.xds.explain.route_explain import ExplainError, explain, format_text, load, parse_header, proxy_for
    import os
    try:
        if not os.path.isdir(args.dir):
            raise ExplainError(f"config directory {args.dir!r} does not exist")
        headers: dict = {}
        for h in args.header:
            name, value = parse_header(h)
            headers.setdefault(name, []).append(value)
        path = args.path if args.path.startswith("/") else "/" + args.path
        request = envoy_match.Request(args.host, path, args.method.upper(), headers)
        config = load(args.dir)
        result = explain(config, proxy_for(config, args.gateway, args.sidecar), request, args.port)
    except ExplainError as e:
        print(f"mcpctl route explain: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1) if args.output == "json" else format_text(result))
    return 0


def _proxy_config(args) -> int:
    from mcp26.xds.explain.proxy_config import ProxyConfigError, run
    try:
        sys.stdout.write(run(args.kind, args.node, args.admin_address, args.envoy_admin, args.output))
    except ProxyConfigError as e:
        print(f"mcpctl proxy-config: {e}", file=sys.stderr)
        return e.code
    return 0
