"""`mcpctl`: one command line for every part of the mesh.

Each part registers its own sub-commands through the `mcpctl.commands` entry
point group (see pyproject.toml), so this module imports no other part.
A registrar is `register(subparsers)`; it adds parsers whose `func(args)`
returns the exit code.
"""
from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mcpctl", description="MCP Mesh control tool")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for ep in sorted(entry_points(group="mcpctl.commands"), key=lambda e: e.name):
        try:
            register = ep.load()
        except ImportError as e:  # one broken part must not take the others down
            print(f"mcpctl: sub-command {ep.name!r} unavailable: {e}", file=sys.stderr)
            continue
        register(sub)
    return parser


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
