"""A live session's next turn picked on its request headers alone, through a
real Envoy to two real `mcpctl serve --model builtin:tiny-decoder` replicas,
with the real `openai` client:

- LEAN_MODE (the gateway's): the first turn is picked on its body (prefix,
  spread); the next turn of the same `x-session-id` is picked on its headers
  (the picker's `header_picks`), switched to SESSION_MODE (Envoy skips the body
  to the picker but forwards it whole: the replica answers from the prompt's
  cached prefix, so it is the replica that served the first turn), and still
  counted in flight until its streamed answer ends;
- a route in ANSWER_MODE (its stream carries `x-mcp-endpoint-picker-mode:
  answer`) never skips the response phases: every turn is picked on its body
  and streamed through the picker.
"""
import tempfile
import time

import openai
import pytest

from harness.endpoint_picker import PickerProcess, write_pool
from mcp26.demo.stack.envoy import Envoy
from harness.inference_gateway import gateway_bootstrap
from mcp26.demo.stack.inference_server import InferenceServer
from mcp26.demo.stack.ports import free_port, port_free_on_all
from mcp26.mesh import endpoint_picker as epp

pytestmark = pytest.mark.e2e

HOSTS = ("127.0.0.2", "127.0.0.3")
SYSTEM = "You are the mesh's assistant. " + "Answer briefly and cite the replica you run on. " * 6


@pytest.fixture(scope="module")
def gateways():
    port = port_free_on_all(HOSTS)
    replicas = []
    directory = tempfile.mkdtemp(prefix="epp-session-")
    write_pool(directory, list(HOSTS), port)
    picker, envoys = None, []
    try:
        for h in HOSTS:
            replicas.append(InferenceServer("builtin:tiny-decoder", "--host", h, "--http-port", str(port),
                                            admin=False).start())
        picker = PickerProcess(directory, "--metrics-interval-ms", "20")
        lean, answer = free_port(), free_port()
        pool = [(h, port) for h in HOSTS]
        envoys = [Envoy(gateway_bootstrap({lean: False}, pool, picker.port, route_timeout_s=60)).start(),
                  Envoy(gateway_bootstrap({answer: False}, pool, picker.port, route_timeout_s=60,
                                          mode=epp.ANSWER_MODE)).start()]
        picker.wait(lambda s: sum(e["ready"] for e in s["endpoints"].values()) == len(HOSTS))
        yield picker, {"lean": lean, "answer": answer}
    finally:
        for e in envoys:
            e.stop()
        if picker:
            picker.stop()
        for r in replicas:
            r.stop()


def _turn(port: int, session: str, messages: list[dict], picker: PickerProcess | None = None, max_tokens: int = 8):
    """One streamed chat turn; (answer text, usage, the picker's in-flight count at the 4th chunk)."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60,
                           default_headers={epp.SESSION_HEADER: session})
    stream = client.chat.completions.create(model="tiny-decoder", messages=messages, max_tokens=max_tokens,
                                            temperature=0, stream=True, stream_options={"include_usage": True})
    text, usage, during, chunks = "", None, None, 0
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
            chunks += 1
            if chunks == 4 and picker is not None:
                during = sum(e["in_flight"] for e in picker.stats()["endpoints"].values())
    return text, usage, during


def _conversation(port: int, session: str, picker: PickerProcess):
    """Two turns of one session; the stats before and after each, the second turn's usage and in-flight count."""
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Hello from {session}."}]
    s0 = picker.stats()
    answer, _, _ = _turn(port, session, first)
    s1 = picker.wait(lambda s: all(e["in_flight"] == 0 for e in s["endpoints"].values()))
    second = first + [{"role": "assistant", "content": answer},
                      {"role": "user", "content": "And which replica holds our history now?"}]
    _, usage, during = _turn(port, session, second, picker, max_tokens=64)
    s2 = picker.wait(lambda s: all(e["in_flight"] == 0 for e in s["endpoints"].values()))
    return s0, s1, s2, usage, during


def _picked(before: dict, after: dict) -> list[str]:
    return [k for k, e in after["endpoints"].items() if e["picked"] > before["endpoints"][k]["picked"]]


def test_lean_a_sessions_next_turn_is_picked_on_its_headers_and_lands_on_its_cache(gateways):
    picker, ports = gateways
    s0, s1, s2, usage, during = _conversation(ports["lean"], "lean-session-1", picker)
    assert s1["header_picks"] == s0["header_picks"]              # the first turn: picked on its body
    assert s2["header_picks"] == s1["header_picks"] + 1          # the next: on its headers alone
    assert s2["session_mode_refused"] == 0                       # and Envoy did not send its body
    assert _picked(s0, s1) == _picked(s1, s2) and len(_picked(s1, s2)) == 1   # the same replica
    # The body the picker skipped reached the replica whole, and that replica held the first turn's
    # prompt: the system prompt and first user message come from its KV cache.
    assert usage.prompt_tokens > len(SYSTEM)
    assert usage.prompt_tokens_details.cached_tokens >= len(SYSTEM) - 64, usage
    assert during == 1           # SESSION_MODE keeps the ext_proc stream open while the answer streams


def test_a_new_session_is_picked_on_its_body(gateways):
    picker, ports = gateways
    before = picker.stats()
    _turn(ports["lean"], f"fresh-{time.monotonic_ns()}", [{"role": "user", "content": "A first turn."}])
    after = picker.wait(lambda s: s["decisions"] > before["decisions"])
    assert after["header_picks"] == before["header_picks"]


def test_answer_mode_routes_never_pick_on_headers_and_stream_through_the_picker(gateways):
    picker, ports = gateways
    s0, s1, s2, usage, during = _conversation(ports["answer"], "answer-session-1", picker)
    assert s2["header_picks"] == s0["header_picks"]
    assert s2["streamed"]["answers"] == s0["streamed"]["answers"] + 2, (s0["streamed"], s1["streamed"], s2["streamed"])  # both answers through the picker
    assert usage.prompt_tokens_details.cached_tokens >= len(SYSTEM) - 64  # and still where its cache is
    assert during == 1
