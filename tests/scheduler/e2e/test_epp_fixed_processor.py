"""The overhead benchmark's native processor (benchmarks/epp_fixed_processor.py)
really picks: a real Envoy gateway in ONE_MESSAGE_MODE asks a second real Envoy,
which answers every ext_proc stream with its fixed pick, and every request lands
on the picked echo upstream, whichever of the two it is (without the pick the
gateway's fallback round robin would alternate). Its row is only a measure of
ext_proc's own cost if the pick it carries is applied."""
import http.client

import pytest

from benchmarks.epp_fixed_processor import ONE_MESSAGE_MODE, fixed_processor_bootstrap
from mcp26.demo.stack.envoy import Envoy
from harness.inference_gateway import gateway_bootstrap
from mcp26.demo.stack.ports import free_port, port_free_on_all
from mcp26.demo.stack.upstreams import EchoUpstream

pytestmark = pytest.mark.e2e

HOSTS = ("127.0.0.2", "127.0.0.3")


@pytest.mark.parametrize("picked", [0, 1])
def test_every_request_lands_on_the_fixed_pick(picked):
    port = port_free_on_all(HOSTS)
    ups = [EchoUpstream(f"echo-{h}", port=port, host=h) for h in HOSTS]
    envoys = []
    try:
        for u in ups:
            u.start()
        processor, gateway = free_port(), free_port()
        envoys.append(Envoy(fixed_processor_bootstrap(processor, f"{HOSTS[picked]}:{port}")).start())
        envoys.append(Envoy(gateway_bootstrap({gateway: False}, [(h, port) for h in HOSTS], processor,
                                              mode=ONE_MESSAGE_MODE)).start())
        conn = http.client.HTTPConnection("127.0.0.1", gateway, timeout=5)
        answered = []
        for i in range(6):
            conn.request("POST", "/v1/chat/completions", body=b'{"messages": []}',
                         headers={"content-type": "application/json"})
            r = conn.getresponse()
            r.read()
            assert r.status == 200, f"request {i}: {r.status} (the gateway fails closed: the processor's answer broke)"
            answered.append(r.getheader("x-upstream"))
        conn.close()
        assert answered == [f"echo-{HOSTS[picked]}"] * 6
    finally:
        for e in envoys:
            e.stop()
        for u in ups:
            u.stop()
