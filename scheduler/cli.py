"""`mcpctl epp serve`: the Endpoint Picker; `mcpctl policy build|run`: policy plugins (scheduler/README.md)."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from mcp26.serving.grpc import frontends


def register(subparsers) -> None:
    from mcp26.scheduler.plugins.commands import register_policy
    register_policy(subparsers)          # `mcpctl policy`: registered here, no entry point of its own
    p = subparsers.add_parser("epp", help="the Endpoint Picker for an InferencePool (Gateway API Inference Extension)")
    sub = p.add_subparsers(dest="epp_command", required=True)
    s = sub.add_parser("serve", help="serve Envoy ext_proc: pick a model server per request from live metrics")
    where = s.add_mutually_exclusive_group(required=True)
    where.add_argument("--config-dir",
                       help="the watched directory the control plane reads (InferencePool, WorkloadEntries, "
                            "InferenceObjectives)")
    where.add_argument("--kubeconfig", help="read the pool, its Pods and InferenceObjectives from the Kubernetes "
                                            "API server this kubeconfig names (list and watch, the pool's namespace)")
    where.add_argument("--in-cluster", action="store_true",
                       help="read them from the API server of the Pod this runs in (its service account)")
    s.add_argument("--kube-context", default=None, help="the kubeconfig context (default: its current one)")
    s.add_argument("--pool", required=True, help="the InferencePool to serve, NAMESPACE/NAME")
    s.add_argument("--address", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    s.add_argument("--grpc-port", type=int, default=9002, help="ext_proc and gRPC health port (default 9002; 0: any)")
    s.add_argument("--admin-port", type=int, default=0, help="HTTP port of /stats, /metrics and /healthz (default: any free)")
    s.add_argument("--metrics-interval-ms", type=float, default=50.0,
                   help="how often each model server's /metrics is scraped (default 50)")
    s.add_argument("--flow-marks", metavar="PATH",
                   help="the flows the decision loop marked latency-critical (`mcpctl scheduler run --flow-marks "
                        "PATH`, scheduler/loop/marks.py): a request from one is scheduled critical and forwarded "
                        "with x-mcp-qos-class: latency-critical")
    s.add_argument("--session-key-file", metavar="PATH",
                   help="the header contract's session key (raw bytes, mode 0600, as `mcpctl serve --session-key-file`): "
                        "the class of a flow the loop upgraded is re-signed with it, so the model server honours it")
    s.add_argument("--grpc-frontend", default=frontends.LANE, choices=frontends.GRPC_FRONTENDS,
                   help="fast (default): ext_proc and health on serving.grpc.server's HTTP/2 lane; grpcio: on grpc.aio "
                        "(scheduler/README.md: overhead)")
    s.add_argument("--log-level", default="INFO", help="Python log level (default INFO)")
    s.set_defaults(func=_serve)
    from mcp26.scheduler.loop.cli import register as register_loop     # `mcpctl scheduler run|status`
    register_loop(subparsers)


def _serve(args) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.config_dir is not None and not os.path.isdir(args.config_dir):
        print(f"mcpctl epp serve: --config-dir {args.config_dir}: not a directory", file=sys.stderr)
        return 2
    if args.kubeconfig and not os.path.isfile(args.kubeconfig):
        print(f"mcpctl epp serve: kubeconfig {args.kubeconfig!r} does not exist", file=sys.stderr)
        return 2
    if "/" not in args.pool:
        print(f"mcpctl epp serve: --pool {args.pool!r}: expected NAMESPACE/NAME", file=sys.stderr)
        return 2
    key = None
    if args.session_key_file:
        from mcp26.mesh.session import read_key_file
        try:
            key = read_key_file(args.session_key_file)
        except (OSError, ValueError) as e:
            print(f"mcpctl epp serve: {e}", file=sys.stderr)
            return 2
    from mcp26.scheduler.server import serve

    async def main():
        kube_api = None
        if args.config_dir is None:
            from mcp26.mesh.kube_source import KubeApi, api_client
            kube_api = KubeApi(await api_client(args.kubeconfig, args.kube_context))
        task = asyncio.create_task(serve(args.config_dir, args.pool, args.grpc_port, args.admin_port,
                                         args.address, args.metrics_interval_ms, flow_marks=args.flow_marks,
                                         session_key=key, grpc_frontend=args.grpc_frontend, kube_api=kube_api))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            pass

    try:
        asyncio.run(main())
    except OSError as e:
        print(f"mcpctl epp serve: {e}", file=sys.stderr)
        return 1
    except ValueError as e:           # mesh.kube_source.KubeConfigError: the configuration does not load
        print(f"mcpctl epp serve: {e}", file=sys.stderr)
        return 2
    return 0
