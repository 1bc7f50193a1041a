"""`-o/--output` for every mcpctl command, as kubectl and istioctl spell it.

A command adds the flag with `add_output_flag` and prints through `render`:
`-o json` and `-o yaml` are the same data, so a script can use either; the
first choice (a table or text) is the command's default human format. Where a
command had `--json`, it stays as a deprecated alias of `-o json` (its help
says so) so that scripts written against it keep working.
"""
from __future__ import annotations

import argparse
import json

import yaml

MACHINE_FORMATS = ("json", "yaml")


def add_output_flag(parser: argparse.ArgumentParser, human: tuple[str, ...] = ("table",),
                    legacy_json: bool = False, what: str = "") -> None:
    """-o HUMAN|json|yaml (default: the first human format); with legacy_json, --json too."""
    choices = (*human, *MACHINE_FORMATS)
    parser.add_argument("-o", "--output", choices=choices, default=human[0], metavar="FORMAT",
                        help=f"{'|'.join(choices)} (default {human[0]})" + (f": {what}" if what else ""))
    if legacy_json:
        parser.add_argument("--json", dest="output", action="store_const", const="json",
                            help="deprecated: use -o json")


def render(data, fmt: str) -> str:
    """`data` as json or yaml text, ending in a newline."""
    if fmt == "json":
        return json.dumps(data, indent=1, sort_keys=False, default=str) + "\n"
    if fmt == "yaml":
        return yaml.safe_dump(_plain(data), sort_keys=False, default_flow_style=False, allow_unicode=True)
    raise ValueError(f"not a machine format: {fmt!r} (expected one of {', '.join(MACHINE_FORMATS)})")


def _plain(data):
    """Tuples as lists and other values as JSON would write them, so safe_dump takes anything json does."""
    return json.loads(json.dumps(data, default=str))
