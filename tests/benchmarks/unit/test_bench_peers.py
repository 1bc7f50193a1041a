"""benchmarks/bench_peers.py's logic, without servers: what it asks mcp-bench
for, how it reads the answer and folds rounds, the ratios and floors it
judges, the table, and the peers' generated configuration."""
from __future__ import annotations

import json
import os

import pytest

from benchmarks import bench_peers as bp
from benchmarks.peers import common, kserve, triton


def run_json(rps, p50, p99, errors=0, classes=None, client_us=None):
    run = {} if client_us is None else {"client_cpu_us_per_request": client_us}
    return json.dumps({"run": run, "rows": [{"throughput_rps": rps, "errors": errors, "error_classes": classes or {},
                                            "latency_ms": {"p50": p50, "p99": p99}}]})


def pt(rps, p50=1.0, p99=2.0, errors=0):
    return {"rps": rps, "p50_ms": p50, "p99_ms": p99, "errors": errors, "error_classes": {}}


def test_parse_run_keeps_throughput_latency_and_errors():
    got = bp.parse_run(run_json(812.5, 1.2, 4.5, 3, {"http_503": 3}, client_us=61.5))
    assert got == {"rps": 812.5, "p50_ms": 1.2, "p99_ms": 4.5, "errors": 3, "error_classes": {"http_503": 3},
                   "client_us": 61.5}
    assert bp.parse_run(run_json(1, 1, 1))["client_us"] is None     # an mcp-bench that does not say


def test_median_point_takes_each_figures_median_and_sums_errors():
    runs = [pt(100, 1, 9), pt(300, 3, 7, errors=2), pt(200, 2, 8)]
    runs[1]["error_classes"] = {"timeout": 2}
    m = bp.median_point(runs)
    assert (m["rps"], m["p50_ms"], m["p99_ms"], m["errors"]) == (200, 2, 8, 2)
    assert m["error_classes"] == {"timeout": 2} and len(m["rounds"]) == 3


def test_median_point_skips_missing_latencies():
    m = bp.median_point([pt(0, None, None, errors=1), pt(50, 4, 6)])
    assert m["p50_ms"] == 4 and m["p99_ms"] == 6


def test_turn_order_rotates_the_first_server():
    labels = ["ours", "triton", "kserve"]
    assert [bp.turn_order(labels, r)[0] for r in range(4)] == ["ours", "triton", "kserve", "ours"]
    assert sorted(bp.turn_order(labels, 1)) == sorted(labels)


def test_bench_argv_rest_and_grpc():
    rest = bp.bench_argv("http://127.0.0.1:1/v2/models/relu", False, 16, 2.0, 256)
    assert rest[rest.index("-c") + 1] == "16" and "--grpc" not in rest
    assert rest[rest.index("--input") + 1] == "INPUT0:FP32:1,256"
    assert rest[rest.index("--output-format") + 1] == "json"
    grpc1 = bp.bench_argv("127.0.0.1:2/v2/models/relu", True, 1, 2.0, 256)
    grpc64 = bp.bench_argv("127.0.0.1:2/v2/models/relu", True, 64, 2.0, 256)
    assert grpc1[grpc1.index("--connections") + 1] == "1"
    assert grpc64[grpc64.index("--connections") + 1] == "4"
    assert int(grpc64[grpc64.index("--warmup") + 1]) >= 64


def test_ratio_is_none_without_clean_figures():
    assert bp.ratio(pt(300), pt(100)) == 3.0
    assert bp.ratio(pt(300), pt(100, errors=1)) is None
    assert bp.ratio(pt(300), None) is None
    assert bp.ratio(pt(300), pt(0)) is None


def point(model, proto, c, **servers):
    return {"model": model, "protocol": proto, "concurrency": c, "servers": servers}


def test_floors_judge_kserve_at_c1_and_every_peer_at_c16_c64():
    points = [
        point("relu", "rest", 1, ours=pt(1000, p50=0.4), kserve=pt(400), triton=pt(2000)),
        point("relu", "grpc", 1, ours=pt(700, p50=0.8), kserve=pt(400)),
        point("mlp", "rest", 1, ours=pt(100), kserve=pt(90)),          # c=1 floor: overhead-bound model only
        point("mlp", "rest", 16, ours=pt(500), triton=pt(400), kserve=pt(600), mlserver=pt(500)),
    ]
    got = {(f["floor"], f["where"]): (f["value"], f["holds"]) for f in bp.floors(points)}
    assert got[(">= 2x KServe at c=1", "relu rest c=1")] == (2.5, True)
    assert got[(">= 2x KServe at c=1", "relu grpc c=1")] == (1.75, False)
    assert got[("REST p50 <= 0.5 ms at c=1", "relu rest c=1")] == (0.4, True)
    assert not any(w == "mlp rest c=1" for _, w in got)
    assert got[("ahead of triton", "mlp rest c=16")] == (1.25, True)
    assert got[("ahead of kserve", "mlp rest c=16")][1] is False
    assert got[("ahead of mlserver", "mlp rest c=16")] == (1.0, False)   # level is not ahead


def test_table_has_a_row_per_point_a_ratio_per_peer_and_the_floors():
    result = {"servers": {"ours": {}, "kserve": {}, "mlserver": {}},
              "points": [point("relu", "rest", 16, ours=pt(900, 1.5, 4.0), kserve=pt(300, 5.0, 12.0),
                               mlserver={**pt(0, None, None, errors=5), "error_classes": {"x": 5}})],
              "unavailable": {"triton": "cannot install"}}
    result["floors"] = bp.floors(result["points"])
    text = bp.table(result)
    row = next(line for line in text.splitlines() if line.startswith("relu"))
    assert "900/s 1.50/4.00" in row and "300/s 5.00/12 x3.00" in row and "failed" in row
    assert "floor ahead of kserve" in text and "holds" in text and "MISSED" in text
    assert "triton: unavailable: cannot install" in text


def test_parse_args_defaults_and_env(monkeypatch):
    a = bp.parse_args([])
    assert a.peers == list(bp.PEERS) and a.models == ["relu", "mlp"] and a.concurrency == [1, 16, 64]
    monkeypatch.setenv("PEERS", "kserve")
    monkeypatch.setenv("PEER_CONCURRENCY", "1,8")
    a = bp.parse_args(["--protocols", "grpc"])
    assert a.peers == ["kserve"] and a.concurrency == [1, 8] and a.protocols == ["grpc"]
    assert bp.parse_args(["--peers", ""]).peers == []
    with pytest.raises(SystemExit):
        bp.parse_args(["--peers", "torchserve"])


def test_relu_model_is_one_relu_node_with_a_batch_dimension():
    import onnx
    m = bp.build_relu()
    onnx.checker.check_model(m)
    assert [n.op_type for n in m.graph.node] == ["Relu"]
    dims = m.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch" and dims[1].dim_value == 256


def test_triton_model_config_leaves_the_batch_dimension_out():
    spec = bp.model_spec("mlp", "/m/mlp.onnx")
    cfg = triton.model_config("mlp", "/m/mlp.onnx", spec["inputs"], spec["outputs"], 32, 0)
    assert 'name: "INPUT0" data_type: TYPE_FP32 dims: [ 64 ]' in cfg
    assert 'name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ]' in cfg
    assert "max_batch_size: 32" in cfg and "max_queue_delay_microseconds: 0" in cfg
    assert 'backend: "python"' in cfg and 'string_value: "/m/mlp.onnx"' in cfg
    unbatched = triton.model_config("mlp", "/m/mlp.onnx", spec["inputs"], spec["outputs"], 0, 0)
    assert "dims: [ -1, 64 ]" in unbatched and "dynamic_batching" not in unbatched
    assert "instance_group [ { kind: KIND_CPU count: 1 } ]" in cfg
    two = triton.model_config("mlp", "/m/mlp.onnx", spec["inputs"], spec["outputs"], 32, 0, intra_op_threads=1,
                              instances=2)
    assert "instance_group [ { kind: KIND_CPU count: 2 } ]" in two and 'string_value: "1"' in two


def test_triton_settings_from_the_environment_are_checked(monkeypatch):
    monkeypatch.setenv("PEER_TRITON_MLP", "32,0,2,1")
    assert bp._triton("mlp", (32, 0, 1, 0)) == (32, 0, 2, 1)
    monkeypatch.setenv("PEER_TRITON_MLP", "32,0")
    with pytest.raises(SystemExit, match="PEER_TRITON_MLP='32,0': expected MAX_BATCH"):
        bp._triton("mlp", (32, 0, 1, 0))


def test_venv_marker_must_match_the_requirements(tmp_path):
    venv = str(tmp_path / "v")
    assert not common.venv_ready(venv, ["a==1"])
    os.makedirs(venv)
    with open(os.path.join(venv, "mcp-peer.json"), "w") as f:
        json.dump({"requirements": ["a==1"]}, f)
    assert common.venv_ready(venv, ["a==1"])
    assert not common.venv_ready(venv, ["a==2"])


def test_kserve_private_netns_check_reads_interfaces():
    dev = ("Inter-|   Receive\n face |bytes    packets\n"
           "    lo: 1 2 0 0 0 0 0 0 1 2 0 0 0 0 0 0\n  eth0: 1 2 0 0 0 0 0 0 1 2 0 0 0 0 0 0\n")
    assert kserve.interfaces(dev) == ["lo", "eth0"]
    assert kserve.interfaces(dev.replace("  eth0: 1 2 0 0 0 0 0 0 1 2 0 0 0 0 0 0\n", "")) == ["lo"]


def test_a_peer_in_two_layouts_is_judged_by_the_better_one():
    points = [point("relu", "grpc", 64, ours=pt(6000), triton=pt(5000), **{"triton-x2": pt(5800)}),
              point("relu", "grpc", 16, ours=pt(4000), triton=pt(3500), **{"triton-x2": pt(4200)}),
              point("mlp", "rest", 16, ours=pt(2000), triton=pt(1000))]
    got = {f["where"]: f for f in bp.floors(points) if f["floor"] == "ahead of triton"}
    assert not any(f["floor"] == "ahead of triton-x2" for f in bp.floors(points))
    assert (got["relu grpc c=64"]["value"], got["relu grpc c=64"]["against"]) == (1.03, "triton-x2")
    assert got["relu grpc c=64"]["holds"]
    assert (got["relu grpc c=16"]["value"], got["relu grpc c=16"]["holds"]) == (0.95, False)
    assert (got["mlp rest c=16"]["value"], got["mlp rest c=16"]["against"]) == (2.0, "triton")
    result = {"servers": {"ours": {}, "triton": {}, "triton-x2": {}}, "points": points, "unavailable": {}}
    result["floors"] = bp.floors(points)
    text = bp.table(result)
    assert "triton-x2 (ours/it)" in text.splitlines()[0]
    assert "MISSED (its best layout here: triton-x2)" in text


def test_our_flags_per_protocol_and_their_overrides(monkeypatch):
    relu = bp.model_spec("relu", "/m/relu.onnx")
    rest, grpc = bp.server_config("ours", relu, "rest"), bp.server_config("ours", relu, "grpc")
    assert rest[rest.index("--workers") + 1] == "2" and grpc[grpc.index("--workers") + 1] == "2"
    assert bp.server_config("triton", relu, "grpc") == bp.server_config("triton", relu, "rest")
    monkeypatch.setenv("PEER_OURS_FLAGS_RELU", "--workers 3")
    monkeypatch.setenv("PEER_OURS_FLAGS_RELU_GRPC", "--workers 4")
    assert bp._ours("relu", {"rest": "a", "grpc": "b"}) == {"rest": ["--workers", "3"], "grpc": ["--workers", "4"]}
    monkeypatch.setenv("PEER_TRITON_X2_RELU", "64,0,4,1")
    assert bp._triton("relu", (64, 0, 2, 1), "PEER_TRITON_X2") == (64, 0, 4, 1)


def test_the_clients_own_cpu_bounds_c1_and_the_table_says_how_far():
    ours = {**pt(1700), "client_us": 435.0}
    points = [point("relu", "grpc", 1, ours=ours, kserve=pt(1300))]
    assert bp.median_point([{**pt(1), "client_us": 400.0}, {**pt(2), "client_us": 500.0}])["client_us"] == 450.0
    result = {"servers": {"ours": {}, "kserve": {}}, "points": points, "unavailable": {}}
    result["floors"] = bp.floors(points)
    text = bp.table(result)
    assert "mcp-bench spent 435 us of CPU a request against ours: no server passes 2299 req/s with it " \
           "(1.77x KServe's 1300); 2x KServe leaves -50 us a round trip for the server and the kernel" in text


def test_our_two_layouts_are_judged_by_the_better_one_as_the_peers_are():
    points = [point("mlp", "rest", 64, ours=pt(3000), **{"ours-x2": pt(3300)}, triton=pt(3100),
                    **{"triton-x2": pt(3050)}),
              point("mlp", "rest", 16, ours=pt(2600), **{"ours-x2": pt(2100)}, triton=pt(2200)),
              point("mlp", "grpc", 64, ours=pt(2400), **{"ours-x2": pt(0, errors=3)}, triton=pt(2300))]
    got = {f["where"]: f for f in bp.floors(points) if f["floor"] == "ahead of triton"}
    assert (got["mlp rest c=64"]["value"], got["mlp rest c=64"]["against"]) == (1.06, "triton")
    assert got["mlp rest c=16"]["value"] == 1.18
    assert got["mlp grpc c=64"]["value"] == 1.04        # a failed layout is not "the better"
    result = {"servers": {"ours": {}, "ours-x2": {}, "triton": {}, "triton-x2": {}}, "points": points[:1],
              "unavailable": {}}
    result["floors"] = bp.floors(points[:1])
    row = next(line for line in bp.table(result).splitlines() if line.startswith("mlp"))
    assert "3100/s 1.00/2.00 x1.06" in row          # the peer's cell: the better of ours over it
    relu = bp.model_spec("relu", "/m/relu.onnx")
    assert not bp.serves("ours-x2", relu)                          # no second layout for relu
    assert all(bp.serves(s, relu) for s in ("ours", *bp.PEERS, *bp.REFERENCES))   # every peer runs
    mlp = bp.model_spec("mlp", "/m/mlp.onnx")
    assert bp.server_config("ours-x2", mlp, "rest") == ["--qos-policy", "balanced", "--workers", "2",
                                                        "--intra-op-threads", "1"]


def test_h2load_grpc_counts_calls_that_ended_without_a_message_as_errors():
    # 4 calls answered 200 over 3 ms; a framed answer is 100 + 5 bytes
    rows = [(1000, 200, 250), (2000, 200, 300), (3000, 200, 280), (4000, 200, 260)]
    ok = bp.parse_h2load_grpc("traffic: 1KB (1000) total, 100B (100) headers, 420B (420) data", rows, 100)
    assert ok["errors"] == 0 and ok["calls"] == 4 and ok["rps"] == round(4 / 0.003, 1)
    assert (ok["p50_ms"], ok["p99_ms"]) == (0.27, 0.3)
    # two of them got HTTP 200 with trailers only (a gRPC error): their messages are missing
    bad = bp.parse_h2load_grpc("traffic: 1KB (1000) total, 100B (100) headers, 210B (210) data", rows, 100)
    assert bad["errors"] == 2 and bad["calls"] == 2 and bad["error_classes"] == {"grpc error (no message)": 2}
    none = bp.parse_h2load_grpc("connect failed", [], 100)
    assert none["rps"] == 0 and none["errors"] == 1 and "connect failed" in none["error_classes"]["h2load"]
    argv = bp.h2load_grpc_argv("127.0.0.1:9", "/tmp/call.bin", 2.4, "/tmp/calls.log")
    assert argv[argv.index("-c") + 1] == "1" and argv[argv.index("-D") + 1] == "2"
    assert "content-type: application/grpc" in argv and argv[-1] == "http://127.0.0.1:9" + bp.INFER_PATH
    argv = bp.h2load_grpc_argv("127.0.0.1:9", "/tmp/call.bin", 2.4, "/tmp/calls.log", c=64)
    assert (argv[argv.index("-c") + 1], argv[argv.index("-m") + 1]) == ("4", "16")     # 64 calls in flight


def test_the_h2load_point_has_its_own_floor_and_row():
    points = [point("relu", "grpc", 1, ours=pt(1800), kserve=pt(1250)),
              {**point("relu", "grpc", 1, ours=pt(3300), kserve=pt(2000)), "client": "h2load"}]
    got = {f["where"]: f["value"] for f in bp.floors(points) if f["floor"] == ">= 2x KServe at c=1"}
    assert got == {"relu grpc c=1": 1.44, "relu grpc c=1 h2load": 1.65}
    result = {"servers": {"ours": {}, "kserve": {}}, "points": points, "unavailable": {}}
    result["floors"] = bp.floors(points)
    rows = [line for line in bp.table(result).splitlines() if line.startswith("relu")]
    assert len(rows) == 2 and rows[1].split()[2:4] == ["1", "h2load"] and "x1.65" in rows[1]


def test_a_server_that_died_is_started_again_and_the_point_says_so():
    import subprocess as sp

    class Dies:
        """A stand-in for a peer: start() runs a process (`sleep`)."""
        def __init__(self):
            self.proc, self.starts = sp.Popen(["sleep", "30"]), 0

        def start(self):
            self.starts += 1
            self.proc = sp.Popen(["sleep", "30"])
            return self

    srv = Dies()
    calls = []

    def run_one(s):
        calls.append(s.proc.pid if s.proc else None)
        if len(calls) == 1:                 # it dies during its first run
            s.proc.kill()
            s.proc.wait()
            s.proc = sp.Popen(["false"])
            s.proc.wait()
            return {**pt(0), "errors": 1, "error_classes": {"x": 1}}
        return pt(100)

    try:
        out = bp.measure_point({"triton": srv}, 3, run_one)["triton"]
    finally:
        srv.proc.kill()
    assert srv.starts == 1 and len(out["restarted"]) == 1 and "exited with status 1" in out["restarted"][0]
    assert out["errors"] == 1 and [r["rps"] for r in out["rounds"]] == [0, 100, 100]
    points = [{"model": "relu", "protocol": "grpc", "concurrency": 16, "client": "h2load",
               "servers": {"ours": pt(200), "triton": out}}]
    table = bp.table({"points": points, "servers": {"ours": {}, "triton": {}}, "unavailable": {},
                      "floors": bp.floors(points)})
    assert "triton died before a run at relu grpc c=16 h2load and was started again" in table
