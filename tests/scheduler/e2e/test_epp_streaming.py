"""The Endpoint Picker and streamed (SSE) answers, through a real Envoy to a
real `mcpctl serve --model builtin:tiny-decoder`, with the real `openai`
client (`stream=True`):

- ANSWER_MODE (response headers sent): the picker switches the answer of a
  `"stream": true` request to FULL_DUPLEX_STREAMED; the tokens still arrive
  one by one (the first well before the last), the picker sees every chunk
  (its /stats count the SSE events and the `usage` tokens the client got) and
  counts the request in flight until the last chunk;
- LEAN_MODE (the gateway's): the picker sees nothing of the answer, yet
  counts the request in flight until Envoy closes the ext_proc stream at the
  request's end (Envoy 1.40 keeps the stream of a request with a body open).
"""
import tempfile
import time

import openai
import pytest

from harness.endpoint_picker import PickerProcess, write_pool
from mcp26.demo.stack.envoy import Envoy
from harness.inference_gateway import gateway_bootstrap
from mcp26.demo.stack.inference_server import InferenceServer
from mcp26.demo.stack.ports import free_port
from mcp26.mesh import endpoint_picker as epp

pytestmark = pytest.mark.e2e

HOST = "127.0.0.2"


class Picker(PickerProcess):
    def __init__(self, directory: str):
        super().__init__(directory, "--metrics-interval-ms", "20")

    def in_flight(self) -> int:
        return sum(e["in_flight"] for e in self.stats()["endpoints"].values())


@pytest.fixture(scope="module")
def gateways():
    replica = InferenceServer("builtin:tiny-decoder", "--host", HOST, admin=False).start()
    directory = tempfile.mkdtemp(prefix="epp-stream-")
    write_pool(directory, [HOST], replica.http_port)
    picker = Picker(directory)
    lean, answer = free_port(), free_port()
    pool = [(HOST, replica.http_port)]
    envoys = [Envoy(gateway_bootstrap({lean: False}, pool, picker.port, route_timeout_s=60)).start(),
              Envoy(gateway_bootstrap({answer: False}, pool, picker.port, route_timeout_s=60,
                                      mode=epp.ANSWER_MODE)).start()]
    try:
        picker.wait(lambda s: any(e["ready"] for e in s["endpoints"].values()))
        yield picker, {"lean": lean, "answer": answer}
    finally:
        for e in envoys:
            e.stop()
        picker.stop()
        replica.stop()


def _stream(port: int, picker: Picker, max_tokens: int = 160):
    """160 tokens: the answer streams for ~0.1 s, long enough that a stall of a few tens of ms
    before the first chunk (a loaded CI machine) does not look like an answer held to its end.
    Chat with stream=True; (arrival times of the content chunks, the final usage,
    the picker's in-flight count seen at the 6th chunk: well after the pick and the answer's headers)."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)
    stream = client.chat.completions.create(
        model="tiny-decoder", messages=[{"role": "user", "content": "Tell me a long story about the mesh."}],
        max_tokens=max_tokens, temperature=0, stream=True, stream_options={"include_usage": True})
    t0, arrivals, usage, during = time.perf_counter(), [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.perf_counter() - t0)
            if len(arrivals) == 6:
                during = picker.in_flight()
    return arrivals, usage, during


def test_answer_mode_streams_sse_through_the_picker_chunk_by_chunk(gateways):
    picker, ports = gateways
    before = picker.stats()["streamed"]
    arrivals, usage, during = _stream(ports["answer"], picker)
    assert usage is not None and usage.completion_tokens >= 10
    assert len(arrivals) >= 10
    # incremental: the first token long before the last (not held until the end of the answer)
    assert arrivals[0] < 0.5 * arrivals[-1], arrivals
    assert during == 1                                          # counted in flight while it streams
    after = picker.wait(lambda s: s["streamed"]["answers"] == before["answers"] + 1 and
                        all(e["in_flight"] == 0 for e in s["endpoints"].values()))["streamed"]
    # the picker saw every chunk: the events the client got (+ the usage chunk and [DONE]) and the usage
    assert after["events"] - before["events"] >= len(arrivals) + 2
    assert after["completion_tokens"] - before["completion_tokens"] == usage.completion_tokens


def test_lean_mode_counts_the_stream_in_flight_until_its_end_without_seeing_it(gateways):
    picker, ports = gateways
    before = picker.stats()["streamed"]
    arrivals, usage, during = _stream(ports["lean"], picker)
    assert usage is not None and len(arrivals) >= 10 and arrivals[0] < 0.5 * arrivals[-1], arrivals
    assert during == 1                      # the ext_proc stream stays open after the pick
    picker.wait(lambda s: all(e["in_flight"] == 0 for e in s["endpoints"].values()))
    assert picker.stats()["streamed"] == before                 # no chunk went through the picker
