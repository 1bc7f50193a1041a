"""`mcpctl demo`: its flags, running the steps, the summary table, --serve.

Each step runs in turn (demo.steps.discover()); a step that raises stops the
demo there and fails it, with its reason. Whatever happens (a failed check,
an exception, Ctrl-C, SIGTERM) every process the demo started is stopped.
With --serve, after the checks everything keeps running and the URLs are
printed until Ctrl-C / SIGTERM.
"""
from __future__ import annotations

import signal
import threading

from mcp26.demo.framework import GATEWAY_NODE, MANIFESTS, Check, Demo
from mcp26.mesh import cli_context
from mcp26.demo.steps import discover


def _urls(demo: Demo) -> list[tuple[str, str]]:
    return [("gateway (reviews)", f"http://127.0.0.1:{demo.gateway_port}/reviews"),
            *demo.urls.items(),
            ("xDS admin", f"http://127.0.0.1:{demo.admin_port}/debug/syncz"),
            ("Envoy admin", f"http://127.0.0.1:{demo.envoy_admin_port}/")]


def inspect_commands(demo: Demo) -> list[str]:
    """The commands that inspect the running demo, as an operator types them."""
    commands = ["mcpctl proxy-status",
                "mcpctl proxy-config routes " + GATEWAY_NODE,
                "mcpctl proxy-config clusters " + GATEWAY_NODE + f" --envoy-admin 127.0.0.1:{demo.envoy_admin_port}",
                "mcpctl version",
                f"mcpctl analyze {demo.config_dir}",
                f"curl -s http://127.0.0.1:{demo.admin_port}/metrics | grep -E '^(pilot_|xds_config)'"]
    picker = demo.urls.get("endpoint picker stats")     # the inference-gateway step's picker
    if picker:
        commands += [f"mcpctl console --port 15101 --picker {picker.removesuffix('/stats')}",
                     f"curl -s {picker.removesuffix('/stats')}/metrics | grep -E '^inference_'"]
    return commands


def _serve(demo: Demo, stop: threading.Event) -> None:
    """--serve: keep every part running, print where to reach them and how to inspect them
    (the context file names this control plane), until Ctrl-C or SIGTERM."""
    print("\nserving (Ctrl-C or SIGTERM stops every process):")
    for name, url in _urls(demo):
        print(f"  {name:<22} {url}")
    print(f"  work dir {demo.workdir} (logs, watched config: {demo.config_dir})")
    try:
        path = cli_context.write_context(f"127.0.0.1:{demo.admin_port}", "mcpctl demo --serve",
                                         {"configDir": str(demo.config_dir)})
        print(f"\ninspect it (the context file {path} names this control plane):")
    except (OSError, cli_context.ContextError) as e:
        print(f"\ninspect it (no context file: {e}; add --control-plane 127.0.0.1:{demo.admin_port}):")
    for command in inspect_commands(demo):
        print(f"  {command}")
    print(flush=True)
    reported: set[str] = set()
    while not stop.wait(1.0):
        for p in demo.exited():
            if p.name not in reported:
                reported.add(p.name)
                print(f"  {p.name} exited {p.proc.returncode}:\n{p.log_tail()}", flush=True)
    cli_context.remove_context()          # it named this demo's control plane, which now stops
    print("stopping...", flush=True)


def _summary(checks: list[tuple[str, Check]]) -> None:
    rows = [("step", "check", "expected", "observed", "")] + [
        (s, c.name, c.expected, c.observed, "ok" if c.ok else "FAIL") for s, c in checks]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    print()
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())


def run(args) -> int:
    steps = discover()
    demo = Demo(args)
    checks: list[tuple[str, Check]] = []
    failed_step = None
    stop = threading.Event()
    serving = False

    def on_signal(signum, frame):
        if args.serve and serving:
            stop.set()                     # --serve: leave the wait, then stop everything
        else:
            raise KeyboardInterrupt        # during the steps: stop everything (finally) and exit
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, on_signal)
        except ValueError:                 # not the main thread: leave the handlers alone
            pass
    try:
        try:
            for i, step in enumerate(steps, 1):
                print(f"[{i}/{len(steps)}] {step.name}", flush=True)
                try:
                    results = step.run(demo)
                except Exception as e:  # a step that cannot run fails the demo, with its reason
                    failed_step = step.name
                    reason = f"{type(e).__name__}: {e}"
                    print(f"  {reason}")
                    checks.append((step.name, Check(step.name, "runs", reason.splitlines()[0], False)))
                    for p in demo.exited():
                        print(f"  {p.name} exited {p.proc.returncode}:\n{p.log_tail()}")
                    break
                checks.extend((step.name, c) for c in results)
            _summary(checks)
            ok = all(c.ok for _, c in checks) and failed_step is None
            print(f"\ndemo {'passed' if ok else 'FAILED'}: {sum(c.ok for _, c in checks)}/{len(checks)} checks"
                  + (f" (stopped at: {failed_step})" if failed_step else ""), flush=True)
            if args.serve:
                serving = True
                _serve(demo, stop)
        except KeyboardInterrupt:
            print("\ninterrupted: stopping every process", flush=True)
            return 130
        finally:
            demo.stop_all()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0 if ok else 1


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="run the mesh end to end and show what went where")
    p.add_argument("--manifests", default=str(MANIFESTS),
                   help="the demo's manifests (config/ and steps/; default: the installed demo/manifests)")
    p.add_argument("--delta", action="store_true", help="the gateway uses Delta xDS")
    p.add_argument("--xds-port", type=int, default=18000, help="control plane ADS port (default 18000)")
    p.add_argument("--admin-port", type=int, default=18001, help="control plane admin port (default 18001)")
    p.add_argument("--gateway-port", type=int, default=18080, help="the gateway Envoy's HTTP port (default 18080)")
    p.add_argument("--envoy-admin-port", type=int, default=15000, help="the gateway Envoy's admin port (default 15000)")
    p.add_argument("--upstream-port", type=int, default=18081, help="v1's port; v2 and v3 follow")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, config)")
    p.add_argument("--serve", action="store_true",
                   help="after the checks keep everything running (control plane, Envoy, backend, console) and "
                        "print the URLs, until Ctrl-C / SIGTERM")
    p.set_defaults(func=run)
