"""The clsact qdisc and our bpf filters, through iproute2's `tc`.

Our filters sit at a fixed preference and handle, so `replace` swaps the
program atomically (no window without marking) and removal touches nothing
of anyone else's on the same hook.
"""
from __future__ import annotations

import json
import shutil
import subprocess

FILTER_PREF = 0x4d51          # "MQ"
FILTER_HANDLE = "0x1"


class TcError(RuntimeError):
    pass


def _tc(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    tc = shutil.which("tc") or "/usr/sbin/tc"
    try:
        r = subprocess.run([tc, *args], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise TcError("`tc` not found: install Debian iproute2") from None
    if check and r.returncode != 0:
        raise TcError(f"tc {' '.join(args)}: {r.stderr.strip() or r.stdout.strip()}")
    return r


def interface_exists(ifname: str) -> bool:
    import socket
    try:
        socket.if_nametoindex(ifname)
        return True
    except OSError:
        return False


def has_clsact(ifname: str) -> bool:
    out = _tc("-j", "qdisc", "show", "dev", ifname).stdout or "[]"
    return any(q.get("kind") == "clsact" for q in json.loads(out))


def add_clsact(ifname: str) -> bool:
    """Adds the clsact qdisc; True if this call created it."""
    if has_clsact(ifname):
        return False
    _tc("qdisc", "add", "dev", ifname, "clsact")
    return True


def del_clsact(ifname: str) -> None:
    _tc("qdisc", "del", "dev", ifname, "clsact", check=False)


def replace_filter(ifname: str, hook: str, pinned_prog: str) -> None:
    _tc("filter", "replace", "dev", ifname, hook, "pref", str(FILTER_PREF), "handle", FILTER_HANDLE,
        "bpf", "object-pinned", pinned_prog, "direct-action")


def del_filter(ifname: str, hook: str) -> None:
    _tc("filter", "del", "dev", ifname, hook, "pref", str(FILTER_PREF), check=False)


def filters(ifname: str, hook: str) -> list[dict]:
    """All bpf filters on the hook, ours marked `"ours": True`."""
    r = _tc("-j", "filter", "show", "dev", ifname, hook, check=False)
    if r.returncode != 0 or not r.stdout.strip():
        return []
    out = []
    for f in json.loads(r.stdout):
        opts = f.get("options") or {}
        if f.get("kind") != "bpf" or "prog" not in opts and "bpf_name" not in opts:
            continue
        out.append({"pref": f.get("pref"), "name": opts.get("bpf_name", ""),
                    "prog_id": (opts.get("prog") or {}).get("id"),
                    "direct_action": bool(opts.get("direct-action")),
                    "ours": f.get("pref") == FILTER_PREF})
    return out
