"""The loop's upgrade-flow in the Endpoint Picker's path, socket-free: the loop's applier writes
the marks file, the picker's ext_proc hook finds a request's downstream address (the
`source.address` attribute, never x-forwarded-for, which the client writes) in it, schedules it
critical and sets x-mcp-qos-class: latency-critical in its header mutation; an unmarked request
is untouched."""
import asyncio
import time
from types import SimpleNamespace

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from mcp26.scheduler.decisions import Action
from mcp26.scheduler.ext_proc import EndpointPicker
from mcp26.scheduler.loop.actions import ActionApplier
from mcp26.scheduler.loop.marks import FlowMarks
from mcp26.scheduler.picker import Pick


class FakeScheduler:
    def __init__(self):
        self.requests = []

    def pick(self, request, endpoints, loads):
        self.requests.append(request)
        return Pick(endpoints=("10.0.0.1:8000",))

    def started(self, e): pass

    def finished(self, e): pass


def _state(marks):
    view = SimpleNamespace(objectives={}, endpoints=[SimpleNamespace(key="10.0.0.1:8000")])
    return SimpleNamespace(flow_marks=marks, scheduler=FakeScheduler(), view=lambda: view, loads=lambda: {},
                           record=lambda *a, **k: None)


def _request(source=None, xff=None):
    r = pb.ProcessingRequest()
    for k, v in ((":path", "/v1/completions"), ("x-forwarded-for", xff)):
        if v:
            h = r.request_headers.headers.headers.add()
            h.key, h.raw_value = k, v.encode()
    r.request_headers.end_of_stream = True
    if source:
        r.attributes["envoy.filters.http.ext_proc"].update({"source.address": source})
    return r


async def _run(picker, req):
    async def it():
        yield req
    return [resp async for resp in picker.Process(it(), None)]


def _qos(resp):
    return {o.header.key: o.header.raw_value.decode()
            for o in resp.request_headers.response.header_mutation.set_headers}.get("x-mcp-qos-class")


def test_a_marked_flow_is_upgraded_by_its_source_address(tmp_path):
    path = str(tmp_path / "marks.json")
    applier = ActionApplier("127.0.0.1:1", marks_path=path)
    now = time.time()
    asyncio.run(applier.apply([Action("upgrade-flow", "127.0.0.9:41000->127.0.0.1:8080", "latency-critical",
                                      reserved_threads=2)], now, flow_hold_s=5.0))
    state = _state(FlowMarks(path, check_s=0))
    picker = EndpointPicker(state)
    marked = asyncio.run(_run(picker, _request(source="127.0.0.9:41000")))
    other = asyncio.run(_run(picker, _request(source="127.0.0.9:41001")))
    by_xff = asyncio.run(_run(picker, _request(xff="127.0.0.9")))
    assert _qos(marked[0]) == "latency-critical"
    assert _qos(other[0]) is None and _qos(by_xff[0]) is None
    assert [r.critical for r in state.scheduler.requests] == [True, False, False]
    # the hold runs out: the loop rewrites the marks without it and the picker stops upgrading
    applier.expire(now + 6)
    asyncio.run(applier.apply([], now + 6, flow_hold_s=5.0))
    assert _qos(asyncio.run(_run(picker, _request(source="127.0.0.9:41000")))[0]) is None
