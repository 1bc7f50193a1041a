"""mcp-bench's engine against a throwaway KServe v2 REST target (aiohttp, in a
thread): counts, priorities on the wire, server timing columns, error
classes, timeouts, open-loop latency from the intended send time."""
from __future__ import annotations

import asyncio
import csv
import io
import json
import threading
import time

import pytest
from aiohttp import web

from mcp26.inference.bench import report
from mcp26.inference.bench.runner import Config, run_sync
from mcp26.inference.bench.target import TargetError
from mcp26.mesh.headers import COMPUTE_TIME_US, QOS_CLASS, QUEUE_TIME_US
from mcp26.mesh.qos import QosClass

pytestmark = pytest.mark.e2e

METADATA = {"name": "toy", "versions": ["1"], "platform": "onnxruntime_onnx",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}]}


class ToyTarget:
    """Answers /v2/models/toy like a KServe v2 server; `delay` (s) per request,
    served one at a time when `serial` (a single-worker server)."""

    def __init__(self, delay: float = 0.0, serial: bool = False, chunked: bool = False):
        self.delay, self.serial, self.chunked = delay, serial, chunked
        self.seen: list[dict] = []
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self):
        asyncio.set_event_loop(self.loop)
        self.lock = asyncio.Lock()
        app = web.Application()
        app.router.add_get("/v2/models/{name}", self.metadata)
        app.router.add_post("/v2/models/{name}/infer", self.infer)
        app.router.add_get("/v2/health/ready", self.ready_probe)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    async def ready_probe(self, request):
        return web.Response(text="")

    async def metadata(self, request):
        if request.match_info["name"] != "toy":
            return web.json_response({"error": "unknown model"}, status=404)
        return web.json_response(METADATA)

    async def infer(self, request):
        if request.match_info["name"] != "toy":
            return web.json_response({"error": "unknown model"}, status=404)
        body = await request.json()
        self.seen.append({"qos": request.headers.get(QOS_CLASS), "body": body})
        t = time.perf_counter()
        if self.serial:
            async with self.lock:
                await asyncio.sleep(self.delay)
        elif self.delay:
            await asyncio.sleep(self.delay)
        headers = {QUEUE_TIME_US: "250", COMPUTE_TIME_US: str(int((time.perf_counter() - t) * 1e6))}
        out = {"model_name": "toy", "outputs": [{"name": "y", "datatype": "FP32", "shape": [1, 2], "data": [0, 1]}]}
        if self.chunked:
            resp = web.StreamResponse(headers=headers)
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            await resp.write(json.dumps(out)[:10].encode())
            await resp.write(json.dumps(out)[10:].encode())
            await resp.write_eof()
            return resp
        return web.json_response(out, headers=headers)

    def __enter__(self):
        self.thread.start()
        self.ready.wait(10)
        return self

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def url(self, model="toy"):
        return f"http://127.0.0.1:{self.port}/v2/models/{model}"


def test_closed_loop_counts_payload_and_server_timing():
    with ToyTarget() as t:
        res = run_sync(Config(url=t.url(), concurrency=4, requests=200))
        body = t.seen[0]["body"]
    all_row = res["rows"][0]
    assert res["run"]["completed"] == 200 and all_row["ok"] == 200 and all_row["errors"] == 0
    assert len(t.seen) == 200
    # inputs built from the metadata: -1 became 1
    assert body["inputs"][0]["name"] == "x" and body["inputs"][0]["shape"] == [1, 4]
    assert len(body["inputs"][0]["data"]) == 4 and body["inputs"][0]["datatype"] == "FP32"
    assert all_row["server_queue_us"]["p50"] == 250
    assert all_row["server_compute_us"]["p50"] is not None
    lat = all_row["latency_ms"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99.9"] <= lat["max"]


def test_priority_mix_on_the_wire_and_per_priority_rows():
    with ToyTarget() as t:
        res = run_sync(Config(url=t.url(), concurrency=2, requests=100, priority_mix="critical=0.1,low=0.9"))
        seen = list(t.seen)
    rows = {r["priority"]: r for r in res["rows"]}
    assert set(rows) == {"all", "critical", "low"}
    assert rows["critical"]["requests"] == 10 and rows["low"]["requests"] == 90
    assert rows["critical"]["qos_class"] == QosClass.LATENCY_CRITICAL.header_value
    high = [s for s in seen if s["qos"] == QosClass.LATENCY_CRITICAL.header_value]
    low = [s for s in seen if s["qos"] == QosClass.BATCH.header_value]
    assert len(high) == 10 and len(low) == 90
    assert high[0]["body"]["parameters"]["priority"] == QosClass.LATENCY_CRITICAL.priority_level
    assert low[0]["body"]["parameters"]["priority"] == QosClass.BATCH.priority_level


def test_wrong_model_is_a_404_client_error_at_setup_and_on_infer():
    with ToyTarget() as t:
        with pytest.raises(TargetError, match=r"^no model at .*/v2/models/nope; models here: "):
            run_sync(Config(url=t.url("nope"), requests=5))
        # inputs given, so no metadata step: every infer is a 404, counted by class
        res = run_sync(Config(url=t.url("nope"), requests=7, inputs=["x:FP32:1,4"]))
        raw = run_sync(Config(url=f"http://127.0.0.1:{t.port}/v2/nothing-here", requests=3))
    assert raw["rows"][0]["error_classes"] == {"client/http-404": 3}
    row = res["rows"][0]
    assert row["ok"] == 0 and row["errors"] == 7
    assert row["error_classes"] == {"client/http-404": 7}


def test_timeouts_are_classified_and_the_run_ends():
    with ToyTarget(delay=0.5) as t:
        res = run_sync(Config(url=t.url(), concurrency=2, requests=4, timeout=0.1))
    assert res["rows"][0]["error_classes"] == {"timeout/deadline": 4}


def test_chunked_responses_are_read():
    with ToyTarget(chunked=True) as t:
        res = run_sync(Config(url=t.url(), concurrency=2, requests=30))
    assert res["rows"][0]["ok"] == 30


def test_open_loop_counts_from_intended_time_when_the_target_falls_behind():
    """A serial target taking 20 ms can do ~50/s; offered 200/s for 40
    requests, the last one is due at 0.2 s but served near 0.8 s. Latency from
    the intended time must grow along the run; measured from the send time
    (coordinated omission) it would stay flat near 20 ms x concurrency."""
    with ToyTarget(delay=0.02, serial=True) as t:
        res = run_sync(Config(url=t.url(), concurrency=2, requests=40, rate=200))
    row = res["rows"][0]
    assert row["ok"] == 40
    assert res["run"]["mode"] == "open-loop"
    lat = row["latency_ms"]
    # the last requests waited ~0.6 s in the generator's queue: that is in the latency
    assert lat["max"] > 400, lat
    lag = res["schedule_lag"]
    assert lag["max_ms"] > 300
    # that lag is the server's backlog (all slots busy), not the generator being late
    assert lag["waited_for_slot"] > 20
    assert lag["generator_max_ms"] < lag["max_ms"] / 3
    assert lat["p50"] > 3 * lat["max"] / 40


def test_open_loop_holds_the_rate_when_the_target_keeps_up():
    with ToyTarget() as t:
        res = run_sync(Config(url=t.url(), concurrency=4, requests=100, rate=200))
    assert res["rows"][0]["ok"] == 100
    assert res["run"]["duration_s"] >= 0.99 * 99 / 200   # paced by the schedule, not sent as fast as possible
    assert res["run"]["sent_rate_rps"] == pytest.approx(200, rel=0.2)
    assert res["schedule_lag"]["waited_for_slot"] == 0


def test_csv_and_json_are_well_formed():
    with ToyTarget() as t:
        res = run_sync(Config(url=t.url(), concurrency=2, requests=20, priority_mix="critical=1,low=1"))
    rows = list(csv.DictReader(io.StringIO(report.to_csv(res))))
    assert [r["priority"] for r in rows] == ["all", "critical", "low"]
    assert int(rows[0]["requests"]) == 20 and float(rows[1]["p99_ms"]) > 0
    back = json.loads(report.to_json(res))
    assert back["rows"][0]["ok"] == 20
    text = report.table(res)
    assert "p99.9 ms" in text and "critical" in text and "errors: none" in text
