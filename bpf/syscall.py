"""The few bpf(2) commands bcc does not wrap: pin, get, test-run.

libbcc exports map element access (used in maps.py) but neither
BPF_OBJ_PIN/BPF_OBJ_GET nor BPF_PROG_TEST_RUN, so those go through the raw
syscall with the kernel's `union bpf_attr` layouts.
"""
from __future__ import annotations

import ctypes as ct
import os
import platform
from dataclasses import dataclass

_NR_BPF = {"x86_64": 321, "aarch64": 280}.get(platform.machine(), 321)
_libc = ct.CDLL(None, use_errno=True)
_libc.syscall.restype = ct.c_long

BPF_OBJ_PIN = 6
BPF_OBJ_GET = 7
BPF_PROG_TEST_RUN = 10


class _ObjAttr(ct.Structure):
    _fields_ = [("pathname", ct.c_uint64), ("bpf_fd", ct.c_uint32), ("file_flags", ct.c_uint32)]


class _TestRunAttr(ct.Structure):
    _fields_ = [("prog_fd", ct.c_uint32), ("retval", ct.c_uint32),
                ("data_size_in", ct.c_uint32), ("data_size_out", ct.c_uint32),
                ("data_in", ct.c_uint64), ("data_out", ct.c_uint64),
                ("repeat", ct.c_uint32), ("duration", ct.c_uint32),
                ("ctx_size_in", ct.c_uint32), ("ctx_size_out", ct.c_uint32),
                ("ctx_in", ct.c_uint64), ("ctx_out", ct.c_uint64),
                ("flags", ct.c_uint32), ("cpu", ct.c_uint32), ("batch_size", ct.c_uint32)]


def _bpf(cmd: int, attr: ct.Structure, what: str) -> int:
    ret = _libc.syscall(_NR_BPF, cmd, ct.byref(attr), ct.sizeof(attr))
    if ret < 0:
        err = ct.get_errno()
        raise OSError(err, f"bpf({what}): {os.strerror(err)}")
    return ret


def obj_pin(fd: int, path: str) -> None:
    """Pins a map or program fd at `path` on a bpffs mount."""
    p = ct.create_string_buffer(os.fsencode(path))
    _bpf(BPF_OBJ_PIN, _ObjAttr(pathname=ct.addressof(p), bpf_fd=fd), f"pin {path}")


def obj_get(path: str) -> int:
    """A new fd for the object pinned at `path` (the caller closes it)."""
    p = ct.create_string_buffer(os.fsencode(path))
    return _bpf(BPF_OBJ_GET, _ObjAttr(pathname=ct.addressof(p)), f"get {path}")


@dataclass(frozen=True)
class TestRun:
    retval: int
    data: bytes           # the packet as the program left it
    duration_ns: int      # the kernel's mean time per run


class _SkbCtx(ct.Structure):
    """The leading fields of `struct __sk_buff` a test run may set (up to `mark`, `priority`)."""
    _fields_ = [("len", ct.c_uint32), ("pkt_type", ct.c_uint32), ("mark", ct.c_uint32),
                ("queue_mapping", ct.c_uint32), ("protocol", ct.c_uint32), ("vlan_present", ct.c_uint32),
                ("vlan_tci", ct.c_uint32), ("vlan_proto", ct.c_uint32), ("priority", ct.c_uint32)]


def prog_test_run(prog_fd: int, packet: bytes, repeat: int = 1, mark: int = 0) -> TestRun:
    """Runs a tc program on `packet` in the kernel (BPF_PROG_TEST_RUN).

    `mark` stands in for the sending socket's SO_MARK (skb->mark).
    """
    data_in = ct.create_string_buffer(packet, len(packet))
    out_size = len(packet) + 256
    data_out = ct.create_string_buffer(out_size)
    attr = _TestRunAttr(prog_fd=prog_fd, data_size_in=len(packet), data_size_out=out_size,
                        data_in=ct.addressof(data_in), data_out=ct.addressof(data_out),
                        repeat=repeat)
    ctx = None
    if mark:
        ctx = _SkbCtx(mark=mark)
        attr.ctx_in = ct.addressof(ctx)
        attr.ctx_size_in = ct.sizeof(ctx)
    _bpf(BPF_PROG_TEST_RUN, attr, "prog test run")
    return TestRun(retval=attr.retval, data=data_out.raw[:attr.data_size_out], duration_ns=attr.duration)
