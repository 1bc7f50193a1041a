"""Per-flow kernel signals into the decision loop, for real: the latency sampler loaded on the
server's veth in a test namespace, a 1.5 MB request from the client namespace, the sample
(flow, first-byte time, request bytes) written by the sampler's user space (bpf.latency.RingReader
with a flow-ring writer: what `mcpctl bpf latency --flow-ring PATH` does) into a file-backed
mmap ring, and the decision loop reading it at its next period: the flow is in its signals with
its age, and the built-in table upgrades it (RTT < 50 ms, payload > 1 MB)."""
from __future__ import annotations

import asyncio
import time

import pytest

from mcp26.bpf import attach
from mcp26.bpf.latency import LatencyStats, open_pinned
from mcp26.bpf.policy import build_policy
from harness.bpf_env import TcpServer, VethPair, read_then_answer, in_netns, netns_socket, remove_stale_namespaces, require_bpf
from mcp26.mesh.flow_ring import MappedRing
from mcp26.scheduler.loop.actions import ActionApplier
from mcp26.scheduler.loop.builtin_policy import BuiltinPolicy
from mcp26.scheduler.loop.flows import FlowSource
from mcp26.scheduler.loop.loop import DecisionLoop

pytestmark = pytest.mark.e2e

PORT, PAYLOAD = 8090, 1_500_000


def test_a_large_low_rtt_request_reaches_the_loop_as_a_flow(tmp_path):
    require_bpf()
    remove_stale_namespaces()
    pair = VethPair().create()
    server = None
    try:
        s = netns_socket(pair.server_ns)
        s.bind((pair.V4[1], PORT))
        s.listen(4)
        server = TcpServer(s, read_then_answer(PAYLOAD))
        with in_netns(pair.server_ns):
            attach.attach(pair.server_if, build_policy(sample_ports=[PORT]))
        ring = MappedRing(str(tmp_path / "flows.ring"), create=True)
        stats = LatencyStats()
        with in_netns(pair.server_ns):
            reader = open_pinned(pair.server_if, stats, flow_ring=ring.writer())
        source = FlowSource.at(str(tmp_path / "flows.ring"))          # the loop's own mapping
        loop = DecisionLoop(BuiltinPolicy(), "builtin-python", lambda: [], ActionApplier("127.0.0.1:1"),
                            period_s=0.2, flows_fn=source)
        try:
            c = netns_socket(pair.client_ns)
            c.settimeout(5)
            c.connect((pair.V4[1], PORT))
            client = f"{pair.V4[0]}:{c.getsockname()[1]}"
            with c:
                c.sendall(b"x" * PAYLOAD)
                assert c.recv(4096).endswith(b"ok")
                sent_at = time.monotonic_ns()
                deadline = time.monotonic() + 5
                while stats.count(PORT) < 1 and time.monotonic() < deadline:
                    reader.poll(100)
            assert stats.count(PORT) == 1
            asyncio.run(loop.cycle())
            st = loop.status()
        finally:
            reader.close()
            asyncio.run(loop.close())
        flows = {f["flow"]: f for f in st["latest"]["inputs"]["flows"]}
        f = flows[f"{client}->{pair.V4[1]}:{PORT}"]
        assert f["payload_bytes"] >= PAYLOAD * 0.99, f        # the kernel counted the request's bytes
        assert 0 < f["rtt_ms"] < 50 and 0 <= f["age_ms"] < (time.monotonic_ns() - sent_at) / 1e6 + 1000, f
        up = [a for a in st["latest"]["actions"] if a["kind"] == "upgrade-flow"]
        assert [(a["subject"], a["value"]) for a in up] == [(f["flow"], "latency-critical")]
        assert st["flow_ring"]["samples"] == 1 and st["flow_ring"]["drops"] == 0
    finally:
        with in_netns(pair.server_ns):
            attach.detach(pair.server_if)
        if server:
            server.close()
        pair.remove()
