"""mcp-bench cannot silently measure nothing: the /infer short form reaches the default
model, a URL with no model behind it stops the run, shed (429) requests are counted and
said, and the exit code is non-zero above --max-error-rate."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from mcp26.demo.stack.inference_server import InferenceServer

pytestmark = pytest.mark.e2e
MCP_BENCH = [sys.executable, "-m", "mcp26.inference.bench.cli"]


def bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*MCP_BENCH, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def relu():
    with InferenceServer("builtin:relu", "--enable-profiler") as server:
        yield server


@pytest.mark.parametrize("path", ["/infer", "/v2/infer"])
def test_short_form_reaches_the_default_model(relu, path):
    r = bench("-c", "4", "-n", "200", "-u", f"http://{relu.http}{path}", "--output-format", "json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["run"]["model"] == "relu" and result["rows"][0]["ok"] == 200
    assert "200 ok (100.0 %), 0 shed (0.0 %" in r.stderr
    # the server counted them: the statistics say 200 more inferences of relu
    assert result["server_profile"]["levels"]["all"]["compute_us_per_row"] > 0


@pytest.mark.parametrize("frontend", ["fast", "aiohttp"])
def test_infer_alias_on_both_rest_frontends(frontend):
    with InferenceServer("builtin:relu", "--rest-frontend", frontend, admin=False) as server:
        body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 256], "datatype": "FP32",
                                       "data": [-1.0, 2.0] * 128}]}).encode()
        for path in ("/infer", "/v2/infer"):
            with urllib.request.urlopen(urllib.request.Request(f"http://{server.http}{path}", data=body,
                                                               method="POST"), timeout=10) as resp:
                doc = json.loads(resp.read())
            assert doc["model_name"] == "relu" and doc["outputs"][0]["data"][:2] == [0.0, 2.0]
        with urllib.request.urlopen(f"http://{server.http}/v2", timeout=10) as resp:
            assert json.loads(resp.read())["default_model"] == "relu"


def test_default_model_must_be_served():
    server = InferenceServer("builtin:relu", "--default-model", "resnet", admin=False)
    with pytest.raises(Exception):
        server.start(timeout=60)
    server.stop()
    assert "--default-model 'resnet': not served here; this server serves 'relu'" in server.log_tail()


def test_a_url_without_a_model_stops_early_naming_the_models(relu):
    for url in (f"http://{relu.http}/nope", f"http://{relu.http}/v2/models/resnet50/infer"):
        r = bench("-c", "4", "-n", "100000", "-u", url, timeout=60)
        assert r.returncode == 2, (url, r.stdout[-500:], r.stderr[-500:])
        assert r.stderr.strip().endswith("; models here: relu"), r.stderr
        assert r.stderr.startswith(f"mcp-bench: no model at {url.replace('/infer', '')}"), r.stderr


SMALL_QUEUES = """apiVersion: scheduling.mcp-mesh.io/v1alpha1
kind: L7SchedulingPolicy
metadata:
  name: small-queues
spec:
  qosPolicy: latency-critical
  queuePolicies:
""" + "".join(f"    {level}:\n      maxQueueSize: 8\n" for level in range(1, 5))


def test_shed_requests_counted_and_the_run_fails_above_the_error_rate(tmp_path):
    """latency-critical with queues of 8 (so the shedding does not hang on how fast this machine
    is today): c=200 against builtin:mlp is mostly answered 429."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(SMALL_QUEUES)
    with InferenceServer("builtin:mlp", "--policy-file", str(policy), admin=False) as server:
        url = f"http://{server.http}/infer"
        r = bench("-c", "200", "-n", "1500", "-u", url, "--output-format", "csv")
        assert r.returncode == 1, r.stderr
        summary = [line for line in r.stderr.splitlines() if " shed (" in line][0]
        shed = int(summary.split(" shed (")[0].rsplit(", ", 1)[1])
        assert shed > 150, summary
        assert "above --max-error-rate 1 %; error classes: overload/http-429=" in r.stderr
        header, row = r.stdout.splitlines()[:2]
        assert int(row.split(",")[header.split(",").index("shed")]) == shed
        # the same run, allowed to shed: exit 0, and still said
        r = bench("-c", "200", "-n", "1500", "-u", url, "--max-error-rate", "1")
        assert r.returncode == 0 and " shed (" in r.stdout, r.stdout[-800:]


def test_no_profiler_columns_without_the_profiler_said_not_zeroed():
    with InferenceServer("builtin:relu", admin=False) as server:
        r = bench("-c", "2", "-n", "50", "-u", f"http://{server.http}/infer", "--output-format", "csv")
    assert r.returncode == 0, r.stderr
    assert "no server profiler columns: the server's profiler is off (mcpctl serve --enable-profiler)" in r.stderr
    header, row = r.stdout.splitlines()[:2]
    cells = dict(zip(header.split(","), row.split(",")))
    assert cells["ipc (ratio)"] == "n/a" and cells["batch_fill_ratio (ratio)"] == "n/a"


def test_bad_max_error_rate_is_a_usage_error():
    r = bench("-u", "http://127.0.0.1:9/infer", "--max-error-rate", "5")
    assert r.returncode == 2 and "--max-error-rate 5.0: a share between 0 and 1" in r.stderr


def test_csv_profiler_columns_per_priority_class(relu):
    r = bench("-c", "4", "-n", "400", "-u", f"http://{relu.http}/infer", "--priority-mix", "high=0.5,low=0.5",
              "--output-format", "csv")
    assert r.returncode == 0, r.stderr
    import csv
    import io
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [row["priority"] for row in rows] == ["all", "high", "low"]
    for row in rows:                       # each class's window of the server's profiler
        assert float(row["batch_fill_ratio (ratio)"]) > 0 and float(row["queue_wait_ms (ms)"]) >= 0, row
        assert float(row["compute_us_per_row (us)"]) > 0, row
    assert int(rows[1]["requests"]) + int(rows[2]["requests"]) == 400


def test_prometheus_has_the_profiler_gauges_and_says_what_is_unavailable(relu):
    from mcp26.inference import hw_counters
    from mcp26.inference.profiler import NEEDS
    relu.metrics()                          # the window starts at this scrape
    assert bench("-c", "4", "-n", "300", "-u", f"http://{relu.http}/infer").returncode == 0
    lines = relu.metrics().splitlines()
    assert any(line.startswith('mcp_profiler_batch_fill_ratio{model_name="relu"} ') for line in lines)
    assert any(line.startswith('mcp_profiler_fused_nodes{model_name="relu"} ') for line in lines)
    available, missing = hw_counters.probe()
    for metric, needs in NEEDS.items():
        gauge = [line for line in lines if line.startswith(f'mcp_profiler_{metric}{{model_name="relu"}}')]
        said = [line for line in lines if line.startswith("mcp_profiler_unavailable{") and f'metric="{metric}"' in line]
        if all(n in available for n in needs):
            assert gauge and not said, metric
        else:                               # no gauge at all (never a 0), and the reason instead
            assert not gauge and said and "perf_event_open" in said[0], (metric, said)
