"""The xDS scale benchmark's load client re-opens a stream that ended under it, as Envoy does.

At 2,000 clients (benchmarks/bench_xds_scale.py) 5-10 clients never synced.
Their own account (xds_load_clients' diagnosis) said why: each had re-opened
its stream after a client-side error (CANCELLED, INTERNAL), and the new call
had already ended when the client wrote its first request to it; grpc.aio's
`write` on a call that is over raises asyncio.InvalidStateError ("RPC already
finished"), not AioRpcError, and the client caught only AioRpcError, so that
ended the client for good. The control plane had no stream of theirs
(/debug/syncz): nothing was asked of it that it failed to send.

Here the real control plane (`mcpctl xds serve`) is killed just before the
client's first write on its stream (as in the benchmark), or after its first
response was read and before the ACK, then started again on the same port:
the client must re-open and hold the whole config (CDS, LDS, every EDS and
RDS name it follows), from what the server sends.
"""
import argparse
import asyncio
import json
import threading
import time

import grpc
import pytest

from benchmarks.xds_config import write_mesh
from benchmarks import xds_load_clients
from benchmarks.xds_load_clients import Client
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.control_plane import ControlPlane

pytestmark = pytest.mark.e2e


def load_args(mode: str) -> argparse.Namespace:
    return argparse.Namespace(mode=mode, report="summary", prefix="reopen-gw", label=["istio=ingressgateway"],
                              shapes=1, chaos=0.0, chaos_window=3.0)


class EndCallBeforeAWrite:
    """The client's channel, but on its first call, the first write after `reads` responses
    were read is made only once the call has ended: the control plane is killed then (and
    started again)."""

    def __init__(self, channel, cp: ControlPlane, reads: int):
        self.channel, self.cp, self.after_reads = channel, cp, reads
        self.tripped = False
        self.restarted = threading.Event()

    def stream_stream(self, *a, **kw):
        make = self.channel.stream_stream(*a, **kw)
        outer = self

        class Call:
            def __init__(self):
                self.call, self.reads = make(), 0

            async def read(self):
                r = await self.call.read()
                self.reads += 1
                return r

            async def write(self, req):
                if self.reads >= outer.after_reads and not outer.tripped:
                    outer.tripped = True
                    await asyncio.to_thread(outer.cp.kill)
                    deadline = time.monotonic() + 10
                    while not self.call.done() and time.monotonic() < deadline:
                        await asyncio.sleep(0.02)
                    assert self.call.done(), "the call did not end when the control plane died"
                    threading.Thread(target=outer._restart, daemon=True).start()
                return await self.call.write(req)

            def __getattr__(self, name):
                return getattr(self.call, name)

        return Call

    def _restart(self):
        try:
            self.cp.start(timeout=60)
            self.restarted.set()
        except Exception:        # the test ended first (and failed): it stops the control plane
            pass


@pytest.mark.parametrize("mode,reads", [("delta", 0), ("delta", 1), ("sotw", 0)],
                         ids=["delta-first-request", "delta-first-ack", "sotw-first-request"])
def test_load_client_reopens_a_stream_that_ended_before_a_write(tmp_path, mode, reads):
    write_mesh(str(tmp_path), services=3, routes=2, gateway_port=free_port())
    with ControlPlane(str(tmp_path), test_hooks=False, log_level="warning") as cp:
        deadline = time.monotonic() + 60
        while not json.loads(cp.get("/healthz")[1])["config_loaded"]:
            assert time.monotonic() < deadline, cp.log_tail()
            time.sleep(0.05)

        xds_load_clients.ERRORS.clear()

        async def body():
            channel = grpc.aio.insecure_channel(cp.address)
            wrapped = EndCallBeforeAWrite(channel, cp, reads)
            client = Client(0, load_args(mode))
            task = asyncio.create_task(client.run(wrapped, asyncio.Event()))
            try:
                deadline = time.monotonic() + 60
                while not client.synced_at:
                    if task.done():     # the client stopped for good: say how
                        raise AssertionError(f"the load client stopped: {task.exception()!r}; "
                                             f"{client.diagnosis()}")
                    assert time.monotonic() < deadline, f"not synced: {client.diagnosis()}"
                    await asyncio.sleep(0.05)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await channel.close()
            return wrapped, client

        wrapped, client = asyncio.run(body())
        assert wrapped.tripped and wrapped.restarted.is_set()
        # The write to the ended call was a stream error like any other (then, while the
        # control plane restarted, re-opens failed to connect until it was back).
        assert client.restarts >= 1 and any("(at a write)" in e for e in xds_load_clients.ERRORS), \
            xds_load_clients.ERRORS
        # Synced on the new stream: CDS and LDS, and EDS/RDS for every name followed.
        d = client.diagnosis()
        assert all(t["full"] for t in d["types"].values()), d
        assert d["types"]["EDS"]["subscribed"] == 3 * 3 and d["types"]["RDS"]["subscribed"] == 1, d
