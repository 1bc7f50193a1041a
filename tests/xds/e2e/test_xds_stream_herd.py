"""A fleet whose ADS streams arrive while the control plane's loop is busy is served, not turned away.

gRPC core holds a new stream until the server's loop asks for it. By its
defaults it cancels a stream held 30 s (the client sees CANCELLED) and
refuses new ones once 1,000 are held (some; all past 3,000). When 1,000
proxies connect at once (benchmarks/bench_xds_scale.py) the loop is busy
pushing the full config to the streams before them: 300-600 streams a run
were cancelled at 30 s, and each re-opened stream was sent everything again.

Here the real control plane runs in this process and its loop is blocked
while 1,500 Delta ADS streams (benchmarks/xds_load_clients.py, three
processes) arrive, until 31 s after the last process opened its streams:
every client must then hold the whole config with no stream error. On the
HTTP/2 lane (`--grpc-frontend fast`, the default) nothing holds a stream but
the kernel's accept queue and socket buffers: the same must hold there.
"""
import asyncio
import threading
import time

import pytest

from benchmarks.bench_xds_scale import Fleet
from benchmarks.xds_config import write_mesh
from mcp26.demo.stack.ports import free_port
from mcp26.xds.server import XdsServer

pytestmark = pytest.mark.e2e

CLIENTS, PROCS = 1_500, 3
HELD_S = 31.0          # past gRPC core's default 30 s


@pytest.mark.parametrize("frontend", ["fast", "grpcio"])
def test_streams_held_while_the_loop_is_busy_are_served(tmp_path, frontend):
    write_mesh(str(tmp_path), services=2, routes=2, gateway_port=free_port())

    async def main():
        server = XdsServer(str(tmp_path), port=free_port(), admin_port=free_port(), grpc_frontend=frontend)
        await server.start()
        fleet = Fleet(f"127.0.0.1:{server.port}", CLIENTS, PROCS, shapes=1, mode="delta", per_channel=25)
        release = threading.Event()

        def release_later():
            # Every process reports twice a second from the moment its streams are started.
            deadline = time.monotonic() + 60
            while len(fleet.status) < len(fleet.procs) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(HELD_S)
            release.set()

        threading.Thread(target=release_later, daemon=True).start()
        try:
            release.wait()                 # the loop is blocked: gRPC core holds what arrives
            held_for = time.monotonic()
            deadline = time.monotonic() + 90
            while fleet.synced()[0] < CLIENTS and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            synced = fleet.synced()[0]
        finally:
            records = fleet.stop()
            await server.stop()
        errors = {k: n for ev in fleet.final.values() for k, n in ev.get("stream_errors", {}).items()}
        return synced, records, errors, time.monotonic() - held_for

    synced, records, errors, serve_s = asyncio.run(main())
    assert synced == CLIENTS, f"{synced}/{CLIENTS} synced {serve_s:.1f} s after the loop was released"
    assert len(records) == CLIENTS
    if frontend == "grpcio":       # core answered the handshakes and held the streams: nothing failed
        assert errors == {}, f"stream errors after the loop was held {HELD_S} s: {errors}"
        assert not any(r.get("restarts") for r in records.values())
    else:
        # The lane's handshake (SETTINGS) runs on the loop: a client waiting past its 20 s connect
        # deadline gives up and retries, and is served then; no stream fails once it is open.
        assert all(k.startswith("UNAVAILABLE: failed to connect") for k in errors), errors
