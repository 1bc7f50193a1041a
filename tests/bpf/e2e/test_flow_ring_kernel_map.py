"""The flow ring written by the kernel itself (bpf/c/flow_ring.h): a BPF_F_MMAPABLE array map
with the seed's layout, pinned by attach, mapped by the loop. No user-space copier runs: nothing
reads the sampler's ring buffer, so a record in the ring can only come from the BPF program.

- a 1.5 MB request over a veth pair between test namespaces reaches the decision loop's
  FlowSource from the pinned map, with the flow's addresses, ports, payload and RTT;
- BPF_PROG_TEST_RUN drives the sampler past a full ring: the kernel drops the newest records
  and counts them, the reader gets the first 1024 in order, and the ring takes more once read."""
from __future__ import annotations

import asyncio
import os
import time

import pytest

from mcp26.bpf import attach, packets as P
from mcp26.bpf.flow_ring import PIN_NAME
from mcp26.mesh.flow_ring import map_fd, on_bpffs
from mcp26.bpf.policy import build_policy
from mcp26.bpf.syscall import prog_test_run
from harness.bpf_env import (TcpServer, VethPair, in_netns, load_datapath, netns_socket,
                             read_then_answer, remove_stale_namespaces, require_bpf)
from mcp26.mesh import flow_ring as R
from mcp26.scheduler.loop.actions import ActionApplier
from mcp26.scheduler.loop.builtin_policy import BuiltinPolicy
from mcp26.scheduler.loop.flows import FlowSource
from mcp26.scheduler.loop.loop import DecisionLoop

pytestmark = pytest.mark.e2e

PORT, PAYLOAD = 8091, 1_500_000


def test_the_kernel_writes_the_flow_the_loop_reads_from_the_pinned_map():
    require_bpf()
    remove_stale_namespaces()
    pair = VethPair().create()
    server = source = None
    try:
        s = netns_socket(pair.server_ns)
        s.bind((pair.V4[1], PORT))
        s.listen(4)
        server = TcpServer(s, read_then_answer(PAYLOAD))
        with in_netns(pair.server_ns):
            state = attach.attach(pair.server_if, build_policy(sample_ports=[PORT]))
            pin = os.path.join(attach.pin_dir(pair.server_if), PIN_NAME)
        assert state["flow_ring"]["path"] == pin and on_bpffs(pin)
        source = FlowSource.at(pin)                  # the loop's own mapping of the pinned map
        assert source.kernel and source() == () and source.reader.produced == 0
        loop = DecisionLoop(BuiltinPolicy(), "builtin-python", lambda: [], ActionApplier("127.0.0.1:1"),
                            period_s=0.2, flows_fn=source)
        try:
            c = netns_socket(pair.client_ns)
            c.settimeout(5)
            c.connect((pair.V4[1], PORT))
            client_port = c.getsockname()[1]
            with c:
                c.sendall(b"x" * PAYLOAD)
                assert c.recv(4096).endswith(b"ok")
                done_at = time.monotonic_ns()
            asyncio.run(loop.cycle())
            st = loop.status()
        finally:
            asyncio.run(loop.close())
        sample = source.latest[f"{pair.V4[0]}:{client_port}->{pair.V4[1]}:{PORT}"][R.KIND_EGRESS]
        assert (sample.src, sample.dst) == (f"{pair.V4[0]}:{client_port}", f"{pair.V4[1]}:{PORT}")
        assert PAYLOAD <= sample.payload_bytes < PAYLOAD + 4096, sample     # the kernel counted the bytes
        assert 0 < sample.rtt_us < 50_000 and 0 < done_at - sample.ts_ns < 5e9, sample
        flows = {f["flow"]: f for f in st["latest"]["inputs"]["flows"]}
        f = flows[sample.flow]
        assert f["payload_bytes"] == sample.payload_bytes and f["rtt_ms"] == sample.rtt_us / 1e3
        up = [a for a in st["latest"]["actions"] if a["kind"] == "upgrade-flow"]
        assert [(a["subject"], a["value"]) for a in up] == [(sample.flow, "latency-critical")]
        assert {k: st["flow_ring"][k] for k in ("samples", "drops", "flows", "source")} == \
            {"samples": 1, "drops": 0, "flows": 1, "source": "kernel"}
        assert st["flow_ring"]["rings"][0]["bell"] == "KernelBell"       # its bell beside it, opened
        # the loop advanced the kernel's consumer index: nothing pending, as status shows
        with in_netns(pair.server_ns):
            ring = attach.status(pair.server_if)[0]["flow_ring"]
        assert (ring["produced"], ring["pending"], ring["drops"]) == (1, 0, 0)
    finally:
        if source is not None:
            source.close()
        with in_netns(pair.server_ns):
            attach.detach(pair.server_if)
        if server:
            server.close()
        pair.remove()
    assert not os.path.exists(pin)


def test_a_full_kernel_ring_drops_the_newest_and_counts_them():
    dp = load_datapath()
    try:
        dp.configure(build_policy(sample_ports=["8090"]))
        mapping = map_fd(dp.map_fd("flow_ring"))
        reader = R.FlowRingReader(mapping)
        extra = 37
        for k in range(R.SLOTS + extra):          # one sample per request/response pair, a new flow each
            req = P.tcp_frame("10.231.0.1", "10.231.0.2", 20000 + k, 8090, b"q" * (100 + k))
            resp = P.tcp_frame("10.231.0.2", "10.231.0.1", 8090, 20000 + k, b"r")
            assert prog_test_run(dp.prog_fds["qos_ingress"], req).retval == 0
            assert prog_test_run(dp.prog_fds["qos_egress"], resp).retval == 0
        assert (reader.produced, reader.drops, reader.pending()) == (R.SLOTS, extra, R.SLOTS)
        got = reader.read()
        assert [s.src for s in got] == [f"10.231.0.1:{20000 + k}" for k in range(R.SLOTS)]
        assert [s.payload_bytes for s in got] == [100 + k for k in range(R.SLOTS)]
        assert all(s.dst == "10.231.0.2:8090" for s in got) and reader.skipped == 0
        # read: the kernel writes again, into slot 0 of the next lap (seq 1025)
        prog_test_run(dp.prog_fds["qos_ingress"], P.tcp_frame("10.231.0.1", "10.231.0.2", 30000, 8090, b"q"))
        prog_test_run(dp.prog_fds["qos_egress"], P.tcp_frame("10.231.0.2", "10.231.0.1", 8090, 30000, b"r"))
        raw = reader.read_raw()
        assert [(t[2], t[7]) for t in raw] == [(30000, R.SLOTS + 1)] and reader.drops == extra
        reader.close()
        mapping.close()
    finally:
        dp.close()
