"""Attach, inspect and detach the QoS datapath on an interface, across processes.

State lives in bpffs: /sys/fs/bpf/mcp-mesh/<ifname>/ holds the pinned
programs and maps (interfaces of other network namespaces under
netns-<inode>/<ifname>/), and the `config` map remembers whether attach
created the clsact qdisc, so a later `detach` removes exactly what attach
added. Attach builds the new state beside the old one and swaps the tc
filters in place; on any failure the old state (or nothing) is left.
"""
from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager

from mcp26.bpf import layout, tc
from mcp26.bpf.maps import BpfMap
from mcp26.bpf.policy import QosPolicy
from mcp26.bpf.program import EGRESS, INGRESS, MAP_TYPES, BpfUnavailable, QosDatapath, check_privilege
from mcp26.bpf.syscall import obj_get, obj_pin
from mcp26.bpf.flow_ring import PIN_NAME
from mcp26.mesh.flow_ring import PinnedRing

BPFFS = "/sys/fs/bpf"
PIN_ROOT = os.path.join(BPFFS, "mcp-mesh")
PROGRAMS = {EGRESS: "egress", INGRESS: "ingress"}
STAGING_PREFIX = "staging-"


LOCK_PATH = "/run/mcp-mesh-bpf.lock"


class AttachError(RuntimeError):
    pass


@contextmanager
def _exclusive():
    """One attach/detach at a time on this host (two would interleave tc calls)."""
    import fcntl
    with open(LOCK_PATH, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _netns_inode(pid: str) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def _pin_name(ifname: str) -> str:
    # bpffs refuses names holding "." (as VLAN interfaces do): escape them.
    return ifname.replace("%", "%25").replace(".", "%2E")


def _if_name(pin_name: str) -> str:
    return pin_name.replace("%2E", ".").replace("%25", "%")


def _ns_root() -> str:
    """The pin root of this thread's network namespace: PIN_ROOT for the host's (PID 1's), else
    netns-<inode> by the namespace's own inode. Ours is always readable (thread-self: the
    namespace a thread that called setns is in); PID 1's is not on some hosts (hidepid,
    another PID namespace: PermissionError), and then we cannot say we are the host's, so
    the inode names the directory there too - never one directory for two namespaces."""
    here = _netns_inode("thread-self")
    try:
        init = _netns_inode("1")
    except OSError:
        init = None
    return PIN_ROOT if here == init else os.path.join(PIN_ROOT, f"netns-{here}")


def pin_dir(ifname: str) -> str:
    return os.path.join(_ns_root(), _pin_name(ifname))


def staging_dir(ifname: str) -> str:
    return os.path.join(_ns_root(), STAGING_PREFIX + _pin_name(ifname))


def bpffs_mounted(path: str = BPFFS) -> bool:
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path and line.split()[2] == "bpf" for line in f)


def ensure_bpffs() -> None:
    if bpffs_mounted():
        return
    os.makedirs(BPFFS, exist_ok=True)
    r = subprocess.run(["mount", "-t", "bpf", "bpf", BPFFS], capture_output=True, text=True)
    if r.returncode != 0:
        raise BpfUnavailable(f"cannot mount bpffs at {BPFFS}: {r.stderr.strip()}")


def _remove_pins(path: str) -> None:
    if not os.path.isdir(path):
        return
    for name in os.listdir(path):
        os.unlink(os.path.join(path, name))
    os.rmdir(path)
    parent = os.path.dirname(path)
    while parent.startswith(PIN_ROOT) and parent != BPFFS:
        try:
            os.rmdir(parent)            # only if empty
        except OSError:
            break
        parent = os.path.dirname(parent)


@contextmanager
def pinned_maps(ifname: str):
    """{map name: BpfMap} of the datapath pinned for `ifname` (KeyError if none)."""
    path = pin_dir(ifname)
    if not os.path.isdir(path):
        raise KeyError(ifname)
    maps = {}
    try:
        for name, (k, v) in MAP_TYPES.items():
            if k is not None:
                maps[name] = BpfMap(obj_get(os.path.join(path, name)), k, v, name, owned=True)
        yield maps
    finally:
        for m in maps.values():
            m.close()


def _owner_flags(ifname: str) -> int | None:
    try:
        with pinned_maps(ifname) as maps:
            return maps["config"][0].owner_flags
    except (KeyError, OSError):
        return None


def attach(ifname: str, policy: QosPolicy) -> dict:
    """Loads the programs with `policy` onto `ifname`, replacing what we had there."""
    check_privilege()
    with _exclusive():
        return _attach(ifname, policy)


def _attach(ifname: str, policy: QosPolicy) -> dict:
    if not tc.interface_exists(ifname):
        raise AttachError(f"no interface {ifname!r} in this network namespace")
    ensure_bpffs()
    path = pin_dir(ifname)
    staging = staging_dir(ifname)
    _remove_pins(staging)                        # a crashed attach's leftovers
    previous = _owner_flags(ifname)
    datapath = QosDatapath()                     # compile errors stop here, nothing touched
    created_qdisc = False
    try:
        created_qdisc = tc.add_clsact(ifname)
        owner = (previous or 0) | (layout.OWNER_CREATED_QDISC if created_qdisc else 0)
        datapath.configure(policy, owner_flags=owner)
        os.makedirs(staging)
        for prog, fd in datapath.prog_fds.items():
            obj_pin(fd, os.path.join(staging, prog))
        for name in MAP_TYPES:
            obj_pin(datapath.map_fd(name), os.path.join(staging, name))
        tc.replace_filter(ifname, "egress", os.path.join(staging, EGRESS))
        if policy.needs_ingress:
            tc.replace_filter(ifname, "ingress", os.path.join(staging, INGRESS))
        else:
            tc.del_filter(ifname, "ingress")
    except Exception as e:
        _roll_back(ifname, path, previous, created_qdisc)
        _remove_pins(staging)
        if isinstance(e, (tc.TcError, OSError)):
            raise AttachError(f"attach {ifname}: {e}") from None
        raise
    finally:
        datapath.close()
    _remove_pins(path)
    os.rename(staging, path)
    return status(ifname)[0]


def _roll_back(ifname: str, path: str, previous: int | None, created_qdisc: bool) -> None:
    if previous is None:                         # nothing was attached before
        tc.del_filter(ifname, "egress")
        tc.del_filter(ifname, "ingress")
        if created_qdisc:
            tc.del_clsact(ifname)
        return
    try:                                         # put the previous programs back
        tc.replace_filter(ifname, "egress", os.path.join(path, EGRESS))
        with pinned_maps(ifname) as maps:
            had_ingress = maps["config"][0].flags & (layout.CFG_SAMPLE | layout.CFG_ALPN | layout.CFG_TFO)
        if had_ingress:
            tc.replace_filter(ifname, "ingress", os.path.join(path, INGRESS))
        else:
            tc.del_filter(ifname, "ingress")
    except Exception:
        pass


def detach(ifname: str) -> bool:
    """Removes our filters, our pins and (if attach added it) the clsact qdisc."""
    check_privilege()
    with _exclusive():
        return _detach(ifname)


def _detach(ifname: str) -> bool:
    path = pin_dir(ifname)
    owner = _owner_flags(ifname)
    present = tc.interface_exists(ifname)
    ours = present and any(f["ours"] for hook in PROGRAMS.values() for f in tc.filters(ifname, hook))
    if owner is None and not ours and not os.path.isdir(staging_dir(ifname)):
        _remove_pins(path)
        return False
    if present:
        tc.del_filter(ifname, "egress")
        tc.del_filter(ifname, "ingress")
        others = tc.filters(ifname, "egress") + tc.filters(ifname, "ingress")
        if owner and owner & layout.OWNER_CREATED_QDISC and not others:
            tc.del_clsact(ifname)
    _remove_pins(path)
    _remove_pins(staging_dir(ifname))
    return True


def attached_interfaces() -> list[str]:
    base = _ns_root()
    if not os.path.isdir(base):
        return []
    return sorted(_if_name(n) for n in os.listdir(base)
                  if not n.startswith((STAGING_PREFIX, "netns-")) and os.path.isdir(os.path.join(base, n)))


def status(ifname: str | None = None, max_flows: int = 20) -> list[dict]:
    """What is attached (to `ifname`, or everywhere in this network namespace)."""
    out = []
    for name in [ifname] if ifname else attached_interfaces():
        try:
            with pinned_maps(name) as maps:
                cfg = maps["config"][0]
                flows, counts = [], {}
                for key, val in maps["flow_alpn"].items():
                    state = layout.ALPN_STATE_NAMES.get(val.state, str(val.state))
                    counts[state] = counts.get(state, 0) + 1
                    # TLS and TCP Fast Open flows are listed; the rest only counted.
                    if val.state != layout.ALPN_NOT_CLIENT_HELLO and len(flows) < max_flows:
                        flows.append({"flow": str(key), "alpn": val.proto.decode(errors="replace"),
                                      "state": state,
                                      "dscp": val.dscp if val.state in (layout.ALPN_CLASSED, layout.FLOW_TFO) else None})
                entry = {
                    "interface": name,
                    "pins": pin_dir(name),
                    "alpn": bool(cfg.flags & layout.CFG_ALPN),
                    "tfo": cfg.tfo_dscp if cfg.flags & layout.CFG_TFO else None,
                    "sample": bool(cfg.flags & layout.CFG_SAMPLE),
                    "created_qdisc": bool(cfg.owner_flags & layout.OWNER_CREATED_QDISC),
                    "ports": {int(k.value): int(v.value) for k, v in maps["port_dscp"].items()},
                    "marks": {int(k.value): int(v.value) for k, v in maps["mark_dscp"].items()},
                    "cidrs": {_cidr(k): int(v.value) for k, v in maps["cidr_dscp"].items()},
                    "alpn_dscp": {k.name.decode(): int(v.value) for k, v in maps["alpn_dscp"].items()},
                    "sample_ports": sorted(int(k.value) for k, _ in maps["sample_ports"].items()),
                    "flows": flows,
                    "flow_counts": counts,
                }
        except KeyError:
            continue
        entry["flow_ring"] = _flow_ring(name)
        present = tc.interface_exists(name)
        entry["filters"] = {hook: [f for f in tc.filters(name, hook) if f["ours"]] if present else []
                            for hook in PROGRAMS.values()}
        entry["interface_present"] = present
        out.append(entry)
    return out


def _flow_ring(ifname: str) -> dict | None:
    """The kernel-written flow ring's pin (for `mcpctl scheduler run --flow-ring`) and counters."""
    path = os.path.join(pin_dir(ifname), PIN_NAME)
    try:
        ring = PinnedRing(path)
    except (OSError, ValueError):
        return None
    r = ring.reader()
    try:
        return {"path": path, "produced": r.produced, "pending": r.pending(), "drops": r.drops}
    finally:
        r.close()
        ring.close()


def _cidr(key: layout.CidrKey) -> str:
    import ipaddress
    addr = ipaddress.IPv6Address(bytes(key.addr))
    if addr.ipv4_mapped and key.prefixlen >= 96:
        return f"{addr.ipv4_mapped}/{key.prefixlen - 96}"
    return f"{addr}/{key.prefixlen}"
