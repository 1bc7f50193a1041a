"""mcpctl's istioctl/kubectl conventions: one way to name the control plane (flag, env,
context file), -o json|yaml, `version`, `completion` from argcomplete."""
import json
import os
import subprocess
import sys

import pytest
import yaml

from mcp26.mesh import cli, cli_context
from mcp26.mesh.cli_output import render


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.delenv(cli_context.ENV, raising=False)
    monkeypatch.setenv(cli_context.CONTEXT_ENV, str(tmp_path / "ctx" / "context.yaml"))
    return {cli_context.CONTEXT_ENV: str(tmp_path / "ctx" / "context.yaml")}


@pytest.mark.parametrize("value, expected", [
    ("127.0.0.1:18001", "http://127.0.0.1:18001"),
    ("http://127.0.0.1:18001", "http://127.0.0.1:18001"),
    ("http://localhost:9/", "http://localhost:9"),
    ("[::1]:18001", "http://[::1]:18001"),
])
def test_both_address_forms_are_accepted(value, expected):
    assert cli_context.normalize(value) == expected


@pytest.mark.parametrize("value", ["", "127.0.0.1", "ftp://h:1", "http://h:99999", "h:port", "http://h:1/debug"])
def test_a_bad_address_is_named_with_its_origin(value):
    with pytest.raises(cli_context.ContextError) as e:
        cli_context.normalize(value, "$MCPCTL_CONTROL_PLANE")
    assert "$MCPCTL_CONTROL_PLANE" in str(e.value)


def test_flag_beats_env_beats_context_file_beats_default(env):
    assert cli_context.resolve(None, env) == (cli_context.DEFAULT, "default")
    path = cli_context.write_context("127.0.0.1:3", "test", environ=env)
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert cli_context.resolve(None, env) == ("http://127.0.0.1:3", f"context file {path}")
    env2 = {**env, cli_context.ENV: "127.0.0.1:2"}
    assert cli_context.resolve(None, env2)[0] == "http://127.0.0.1:2"
    args = cli.build_parser().parse_args(["--control-plane", "127.0.0.1:1", "proxy-status"])
    assert cli_context.resolve(args, env2)[0] == "http://127.0.0.1:1"


def test_control_plane_flag_before_or_after_the_command():
    parser = cli.build_parser()
    before = parser.parse_args(["--control-plane", "h:1", "proxy-status"])
    after = parser.parse_args(["proxy-status", "--control-plane", "h:2"])
    legacy = parser.parse_args(["proxy-status", "--admin-address", "h:3"])
    console = parser.parse_args(["console", "--xds-admin", "http://h:4"])
    loop = parser.parse_args(["scheduler", "run", "--config-dir", ".", "--pool", "a/b", "--control-plane-admin", "h:5"])
    assert [before.control_plane, after.control_plane, legacy.control_plane, console.control_plane,
            loop.control_plane] == ["h:1", "h:2", "h:3", "http://h:4", "h:5"]


def test_every_command_that_talks_to_the_control_plane_takes_control_plane():
    parser = cli.build_parser()
    for argv in (["proxy-status"], ["proxy-config", "clusters", "n"], ["console"], ["version"],
                 ["scheduler", "run", "--config-dir", ".", "--pool", "a/b"]):
        args = parser.parse_args([*argv, "--control-plane", "http://h:9"])
        assert cli_context.resolve(args, {})[0] == "http://h:9", argv


def test_a_broken_context_file_is_named(env):
    path = env[cli_context.CONTEXT_ENV]
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write("- just\n- a list\n")
    with pytest.raises(cli_context.ContextError, match=f"context file {path}: expected a mapping"):
        cli_context.resolve(None, env)
    with open(path, "w") as f:
        f.write("controlPlane: [1]\n")
    with pytest.raises(cli_context.ContextError, match="controlPlane: expected a string"):
        cli_context.resolve(None, env)


def test_render_json_and_yaml_are_the_same_data():
    data = {"a": (1, 2), "b": {"c": None}}
    assert json.loads(render(data, "json")) == yaml.safe_load(render(data, "yaml")) == {"a": [1, 2], "b": {"c": None}}


def test_version_reports_the_client_and_an_unreachable_control_plane(env, capsys):
    # a port nothing listens on: 127.0.0.1:1
    assert cli.main(["version", "--control-plane", "127.0.0.1:1", "-o", "json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["client"]["version"] == cli.client_version() != "unknown"
    assert out["controlPlane"]["address"] == "http://127.0.0.1:1"
    assert "unreachable (--control-plane)" in out["controlPlane"]["error"]
    assert cli.main(["version", "--short"]) == 0
    assert capsys.readouterr().out.strip() == cli.client_version()


def test_version_alone_prints_the_client_and_succeeds_without_a_control_plane(env, monkeypatch, capsys):
    # The image's default command: nothing named, nothing (here: a dead port) at the default address.
    monkeypatch.setattr(cli_context, "DEFAULT", "http://127.0.0.1:1")
    assert cli.main(["version"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"mcpctl {cli.client_version()} (python {sys.version.split()[0]})", lines
    assert "unreachable (default)" in lines[1], lines


@pytest.mark.parametrize("shell, marker", [("bash", "complete "), ("zsh", "compdef"), ("fish", "complete --command mcpctl")])
def test_completion_scripts(shell, marker, capsys):
    assert cli.main(["completion", shell]) == 0
    text = capsys.readouterr().out
    assert marker in text and "_ARGCOMPLETE" in text


def test_completion_completes_commands_and_flags(tmp_path):
    """What the bash script asks for: the program itself answers with the candidates."""
    out = tmp_path / "out"

    def complete(line):
        environ = {**os.environ, "_ARGCOMPLETE": "1", "_ARGCOMPLETE_SHELL": "bash", "COMP_LINE": line,
                   "COMP_POINT": str(len(line)), "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
                   "_ARGCOMPLETE_IFS": "\n"}
        subprocess.run([sys.executable, "-m", "mcp26.mesh.cli"], env=environ, timeout=60, check=False)
        return [c.strip() for c in out.read_text().split("\n")]

    assert {"proxy-status", "proxy-config"} <= set(complete("mcpctl prox"))
    assert "--control-plane" in complete("mcpctl proxy-status --con")
    assert set(complete("mcpctl completion ")) >= {"bash", "zsh", "fish"}


def test_a_context_is_removed_only_by_the_process_that_wrote_it(env):
    path = cli_context.write_context("127.0.0.1:5", "a test", environ=env)
    with open(path) as f:
        other = {**yaml.safe_load(f), "pid": os.getpid() + 1}        # as another server wrote it
    with open(path, "w") as f:
        yaml.safe_dump(other, f)
    assert cli_context.remove_context(env) is False and os.path.exists(path)
    cli_context.write_context("127.0.0.1:5", "a test", environ=env)
    assert cli_context.remove_context(env) is True and not os.path.exists(path)
    assert cli_context.resolve(None, env) == (cli_context.DEFAULT, "default")
