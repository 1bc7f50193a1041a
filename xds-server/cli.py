"""`mcpctl xds serve`, `mcpctl envoy bootstrap|run`, `mcpctl proxy-status`."""
from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import logging
import os
import signal
import sys
import tempfile
import urllib.error
import urllib.request

from mcp26.mesh import cli_context
from mcp26.mesh.cli_output import add_output_flag, render
from mcp26.serving.grpc import frontends
from mcp26.serving.executables import executable


STREAM_IDLE_ENV = "MCP_XDS_STREAM_IDLE_TIMEOUT"


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1 or `localhost`: what only this host can reach."""
    if address.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False          # another host name: may resolve to anything


def _labels(values: list[str] | None) -> dict:
    out = {}
    for v in values or []:
        key, sep, val = v.partition("=")
        if not sep or not key:
            raise SystemExit(f"--label must be KEY=VALUE, got {v!r}")
        out[key] = val
    return out


def register(subparsers) -> None:
    xds = subparsers.add_parser("xds", help="the xDS control plane")
    xsub = xds.add_subparsers(dest="xds_command", metavar="COMMAND", required=True)
    serve = xsub.add_parser("serve", help="serve ADS (SotW and Delta) from a watched config directory or the Kubernetes API")
    source = serve.add_mutually_exclusive_group(required=True)
    source.add_argument("--config-dir", help="the watched directory of YAML (Istio resources, WasmPlugins, ...)")
    source.add_argument("--kubeconfig", help="read the config from the Kubernetes API server this kubeconfig names "
                                             "(list and watch, as istiod does)")
    source.add_argument("--in-cluster", action="store_true",
                        help="read the config from the Kubernetes API server of the Pod this runs in (its service account)")
    serve.add_argument("--kube-context", default=None, help="the kubeconfig context (default: its current one)")
    serve.add_argument("--namespace", default=None,
                       help="with the API server: the control plane's own namespace (its status Lease; default "
                            "$POD_NAMESPACE, else the service account's, else mcp-mesh)")
    serve.add_argument("--no-status", action="store_true",
                       help="with the API server: write no status (Gateway API conditions, validationMessages)")
    serve.add_argument("--webhook-port", type=int, default=0,
                       help="with the API server and --ca-dir: serve the validating admission webhook over TLS on "
                            "this port (istiod: 15017; default 0, off)")
    serve.add_argument("--webhook-host", action="append", default=None,
                       help="a DNS name for the webhook's certificate (repeatable; default mcp-mesh-xds.NAMESPACE.svc)")
    serve.add_argument("--secure-port", type=int, default=0,
                       help="with the API server and --ca-dir: ADS over TLS on this port for proxies that send a "
                            "ServiceAccount token (checked by TokenReview; istiod: 15012; default 0, off)")
    serve.add_argument("--secure-address", default="0.0.0.0", help="where --secure-port and --webhook-port listen")
    serve.add_argument("--token-audience", default="mcp-mesh",
                       help="the audience proxies' ServiceAccount tokens must be bound to (default mcp-mesh)")
    serve.add_argument("--webhook-configuration", default="mcp-mesh-validator",
                       help="the ValidatingWebhookConfiguration whose caBundle this keeps equal to the mesh CA's root")
    serve.add_argument("--port", type=int, default=18000, help="ADS gRPC port")
    serve.add_argument("--admin-port", type=int, default=18001, help="admin HTTP port")
    serve.add_argument("--address", default="127.0.0.1",
                       help="where ADS and admin listen; both are unauthenticated, so loopback only "
                            "unless --allow-remote")
    serve.add_argument("--allow-remote", action="store_true",
                       help="allow a non-loopback --address (anyone who reaches these ports can subscribe as any "
                            "proxy over ADS and read its config, header-contract session key included)")
    serve.add_argument("--stream-idle-timeout", type=float, default=None,
                       help="seconds a proxied HTTP stream may stay idle before Envoy answers and releases "
                            f"it (HCM stream_idle_timeout; default 300, or ${STREAM_IDLE_ENV}; 0: off, as istiod)")
    serve.add_argument("--grpc-frontend", default=frontends.LANE, choices=frontends.GRPC_FRONTENDS,
                       help="fast (default): ADS on serving.grpc.server's HTTP/2 lane, two thirds of grpc.aio's CPU per "
                            "proxy; grpcio: on grpc.aio (xds-server/README.md \"Scale\")")
    serve.add_argument("--debounce-ms", type=int, default=100, help="wait this long after a change before loading it (default 100)")
    _identity_flags(serve)
    serve.add_argument("--test-hooks", action="store_true", help="enable POST /debug/inject (tests only)")
    serve.add_argument("--log-level", default="info", help="debug, info, warning or error (default info)")
    serve.add_argument("--write-context", action="store_true",
                       help="once serving, write the mcpctl context file ($MCPCTL_CONTEXT or "
                            "~/.config/mcpctl/context.yaml) naming this admin address, so that proxy-status, "
                            "proxy-config, console and version find it without --control-plane; removed at a clean stop (Ctrl-C)")
    serve.set_defaults(func=_serve)

    envoy = subparsers.add_parser("envoy", help="run Envoy attached to the control plane")
    esub = envoy.add_subparsers(dest="envoy_command", metavar="COMMAND", required=True)
    for name, func, helptext in (("bootstrap", _bootstrap, "print an Envoy bootstrap YAML for ADS"),
                                 ("run", _run_envoy, "run .venv/bin/envoy with that bootstrap")):
        p = esub.add_parser(name, help=helptext)
        p.add_argument("--node-id", required=True,
                       help="the Envoy node id; router~IP~NAME.NS~NS.svc.cluster.local makes a gateway, sidecar~... a sidecar")
        p.add_argument("--cluster", default="", help="the Envoy node cluster (service-cluster; default: the node id)")
        p.add_argument("--xds-address", required=True, help="HOST:PORT of the ADS server")
        p.add_argument("--admin-port", type=int, default=15000, help="Envoy's admin port on 127.0.0.1 (default 15000)")
        p.add_argument("--delta", action="store_true", help="Delta xDS instead of state of the world")
        p.add_argument("--label", action="append", help="node label KEY=VALUE (repeatable)")
        p.add_argument("--namespace", default="", help="the proxy's namespace (node metadata NAMESPACE; default: from the node id)")
        p.add_argument("--service-account", default="",
                       help="the workload's service account (node metadata SERVICE_ACCOUNT; its SPIFFE identity is "
                            "spiffe://TRUST_DOMAIN/ns/NAMESPACE/sa/SERVICE_ACCOUNT; default: default)")
        p.add_argument("--ca-dir", default="",
                       help="the control plane's --ca-dir: write this node's bootstrap token (IDENTITY_TOKEN), "
                            "without which it is issued no workload certificate")
        p.add_argument("--xds-ca-file", default="",
                       help="reach ADS over TLS (the control plane's --secure-port), checking it against this root CA")
        p.add_argument("--xds-server-name", default="",
                       help="the name the control plane's certificate must carry (SNI too), e.g. mcp-mesh-xds.mcp-mesh.svc")
        p.add_argument("--token-file", default="",
                       help="a ServiceAccount token (projected, audience mcp-mesh) sent on the ADS stream; read once, "
                            "when the bootstrap is written")
        if name == "run":
            p.add_argument("--log-level", default="warning", help="Envoy's log level (default warning)")
            p.add_argument("--bootstrap-path", help="where to write the bootstrap (default: a temp file)")
            p.add_argument("--session-key-file",
                           help="the header contract's session key (raw bytes, as `mcpctl serve --session-key-file`; "
                                "mode 0600): put into Envoy's environment, never into its config, for a WasmPlugin "
                                "with pluginConfig.sessionKeyFrom: {env: NAME}")
            p.add_argument("--session-key-env", default=None,
                           help="the environment variable that carries it (default MCP_SESSION_KEY)")
            p.add_argument("envoy_args", nargs=argparse.REMAINDER, help="passed to envoy after --")
        p.set_defaults(func=func)

    ps = subparsers.add_parser("proxy-status", aliases=["ps"],
                               help="per proxy and type: SYNCED, STALE, NACKED; a rejected change set",
                               description="Each connected proxy's sync state per xDS type, as istioctl proxy-status, "
                                           "then each NACK and a change set the control plane rejected whole (it "
                                           "keeps serving the last good one). Exit 0: all well; 1: the control plane "
                                           "is unreachable; 3: a change set was rejected or a proxy NACKed.")
    cli_context.add_control_plane_flag(ps, legacy=("--admin-address",))
    add_output_flag(ps, ("table",), legacy_json=True, what="json and yaml print /debug/syncz")
    ps.set_defaults(func=_proxy_status)


def _serve(args) -> int:
    from mcp26.xds.server import XdsServer
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not is_loopback(args.address) and not args.allow_remote:
        print(f"mcpctl xds serve: refusing --address {args.address}: ADS and the admin port have no "
              "authentication (the admin port shows every proxy's config); keep them on loopback or a "
              "node-local address reachable only by the proxies, and pass --allow-remote to bind it anyway",
              file=sys.stderr)
        return 2
    options = translate_options(args)
    if options is None:
        print(f"mcpctl xds serve: the stream idle timeout must be a finite number of seconds >= 0 (0: off), "
              f"from --stream-idle-timeout or ${STREAM_IDLE_ENV}", file=sys.stderr)
        return 2
    if args.config_dir is not None and not os.path.isdir(args.config_dir):
        print(f"mcpctl xds serve: config directory {args.config_dir!r} does not exist", file=sys.stderr)
        return 2
    if args.kubeconfig and not os.path.isfile(args.kubeconfig):
        print(f"mcpctl xds serve: kubeconfig {args.kubeconfig!r} does not exist", file=sys.stderr)
        return 2
    try:
        identity = _identity(args)
    except ValueError as e:
        print(f"mcpctl xds serve: {e}", file=sys.stderr)
        return 2

    async def main() -> None:
        source = None
        if args.config_dir is None:
            from mcp26.mesh.kube_source import KubeApi, KubeSource, api_client
            source = KubeSource(KubeApi(await api_client(args.kubeconfig, args.kube_context)),
                                debounce=args.debounce_ms / 1000)
        server = XdsServer(args.config_dir or "", port=args.port, admin_port=args.admin_port, address=args.address,
                           debounce=args.debounce_ms / 1000, test_hooks=args.test_hooks, identity=identity,
                           grpc_frontend=args.grpc_frontend, options=options, source=source)
        control = None
        if source is not None:
            from mcp26.xds.kube_control import KubeControl, pod_namespace
            control = KubeControl(server, source.api, args.namespace or pod_namespace(), status=not args.no_status,
                                  webhook_port=args.webhook_port, webhook_hosts=tuple(args.webhook_host or ()),
                                  webhook_configuration=args.webhook_configuration,
                                  webhook_address=args.secure_address, secure_port=args.secure_port,
                                  secure_address=args.secure_address, token_audience=args.token_audience)
        await server.start()
        # SIGTERM (a Pod's stop, systemd) stops as Ctrl-C does: the Lease released, the context
        # file removed, the streams closed; its default action ended the process on the spot
        terminated = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, terminated.set)
        try:
            if control is not None:
                await control.start()
            if args.write_context:
                _write_context(server, args)
            waiting = [asyncio.ensure_future(server.wait()), asyncio.ensure_future(terminated.wait())]
            try:
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in waiting:
                    task.cancel()
        finally:
            if args.write_context:
                cli_context.remove_context()
            if control is not None:
                await control.stop()
            await server.stop()
    try:
        asyncio.run(main())
    except (OSError, cli_context.ContextError) as e:
        print(f"mcpctl xds serve: {e}", file=sys.stderr)
        return 1
    except ValueError as e:           # bad options, and mesh.kube_source.KubeConfigError
        print(f"mcpctl xds serve: {e}", file=sys.stderr)
        return 2
    return 0


def _write_context(server, args) -> None:
    """The context file naming this control plane's admin port, for proxy-status, console, version."""
    host = server.address if ":" not in server.address else f"[{server.address}]"
    source = ({"configDir": os.path.abspath(args.config_dir)} if args.config_dir is not None
              else {"kubeconfig": args.kubeconfig or "in-cluster"})
    path = cli_context.write_context(f"{host}:{server.admin_port}", "mcpctl xds serve", source)
    logging.getLogger("xds").info("wrote the mcpctl context %s", path)


def translate_options(args, environ=os.environ):
    """The TranslateOptions of `xds serve`'s flags (--stream-idle-timeout, else
    $MCP_XDS_STREAM_IDLE_TIMEOUT, else the default); None for a bad timeout."""
    from mcp26.xds.translate.options import DEFAULT_STREAM_IDLE_TIMEOUT_S, TranslateOptions
    idle = args.stream_idle_timeout
    try:
        idle = float(environ.get(STREAM_IDLE_ENV) or DEFAULT_STREAM_IDLE_TIMEOUT_S) if idle is None else idle
        return TranslateOptions(stream_idle_timeout_s=idle)
    except ValueError:          # not a number, negative (TranslateOptions), or nan
        return None


def _identity_flags(serve) -> None:
    serve.add_argument("--ca-dir", default="",
                       help="the mesh CA's state directory (root generated at first start, files 0600; the "
                            "node-token key). Without it no workload certificates are issued")
    serve.add_argument("--ca-cert", default="", help="an operator's CA certificate (chain up to the root), PEM: "
                                                     "Istio's plugged-in CA (with --ca-key and --ca-dir)")
    serve.add_argument("--ca-key", default="", help="the key of --ca-cert, PEM")
    serve.add_argument("--trust-domain", default="cluster.local", help="SPIFFE trust domain (default cluster.local)")
    serve.add_argument("--workload-cert-ttl", default="24h",
                       help="workload certificate lifetime, e.g. 24h, 90m, 30s (default 24h); re-issued at half")


def _identity(args):
    """The SDS identity service from the serve flags (ValueError: a bad flag or CA state)."""
    from mcp26.xds.sds import IdentityService
    from mcp26.mesh.validation.schema import duration_ns
    ns = duration_ns(args.workload_cert_ttl)
    if not ns or ns < 1_000_000_000:
        raise ValueError(f"--workload-cert-ttl must be a duration of at least 1s, got {args.workload_cert_ttl!r}")
    ca = None
    if args.ca_cert or args.ca_key or args.ca_dir:
        if not args.ca_dir:
            raise ValueError("--ca-cert/--ca-key need --ca-dir too (it holds the node-token key)")
        from mcp26.xds.ca import CAError, MeshCA   # cryptography: ~9 MB resident, only with a CA
        try:
            ca = MeshCA.load_or_create(args.ca_dir, args.trust_domain, args.ca_cert, args.ca_key)
        except (CAError, OSError) as e:
            raise ValueError(f"mesh CA: {e}") from None
    return IdentityService(ca, ns / 1e9)


def _bootstrap_text(args) -> str:
    from mcp26.xds.bootstrap import bootstrap_yaml, node_namespace
    token = ""
    if args.ca_dir:
        from mcp26.xds.ca import CAError, node_token_from_dir
        try:
            token = node_token_from_dir(args.ca_dir, args.node_id, node_namespace(args.node_id, args.namespace),
                                        args.service_account or "default")
        except CAError as e:
            raise ValueError(str(e)) from None
    bearer = ""
    if args.token_file:
        try:
            with open(args.token_file) as f:
                bearer = f.read().strip()
        except OSError as e:
            raise ValueError(f"--token-file {args.token_file}: {e.strerror}") from None
        if not bearer or any(c.isspace() for c in bearer):
            raise ValueError(f"--token-file {args.token_file}: not a token")
    return bootstrap_yaml(node_id=args.node_id, cluster=args.cluster, xds_address=args.xds_address,
                          admin_port=args.admin_port, delta=args.delta, labels=_labels(args.label),
                          namespace=args.namespace, service_account=args.service_account,
                          identity_token=token, ca_file=args.xds_ca_file, server_name=args.xds_server_name,
                          token=bearer)


def _bootstrap(args) -> int:
    try:
        sys.stdout.write(_bootstrap_text(args))
    except ValueError as e:
        print(f"mcpctl envoy bootstrap: {e}", file=sys.stderr)
        return 2
    return 0


def _run_envoy(args) -> int:
    try:
        text = _bootstrap_text(args)
    except ValueError as e:
        print(f"mcpctl envoy run: {e}", file=sys.stderr)
        return 2
    if args.bootstrap_path:
        path = args.bootstrap_path
        with open(path, "w") as f:
            f.write(text)
    else:
        fd, path = tempfile.mkstemp(prefix="envoy-bootstrap-", suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            f.write(text)
    env = dict(os.environ)
    if args.session_key_file:
        try:
            env.update(session_key_environ(args.session_key_file, args.session_key_env))
        except (OSError, ValueError) as e:
            print(f"mcpctl envoy run: {e}", file=sys.stderr)
            return 2
    elif args.session_key_env:
        print("mcpctl envoy run: --session-key-env needs --session-key-file", file=sys.stderr)
        return 2
    extra = [a for a in (args.envoy_args or []) if a != "--"]
    argv = [executable("envoy"), "-c", path, "--disable-hot-restart", "-l", args.log_level, *extra]
    sys.stdout.flush()
    os.execve(argv[0], argv, env)   # Envoy replaces us: signals reach it directly


def session_key_environ(path: str, name: str | None = None) -> dict[str, str]:
    """{NAME: lower-case hex of the key in `path`}: what the header-contract filter
    reads through host_env_keys (sessionKeyFrom.env). The file holds the raw key,
    as the backend's --session-key-file, and must be readable by its owner only."""
    import re
    import stat
    from mcp26.mesh.header_contract import DEFAULT_SESSION_KEY_ENV, MAX_KEY_BYTES
    from mcp26.mesh.session import MIN_KEY_BYTES
    name = name or DEFAULT_SESSION_KEY_ENV
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", name):
        raise ValueError(f"--session-key-env {name!r} is not an environment variable name")
    fd = os.open(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(f.fileno()).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ValueError(f"--session-key-file {path}: mode {stat.S_IMODE(mode):04o}; the key must be "
                             f"readable by its owner only (chmod 600)")
        key = f.read().strip()
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise ValueError(f"--session-key-file {path}: the key has {len(key)} bytes; "
                         f"expected {MIN_KEY_BYTES}..{MAX_KEY_BYTES}")
    return {name: key.hex()}


def _proxy_status(args) -> int:
    from mcp26.xds.sync import format_proxy_status
    from mcp26.xds.sync import bad_news
    base, source = cli_context.resolve(args)
    try:
        syncz = _get_json(f"{base}/debug/syncz")
        configz = _get_json(f"{base}/debug/configz")
    except (urllib.error.URLError, OSError, ValueError) as e:
        print(f"mcpctl proxy-status: cannot reach the control plane admin at {base} ({source}): "
              f"{getattr(e, 'reason', None) or e}", file=sys.stderr)
        return 1
    if args.output == "table":
        print(format_proxy_status(syncz, configz))
    else:
        sys.stdout.write(render({"proxies": syncz, "config": {k: configz.get(k) for k in (
            "config_dir", "generation", "applied_at", "resources", "rejected", "held")}}, args.output))
    return EXIT_BAD_NEWS if bad_news(syncz, configz) else 0


EXIT_BAD_NEWS = 3      # proxy-status: a change set was rejected whole, or a proxy NACKed


def _get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())
