"""Which control plane mcpctl talks to: one way to name it.

In order, the first that is set wins:

1. `--control-plane HOST:PORT|URL` (global: before or after the command);
2. `$MCPCTL_CONTROL_PLANE`;
3. the context file, `$MCPCTL_CONTEXT` or `$XDG_CONFIG_HOME/mcpctl/context.yaml`
   (`~/.config/mcpctl/context.yaml`), which `mcpctl xds serve --write-context` and
   `mcpctl demo --serve` write (and remove at a clean stop: a killed one leaves it, and
   commands then name the file in their "unreachable" error);
4. http://127.0.0.1:18001, the control plane's default admin port.

The value is the control plane's *admin* endpoint (/debug/syncz, /metrics, the
console's source), as `HOST:PORT` or `http://HOST:PORT`; both forms are accepted
everywhere, the old `--admin-address` and `--xds-admin` flags included.
"""
from __future__ import annotations

import argparse
import os
import time
import urllib.parse

import yaml

ENV = "MCPCTL_CONTROL_PLANE"
CONTEXT_ENV = "MCPCTL_CONTEXT"
DEFAULT = "http://127.0.0.1:18001"
HELP = (f"the control plane's admin address, HOST:PORT or http://HOST:PORT "
        f"(default: ${ENV}, else the context file, else {DEFAULT})")


class ContextError(ValueError):
    """A control-plane address or context file that cannot be used; the message names it."""


def add_control_plane_flag(parser: argparse.ArgumentParser, legacy: tuple[str, ...] = ()) -> None:
    """--control-plane on a command (and its deprecated old names). The default is SUPPRESS, so a
    value given before the command (`mcpctl --control-plane X proxy-status`) is not overwritten."""
    parser.add_argument("--control-plane", dest="control_plane", default=argparse.SUPPRESS,
                        metavar="ADDR", help=HELP)
    for flag in legacy:
        parser.add_argument(flag, dest="control_plane", default=argparse.SUPPRESS, metavar="ADDR",
                            help="deprecated: use --control-plane")


def normalize(value: str, origin: str = "--control-plane") -> str:
    """`HOST:PORT` or `http(s)://HOST:PORT[/]` as a base URL without a trailing slash."""
    text = value.strip()
    if not text:
        raise ContextError(f"{origin}: empty control-plane address")
    url = text if "://" in text else f"http://{text}"
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
        bad_port = True
    else:
        bad_port = False
    if parts.scheme not in ("http", "https") or not parts.hostname or bad_port or port is None \
            or parts.path.strip("/") or parts.query:
        raise ContextError(f"{origin}: {value!r} is not HOST:PORT or http://HOST:PORT "
                           f"(the control plane's admin port, e.g. 127.0.0.1:18001)")
    return f"{parts.scheme}://{parts.netloc}"


def context_path(environ=os.environ) -> str:
    if environ.get(CONTEXT_ENV):
        return environ[CONTEXT_ENV]
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "mcpctl", "context.yaml")


def read_context(path: str) -> dict:
    """The context file's mapping; {} when there is none."""
    try:
        with open(path) as f:
            data = yaml.safe_load(f.read(65536))
    except FileNotFoundError:
        return {}
    except (OSError, yaml.YAMLError) as e:
        raise ContextError(f"context file {path}: cannot read it: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ContextError(f"context file {path}: expected a mapping with controlPlane, got {type(data).__name__}")
    return data


def write_context(control_plane: str, written_by: str, extra: dict | None = None,
                  environ=os.environ) -> str:
    """Write the context file (mode 0600; replaced atomically) and return its path."""
    path = context_path(environ)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    data = {"controlPlane": normalize(control_plane, written_by), "writtenBy": written_by,
            "writtenAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "pid": os.getpid(),
            **(extra or {})}
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(data, f, sort_keys=False)
    os.replace(tmp, path)
    return path


def remove_context(environ=os.environ) -> bool:
    """Remove the context file if this process wrote it (its pid), as a server that wrote it
    stops: a context naming a stopped control plane would send every later command there."""
    path = context_path(environ)
    try:
        if read_context(path).get("pid") != os.getpid():
            return False
        os.remove(path)
        return True
    except (OSError, ContextError):
        return False


def resolve(args: argparse.Namespace | None = None, environ=os.environ) -> tuple[str, str]:
    """(base URL of the control plane's admin, where it came from)."""
    flag = getattr(args, "control_plane", None) if args is not None else None
    if flag:
        return normalize(flag), "--control-plane"
    if environ.get(ENV):
        return normalize(environ[ENV], f"${ENV}"), f"${ENV}"
    path = context_path(environ)
    value = read_context(path).get("controlPlane")
    if value:
        if not isinstance(value, str):
            raise ContextError(f"context file {path}: controlPlane: expected a string, got {type(value).__name__}")
        return normalize(value, f"context file {path}: controlPlane"), f"context file {path}"
    return DEFAULT, "default"


def url(args: argparse.Namespace | None = None, environ=os.environ) -> str:
    return resolve(args, environ)[0]
