"""Every mcpctl flag and sub-command says what it is for, and `--help` prints it;
`mcpctl --help` fits one screen; `mcpctl` alone is help, not an error."""
import argparse
import re

import pytest

from mcp26.mesh import cli
from mcp26.mesh.cli import GROUPS, build_parser


def _commands(parser, path=("mcpctl",)):
    """(path, parser) for every command and sub-command, the top level included."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def _missing(parser, path):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            helps.update({n: helps[a] for a, p in action.choices.items() if a in helps     # aliases
                          for n, q in action.choices.items() if q is p})
            for name, sub in action.choices.items():
                if not helps.get(name):
                    yield f"{path} {name}"
                yield from _missing(sub, f"{path} {name}")
        elif not action.help and not isinstance(action, argparse._HelpAction):
            yield f"{path} {'/'.join(action.option_strings) or action.dest}"


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def test_every_flag_has_help():
    assert list(_missing(build_parser(), "mcpctl")) == []


def test_every_command_help_prints_each_flag_and_its_help():
    """The rendered `mcpctl ... --help` of every command shows each of its flags with its
    help line (whitespace aside: argparse wraps to the terminal)."""
    problems = []
    checked = 0
    for path, parser in _commands(build_parser()):
        if len(path) == 1:
            continue                     # the grouped top-level page: tested below
        text = parser.format_help()
        flat = _squash(text)
        formatter = parser._get_formatter()
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if action.help == argparse.SUPPRESS:
                continue
            names = action.option_strings or [action.metavar or action.dest]
            for name in names:
                if _squash(name) not in flat:
                    problems.append(f"{' '.join(path)}: {name} not in --help")
            helptext = formatter._expand_help(action)
            if _squash(helptext) not in flat:
                problems.append(f"{' '.join(path)}: help of {names[0]} not in --help")
            checked += 1
    assert problems == []
    assert checked > 150                 # every part's commands were walked


def test_sub_command_help_describes_it_and_keeps_usage_short():
    parser = build_parser()
    serve = dict((p[-1], q) for p, q in _commands(parser) if p[:2] == ("mcpctl", "serve"))["serve"]
    text = serve.format_help()
    assert text.startswith("usage: mcpctl serve [flags]\n")
    assert "--max-batch" in text and "flags:" in text
    assert "Run `mcpctl COMMAND --help`" not in text


def test_top_level_help_is_grouped_and_one_screen():
    text = build_parser().format_help()
    assert len(text.splitlines()) <= 40
    for title, names in GROUPS:
        assert f"{title}:" in text
    for name in ("route", "proxy-config", "proxy-status", "validate", "xds", "version", "completion"):
        assert f"\n  {name} " in text
    assert "(alias pc)" in text and "(alias ps)" in text


def test_no_arguments_prints_help_and_exits_0(capsys):
    assert cli.main([]) == 0
    assert "Inspect running proxies:" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["proxy-status", "--help"], ["serve", "--help"], ["xds", "serve", "--help"]])
def test_help_exits_0_with_the_flags(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 0
    assert "flags:" in capsys.readouterr().out
