"""Every mcpctl flag and sub-command says what it is for; `mcpctl --help` fits one screen."""
import argparse

from mcp26.mesh.cli import GROUPS, build_parser


def _missing(parser, path):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                if not helps.get(name):
                    yield f"{path} {name}"
                yield from _missing(sub, f"{path} {name}")
        elif not action.help and not isinstance(action, argparse._HelpAction):
            yield f"{path} {'/'.join(action.option_strings) or action.dest}"


def test_every_flag_has_help():
    assert list(_missing(build_parser(), "mcpctl")) == []


def test_top_level_help_is_grouped_and_one_screen():
    text = build_parser().format_help()
    assert len(text.splitlines()) <= 40
    for title, names in GROUPS:
        assert f"{title}:" in text
    for name in ("route", "proxy-config", "proxy-status", "validate", "xds"):
        assert f"\n  {name} " in text
