"""`mcpctl`: one command line for every part of the mesh.

Each part registers its own sub-commands through the `mcp26.mcpctl` entry
point group (see pyproject.toml), so this module imports no other part.
A registrar is `register(subparsers)`; it adds parsers whose `func(args)`
returns the exit code.

The conventions every command follows (istioctl's and kubectl's):
- `mcpctl COMMAND --help` lists each flag with its help line (`_CommandParser`);
- `-o json|yaml` for machine output (`mesh.cli_output`);
- `--control-plane`, `$MCPCTL_CONTROL_PLANE` or the context file name the
  control plane (`mesh.cli_context`), before or after the command;
- `mcpctl version` and `mcpctl completion bash|zsh|fish` (argcomplete).
"""
from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from importlib.metadata import PackageNotFoundError, entry_points, version as dist_version

import argcomplete

from mcp26.mesh import cli_context
from mcp26.mesh.cli_output import add_output_flag, render

# `mcpctl --help` lists commands by what a user wants to do. Names only: the
# parts register the commands themselves, so one not listed here (a new part)
# still shows, under "Other".
GROUPS = (
    ("Check and author config", ("validate", "analyze", "route")),
    ("Run the mesh", ("xds", "envoy", "serve", "model", "epp", "console", "demo")),
    ("Scheduling: the decision loop and its policies", ("scheduler", "policy")),
    ("Inspect running proxies", ("proxy-status", "proxy-config")),
    ("Network QoS (eBPF), the Wasm filter, devices", ("bpf", "wasm", "devices")),
    ("mcpctl itself", ("version", "completion")),
)
SHELLS = ("bash", "zsh", "fish")
DISTRIBUTION = "mcp26-mesh"


class _Formatter(argparse.HelpFormatter):
    """argparse's help with a short usage line: `mcpctl serve [flags]` and the
    positionals, not every flag twice (they are listed, with their help, below)."""

    def _format_usage(self, usage, actions, groups, prefix):
        if usage is None and any(a.option_strings for a in actions):
            positionals = [a for a in actions if not a.option_strings]
            text = self._format_actions_usage(positionals, [])
            usage = " ".join(p for p in (self._prog, "[flags]", text) if p)
        return super()._format_usage(usage, actions, groups, prefix)


class _Commands(argparse._SubParsersAction):
    """Sub-commands whose parsers are _CommandParsers, described by their help line unless
    they have a description of their own."""

    def add_parser(self, name, **kwargs):
        if kwargs.get("help") and "description" not in kwargs:
            kwargs["description"] = kwargs["help"]
        return super().add_parser(name, **kwargs)


class _CommandParser(argparse.ArgumentParser):
    """Every command's parser: its help lists each flag and what it does."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _Commands)
        self._optionals.title = "flags"

    def add_subparsers(self, **kwargs):
        kwargs.setdefault("parser_class", _CommandParser)
        return super().add_subparsers(**kwargs)


class _Parser(_CommandParser):
    """The top-level parser: a one-screen help with the commands grouped."""

    def format_help(self) -> str:
        commands = {}
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                # an aliased command's metavar is "proxy-status (ps)": its aliases go after its help
                commands = {a.dest: (a.help or "") + (f" (alias {a.metavar.split(' (', 1)[1]}"
                                                      if " (" in (a.metavar or "") else "")
                            for a in action._choices_actions}
        width = max((len(n) for n in commands), default=0) + 2
        lines = [self.format_usage().rstrip(), "", self.description or "", ""]
        for title, names in GROUPS + (("Other", tuple(sorted(set(commands) - {n for _, g in GROUPS for n in g}))),):
            names = [n for n in names if n in commands]
            if names:
                lines.append(f"{title}:")
                lines += [f"  {n.ljust(width)}{commands[n]}" for n in names]
                lines.append("")
        lines.append("Global flags: --control-plane ADDR (or $MCPCTL_CONTROL_PLANE, or the context file)")
        lines.append("Run `mcpctl COMMAND --help` for a command's flags.")
        return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mcpctl", description="MCP Mesh control tool: an Istio-compatible mesh for model serving")
    parser.add_argument("--control-plane", dest="control_plane", default=None, metavar="ADDR",
                        help=cli_context.HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _register_own(sub)
    for ep in sorted(entry_points(group="mcp26.mcpctl"), key=lambda e: e.name):
        try:
            register = ep.load()
        except ImportError as e:  # one broken part must not take the others down
            print(f"mcpctl: sub-command {ep.name!r} unavailable: {e}", file=sys.stderr)
            continue
        register(sub)
    return parser


def _register_own(sub) -> None:
    v = sub.add_parser("version", help="mcpctl's version; the control plane's and its proxies' when reachable")
    v.add_argument("--short", action="store_true", help="the client version only, one line")
    v.add_argument("--remote", action=argparse.BooleanOptionalAction, default=True,
                   help="ask the control plane for its version and its proxies' Envoy versions (default: on)")
    cli_context.add_control_plane_flag(v)
    add_output_flag(v, ("text",))
    v.set_defaults(func=_version)
    c = sub.add_parser("completion", help="print a shell completion script (bash, zsh or fish)",
                       description="Print the completion script for SHELL (argcomplete). Load it with:\n"
                                   "  bash: source <(mcpctl completion bash)\n"
                                   "  zsh:  source <(mcpctl completion zsh)\n"
                                   "  fish: mcpctl completion fish | source",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("shell", choices=SHELLS, metavar="SHELL", help=f"one of {', '.join(SHELLS)}")
    c.set_defaults(func=_completion)


def client_version() -> str:
    try:
        return dist_version(DISTRIBUTION)
    except PackageNotFoundError:       # a checkout run without `make install`
        return "unknown"


def fetch_json(base: str, path: str, timeout: float = 5):
    """GET base+path as JSON (the control plane's admin API)."""
    with urllib.request.urlopen(base + path, timeout=timeout) as r:
        return json.loads(r.read())


def _version(args) -> int:
    out = {"client": {"version": client_version()}}
    if args.short:
        print(out["client"]["version"])
        return 0
    rc = 0
    if args.remote:
        try:
            base, source = cli_context.resolve(args)
        except cli_context.ContextError as e:
            print(f"mcpctl version: {e}", file=sys.stderr)
            return 2
        try:
            remote = fetch_json(base, "/version")
            out["controlPlane"] = {"address": base, "version": remote.get("version", "unknown")}
            out["dataPlane"] = remote.get("proxies", [])
        except (urllib.error.URLError, OSError, ValueError) as e:
            out["controlPlane"] = {"address": base, "error": f"unreachable ({source}): {_reason(e)}"}
            # As istioctl: no control plane at the default address is not an error (a client-only
            # machine, the image's default command); one the user named and cannot reach is.
            rc = 0 if source == "default" else 1
    if args.output != "text":
        sys.stdout.write(render(out, args.output))
        return rc
    print(f"mcpctl {out['client']['version']} (python {sys.version.split()[0]})")
    cp = out.get("controlPlane")
    if cp:
        print(f"control plane version: {cp.get('version') or cp['error']}  ({cp['address']})")
        for p in out.get("dataPlane", []):
            print(f"data plane version: {p['version']} ({p['count']} proxies)")
    return rc


def _reason(e: Exception) -> str:
    return str(getattr(e, "reason", None) or e)


def _completion(args) -> int:
    sys.stdout.write(argcomplete.shellcode(["mcpctl"], shell=args.shell))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argcomplete.autocomplete(parser)     # answers a shell's completion request (and exits); else a no-op
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except cli_context.ContextError as e:
        print(f"mcpctl {args.command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
