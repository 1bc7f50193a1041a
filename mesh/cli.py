"""`mcpctl`: one command line for every part of the mesh.

Each part registers its own sub-commands through the `mcp26.mcpctl` entry
point group (see pyproject.toml), so this module imports no other part.
A registrar is `register(subparsers)`; it adds parsers whose `func(args)`
returns the exit code.
"""
from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points


# `mcpctl --help` lists commands by what a user wants to do. Names only: the
# parts register the commands themselves, so one not listed here (a new part)
# still shows, under "Other".
GROUPS = (
    ("Check and author config", ("validate", "analyze", "route")),
    ("Run the mesh", ("xds", "envoy", "serve", "model", "epp", "console", "demo", "version")),
    ("Scheduling: the decision loop and its policies", ("scheduler", "policy")),
    ("Inspect running proxies", ("proxy-status", "proxy-config")),
    ("Network QoS (eBPF) and the Wasm filter", ("bpf", "wasm")),
)


class _Parser(argparse.ArgumentParser):
    """The top-level parser: a one-screen help with the commands grouped."""

    def format_help(self) -> str:
        commands = {}
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                commands = {a.dest: a.help or "" for a in action._choices_actions}
        width = max((len(n) for n in commands), default=0) + 2
        lines = [self.format_usage().rstrip(), "", self.description or "", ""]
        for title, names in GROUPS + (("Other", tuple(sorted(set(commands) - {n for _, g in GROUPS for n in g}))),):
            names = [n for n in names if n in commands]
            if names:
                lines.append(f"{title}:")
                lines += [f"  {n.ljust(width)}{commands[n]}" for n in names]
                lines.append("")
        lines.append("Run `mcpctl COMMAND --help` for a command's flags.")
        return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mcpctl", description="MCP Mesh control tool: an Istio-compatible mesh for model serving")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("version", help="print the mcp26-mesh version").set_defaults(func=_version)
    for ep in sorted(entry_points(group="mcp26.mcpctl"), key=lambda e: e.name):
        try:
            register = ep.load()
        except ImportError as e:  # one broken part must not take the others down
            print(f"mcpctl: sub-command {ep.name!r} unavailable: {e}", file=sys.stderr)
            continue
        register(sub)
    return parser


def _version(args) -> int:
    from importlib.metadata import PackageNotFoundError, version
    try:
        v = version("mcp26-mesh")
    except PackageNotFoundError:
        v = "unknown (not installed)"
    print(f"mcpctl {v} (python {sys.version.split()[0]})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
