"""The kernel side of the shared ring as the seed's kernel chapter uses it: samples closed at tc
ingress (the client's side) as well as egress, the ring's bell (a BPF ring buffer whose fd wakes
epoll) rung by every record, the ring mlocked where the loop maps it, and the write-burst tracer
on tracepoint syscalls/sys_enter_write writing a watched process's bursts into the same ring."""
from __future__ import annotations

import os
import select
import subprocess
import sys
import time

import pytest

from mcp26.bpf import packets as P
from mcp26.bpf.policy import build_policy
from mcp26.bpf.syscall import obj_pin, prog_test_run
from harness.bpf_env import load_datapath, require_bpf
from mcp26.mesh import flow_ring as R

pytestmark = pytest.mark.e2e

WRITER = """
import os, sys, time
sys.stdin.readline()                                   # go
fd = os.open("/dev/null", os.O_WRONLY)
for size, n in ((4096, 4), (16384, 64)):              # 16 KiB: under the threshold; then a 1 MiB burst
    for _ in range(n):
        os.write(fd, b"x" * size)
    time.sleep(0.05)                                   # a quiet gap ends the burst
print("done", flush=True)
sys.stdin.readline()
"""


def _readable(fd: int, timeout: float) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


def test_a_sample_closed_at_tc_ingress_reaches_the_ring_and_rings_its_bell(tmp_path):
    dp = load_datapath()
    pins = []
    try:
        dp.configure(build_policy(sample_ports=["8090"]))
        for name in ("flow_ring", "flow_ring_bell"):
            pins.append(f"/sys/fs/bpf/mcp-test-{os.getpid()}-{name}")
            obj_pin(dp.map_fd(name), pins[-1])
        ring, bell = R.PinnedRing(pins[0]), R.KernelBell(pins[1])
        reader = ring.reader()
        assert ring.locked
        assert not _readable(bell.fd, 0.05)
        # the client's side: its request leaves (egress), the answer comes in (ingress)
        req = P.tcp_frame("10.232.0.1", "10.232.0.2", 41000, 8090, b"q" * 300)
        resp = P.tcp_frame("10.232.0.2", "10.232.0.1", 8090, 41000, b"r")
        assert prog_test_run(dp.prog_fds["qos_egress"], req).retval == 0
        assert not _readable(bell.fd, 0.05)                    # nothing closed yet
        assert prog_test_run(dp.prog_fds["qos_ingress"], resp).retval == 0
        assert _readable(bell.fd, 1.0)                         # the record rang the bell
        (s,) = reader.read()
        assert (s.kind, s.src, s.dst, s.payload_bytes) == (R.KIND_INGRESS, "10.232.0.1:41000", "10.232.0.2:8090", 300)
        assert bell.drain() == 1 and not _readable(bell.fd, 0.05)
        # the server's side on the same program: request in (ingress), answer out (egress)
        prog_test_run(dp.prog_fds["qos_ingress"], P.tcp_frame("10.232.0.3", "10.232.0.2", 41001, 8090, b"q"))
        prog_test_run(dp.prog_fds["qos_egress"], P.tcp_frame("10.232.0.2", "10.232.0.3", 8090, 41001, b"r"))
        (s,) = reader.read()
        assert (s.kind, s.src) == (R.KIND_EGRESS, "10.232.0.3:41001") and _readable(bell.fd, 1.0)
        reader.close()
        ring.close()
        bell.close()
    finally:
        for p in pins:
            if os.path.exists(p):
                os.unlink(p)
        dp.close()


def test_the_tracer_records_a_watched_processs_write_burst_into_the_shared_ring():
    require_bpf()
    from mcp26.bpf.program import BpfUnavailable
    from mcp26.bpf.write_burst import WriteBurstTracer
    dp = load_datapath()                                       # the tc datapath owns the ring
    pins = []
    tracer = child = other = None
    try:
        for name in ("flow_ring", "flow_ring_bell"):
            pins.append(f"/sys/fs/bpf/mcp-test-{os.getpid()}-{name}")
            obj_pin(dp.map_fd(name), pins[-1])
        try:
            tracer = WriteBurstTracer(pins[0])                 # opens both pins: the same ring
        except BpfUnavailable as e:
            pytest.skip(str(e))
        ring, bell = R.PinnedRing(pins[0]), R.KernelBell(pins[1])
        reader = ring.reader()
        child = subprocess.Popen([sys.executable, "-c", WRITER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True)
        other = subprocess.Popen([sys.executable, "-c", WRITER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True)                    # the same writes, not watched
        tracer.watch(child.pid, gap_us=20_000, min_bytes=512 << 10)
        started = time.monotonic_ns()
        for p in (child, other):
            p.stdin.write("\n")
            p.stdin.flush()
        for p in (child, other):
            assert p.stdout.readline().strip() == "done"
        assert _readable(bell.fd, 2.0)
        records = reader.read()
        bursts = [r for r in records if isinstance(r, R.WriteBurst)]
        assert len(bursts) == 1, records                       # one burst over 512 KiB; the 16 KiB one is not
        (b,) = bursts
        assert b.pid == child.pid and b.bytes >= 512 << 10 and 32 <= b.writes <= 64 and b.ts_ns >= started
        with pytest.raises(ValueError, match="no process"):
            tracer.watch(2 ** 22 + 12345)
        reader.close()
        ring.close()
        bell.close()
    finally:
        for p in (child, other):
            if p is not None:
                p.kill()
                p.wait()
        if tracer is not None:
            tracer.close()
        for p in pins:
            if os.path.exists(p):
                os.unlink(p)
        dp.close()
