"""`mcpctl serve` against the model servers users would pick instead, side by
side in one run: Triton Inference Server, KServe's ModelServer and MLServer.

Run from the repo root: `python -m benchmarks peers` (or
`python -m benchmarks.bench_peers --help` for the knobs). Prints one table and
writes artifacts/bench/peers.json.

- Models, the same ONNX file for every server: `relu`, one Relu node on FP32
  [-1, 256] (overhead-bound: onnxruntime runs it in microseconds, so the
  figure is the server), and `mlp` (builtin:mlp, compute-bound: batch 1
  reads 77 MB of weights; batching pays).
- Servers, each with the batching it does best (BATCHING below): ours
  (`mcpctl serve` as it is on disk; relu `--workers 2`; mlp one process with
  2 ONNX threads and batches of up to 64, split into two one-thread
  instances under heavier load, and as `ours-x2` two worker processes of
  one thread each; as with Triton's layouts, a point is judged by the better
  of ours); Triton (the tritonserver PyTriton ships,
  which carries only the python backend: the ONNX file runs in onnxruntime
  inside a python-backend model, under Triton's dynamic batcher) in both of
  its instance layouts, `triton` (instance_group count 1 on onnxruntime's
  threads) and `triton-x2` (count 2 of one thread each): each is ahead of
  the other somewhere, so a point's floor is judged against the better of
  the two; KServe's
  ModelServer (onnxruntime in a sync predict(); its Python server has no
  batcher, KServe batches in a sidecar); MLServer (its adaptive batching,
  with the onnxruntime runtime of benchmarks/peers). Each peer lives in a venv
  of its own under .cache/peers/NAME, installed from PyPI on first run.
- Load: mcp-bench (closed loop, c requests in flight, one keep-alive
  connection each over REST; over gRPC one channel at c=1 and 4 above) for
  `--seconds` per run; each point is the median of `--rounds` runs, the
  servers taking turns run by run (rotated each round), so a burst of other
  work on this shared machine falls on every server alike. mcp-bench's gRPC
  client is its own HTTP/2 one (inference_backend/bench/h2_grpc.py, ~60 µs
  of CPU a call at c=1, ~20 at c=16); the relu gRPC points are also run with
  h2load (nghttp2's C client: 1 connection at c=1, else 4 with c/4 streams
  each) sending one serialized ModelInferRequest as a gRPC call (`client:
  h2load` in the JSON, `16 h2load` in the table): each answer's message is
  counted in h2load's DATA bytes, so a call that ended in a gRPC error
  (trailers only, HTTP 200) counts as an error.
- Isolation: everything (servers and load) runs in a private network
  namespace with only `lo` up, created here and removed at the end: KServe's
  ModelServer binds 0.0.0.0 and nothing may listen on a public address.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from benchmarks import h2load_log
from mcp26.serving.executables import executable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = ("triton", "triton-x2", "kserve", "mlserver")
# Layouts of one peer: the floors judge ours against the best of them at each point.
SAME_PEER = {"triton-x2": "triton"}
# Not a peer (never judged): a bare grpc.aio ModelInfer handler, gRPC points only
# (benchmarks/peers/grpc_aio_floor.py) - the ceiling of any Python grpc.aio server.
REFERENCES = ("grpc-floor",)
# Our layouts: the floors take the better of them at each point, as they take Triton's.
OURS = ("ours", "ours-x2")
SERVERS = OURS + PEERS + REFERENCES
MODELS = ("relu", "mlp")
PROTOCOLS = ("rest", "grpc")
CONCURRENCY = (1, 16, 64)

RELU_WIDTH = 256
MLP_IN, MLP_OUT = 64, 16

def _triton(model: str, default: tuple, env: str = "PEER_TRITON") -> tuple:
    """Triton's settings for `model`: (max_batch_size, max_queue_delay_microseconds,
    instance_group count, intra_op_threads per instance; 0: onnxruntime's default, all
    cores). Env PEER_TRITON_MLP="32,0,2,1" (or _RELU; PEER_TRITON_X2_MLP for triton-x2) overrides."""
    name = f"{env}_{model.upper()}"
    raw = os.environ.get(name)
    if not raw:
        return default
    parts = raw.split(",")
    if len(parts) != 4 or not all(p.strip().isdigit() for p in parts):
        raise SystemExit(f"{name}={raw!r}: expected MAX_BATCH,QUEUE_DELAY_US,INSTANCES,INTRA_OP_THREADS "
                         f"(four integers, e.g. 32,0,2,1)")
    return tuple(int(p) for p in parts)


# Per model, what each server does best with it (what was tried here is in
# inference-backend/README.md "Against the peers"). Ours: an
# L7SchedulingPolicy preset (balanced, the default), per protocol; for the
# overhead-bound relu two worker processes on the same ports over both
# protocols (--workers 2: one per core of this machine, as Triton's front end
# and instance threads use both; gRPC had one while mcp-bench's grpcio client
# took a core of its own, and went to two with mcp-bench's own client, which
# leaves the server the cores: relu gRPC c=64 12,000 -> 21,000 req/s from
# h2load); for the memory-bound mlp one
# process with both cores as ONNX threads (its batches then read the weights
# once for all in flight), --max-batch 64 (on the 2-core VM of 2026-12-05 22:00
# a row costs 196 us of CPU in a batch of 64 against 261 in one of 32,
# `python -m benchmarks gemm`; MLP c=64 1.12-1.14x the req/s of 32 split, same
# run; Triton offered 64 did not gain: 0.94x REST, 1.02x gRPC of its 32) and
# --split-under-load (two one-thread instances once more than 1.25 batches
# wait, here above c=64; the trades are measured in the README); env
# PEER_OURS_FLAGS_RELU / _MLP override (PEER_OURS_FLAGS_RELU_GRPC one
# protocol's). Triton: max_batch_size and max_queue_delay_microseconds of its
# dynamic batcher (0: a batch leaves as soon as an instance is free, with
# whatever queued meanwhile), as one instance on onnxruntime's threads
# (`triton`) and as two of one thread each (`triton-x2`: ahead of count 1 at
# c=64, behind at c=16); env PEER_TRITON_RELU / _MLP and PEER_TRITON_X2_RELU /
# _MLP override. MLServer: its adaptive batcher (max_batch_size,
# max_batch_time in us; None: off) and parallel_workers (0: inference on its
# event loop, which an overhead-bound model prefers to a hop to a worker
# process; 1: one worker, which with batching did best on the MLP). KServe:
# nothing to set (no batcher in its Python server).
OURS_MLP = "--qos-policy balanced --workers 1 --intra-op-threads 2 --max-batch 64 --split-under-load"
# ours-x2, the MLP only: two worker processes of one ONNX thread each, as Triton's count 2
# (two loops share the front-end work; ahead of the split one at REST c=64, behind below).
OURS_MLP_X2 = "--qos-policy balanced --workers 2 --intra-op-threads 1"


def _ours(model: str, flags: dict[str, str], env: str = "PEER_OURS_FLAGS") -> dict[str, list[str]]:
    """Our flags for `model` per protocol; env PEER_OURS_FLAGS_MODEL (every protocol) and
    PEER_OURS_FLAGS_MODEL_PROTO (one) override (PEER_OURS_X2_FLAGS_... for ours-x2)."""
    every = os.environ.get(f"{env}_{model.upper()}")
    return {proto: os.environ.get(f"{env}_{model.upper()}_{proto.upper()}", every or flags[proto]).split()
            for proto in PROTOCOLS}


BATCHING = {
    "relu": {"ours": _ours("relu", {"rest": "--qos-policy balanced --workers 2",
                                    "grpc": "--qos-policy balanced --workers 2"}),
             "triton": _triton("relu", (64, 0, 1, 0)), "triton-x2": _triton("relu", (64, 0, 2, 1), "PEER_TRITON_X2"),
             "mlserver": {"batch": None, "parallel_workers": 0}},
    "mlp": {"ours": _ours("mlp", {"rest": OURS_MLP, "grpc": OURS_MLP}),
            "ours-x2": _ours("mlp", {"rest": OURS_MLP_X2, "grpc": OURS_MLP_X2}, "PEER_OURS_X2_FLAGS"),
            "triton": _triton("mlp", (32, 0, 1, 0)), "triton-x2": _triton("mlp", (32, 0, 2, 1), "PEER_TRITON_X2"),
            "mlserver": {"batch": (32, 2000), "parallel_workers": 1}},
}


# -- models ------------------------------------------------------------------

def build_relu():
    """One Relu node, FP32 INPUT0 [-1, 256] -> OUTPUT0 [-1, 256], built with
    onnx.helper as inference-backend/builtin_models.py builds its models."""
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        [helper.make_node("Relu", ["INPUT0"], ["OUTPUT0"])], "peers_relu",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", RELU_WIDTH])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", RELU_WIDTH])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="mcp-mesh")


def model_files() -> dict[str, str]:
    """The ONNX file of each model: the built-in where the server has one,
    else (relu) built here into the same cache."""
    from mcp26.inference import builtin_models
    out = {"mlp": builtin_models.builtin_path("mlp")}
    if "relu" in builtin_models.BUILDERS:
        out["relu"] = builtin_models.builtin_path("relu")
    else:
        import onnx
        path = os.path.join(builtin_models.cache_dir(), "peers-relu.onnx")
        if not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            onnx.save(build_relu(), path)
        out["relu"] = path
    return out


def model_spec(name: str, path: str) -> dict:
    width_in, width_out = (RELU_WIDTH, RELU_WIDTH) if name == "relu" else (MLP_IN, MLP_OUT)
    return {"name": name, "onnx_path": path,
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, width_in]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, width_out]}]}


# -- servers -----------------------------------------------------------------

class Ours:
    """`mcpctl serve` (as it is on disk) with the model's preset."""

    label = "ours"

    def __init__(self, model: dict, flags: list[str]):
        from mcp26.demo.stack.ports import free_port
        from mcp26.inference.bench.serve_process import ServeProcess
        self.flags = flags
        self.proc = ServeProcess(model["onnx_path"], free_port(), free_port(), "--name", model["name"], *flags)
        self.version = f"mcpctl serve @ {git_version()} ({' '.join(flags)})"

    def start(self):
        self.proc.start(timeout=90)
        return self

    def rest_url(self, model: str) -> str:
        return f"http://127.0.0.1:{self.proc.http_port}/v2/models/{model}"

    def grpc_url(self, model: str) -> str:
        return f"127.0.0.1:{self.proc.grpc_port}/v2/models/{model}"

    def stop(self) -> None:
        self.proc.stop()


class GrpcFloor:
    """The `grpc-floor` reference: benchmarks/peers/grpc_aio_floor.py in our venv, gRPC only."""

    label = "grpc-floor"
    protocols = ("grpc",)
    version = "bare grpc.aio + uvloop handler running onnxruntime (benchmarks/peers/grpc_aio_floor.py)"

    def __init__(self, model: dict):
        from mcp26.demo.stack.ports import free_port
        self.model, self.port, self.proc = model, free_port(), None

    def start(self):
        script = os.path.join(ROOT, "benchmarks", "peers", "grpc_aio_floor.py")
        self.proc = subprocess.Popen([sys.executable, script, self.model["name"], self.model["onnx_path"],
                                      str(self.port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if self.proc.stdout.readline().strip() != "ready":      # '' if it died
            self.stop()
            raise RuntimeError("grpc-floor did not start")
        return self

    def rest_url(self, model: str) -> str:
        raise ValueError("grpc-floor serves gRPC only")

    def grpc_url(self, model: str) -> str:
        return f"127.0.0.1:{self.port}/v2/models/{model}"

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def git_version() -> str:
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip() or "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def serves(label: str, model: dict) -> bool:
    """Whether `label` runs for `model` at all: every peer does; of our layouts, those
    BATCHING gives the model (ours-x2 is the MLP's only)."""
    return label not in OURS or BATCHING[model["name"]].get(label) is not None


def server_config(label: str, model: dict, proto: str = "rest"):
    """What `label` is started with for `model` over `proto` (BATCHING; None for a server
    with nothing to set): a server whose configuration differs between protocols is
    restarted between them."""
    got = BATCHING[model["name"]].get(label)
    return got[proto] if label in OURS else got


def make_server(label: str, model: dict, proto: str = "rest"):
    """The server `label` for one model (its batching from BATCHING, for `proto`);
    peers may raise PeerUnavailable (not installable, not startable)."""
    from mcp26.demo.stack.ports import free_port
    batching = BATCHING[model["name"]]
    if label in OURS:
        return Ours(model, server_config(label, model, proto))
    if label == "grpc-floor":
        return GrpcFloor(model)
    if label in ("triton", "triton-x2"):
        from benchmarks.peers.triton import TritonPeer
        max_batch, delay, instances, intra = batching[label]
        return TritonPeer(ROOT, [{**model, "max_batch": max_batch, "max_queue_delay_us": delay,
                                  "instances": instances, "intra_op_threads": intra}],
                          free_port(), free_port(), free_port())
    if label == "kserve":
        from benchmarks.peers.kserve import KServePeer
        return KServePeer(ROOT, [model], free_port(), free_port())
    if label == "mlserver":
        from benchmarks.peers.mlserver import MLServerPeer
        size, delay = batching["mlserver"]["batch"] or (0, 0)
        return MLServerPeer(ROOT, model["name"], model["onnx_path"], model["inputs"], model["outputs"],
                            free_port(), free_port(), free_port(), max_batch_size=size,
                            max_batch_time_s=delay / 1e6,
                            parallel_workers=batching["mlserver"]["parallel_workers"])
    raise ValueError(f"unknown server {label!r}")


def install_peers(peers: list[str]) -> dict[str, str]:
    """Create the peers' venvs (needs PyPI, so before entering the namespace);
    returns {peer: why it cannot run} for those that failed."""
    from benchmarks.peers import kserve, mlserver, triton
    from benchmarks.peers.common import PeerUnavailable, ensure_venv
    reqs = {"triton": triton.REQUIREMENTS, "kserve": kserve.REQUIREMENTS, "mlserver": mlserver.REQUIREMENTS}
    failed = {}
    for p in peers:
        venv = SAME_PEER.get(p, p)
        try:
            ensure_venv(ROOT, venv, reqs[venv])
        except PeerUnavailable as e:
            failed[p] = str(e)
    return failed


# -- the private network namespace -------------------------------------------

NETNS_PREFIX = "mcppeers"


def create_netns() -> str:
    """A namespace of our own with only `lo` up; the creator's pid in the name
    so that a later run removes only those whose creator is gone."""
    remove_stale_netns()
    name = f"{NETNS_PREFIX}{os.getpid()}x{uuid.uuid4().hex[:4]}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True, capture_output=True)
    except subprocess.CalledProcessError:
        remove_netns(name)
        raise
    return name


def remove_netns(name: str) -> None:
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


def remove_stale_netns() -> None:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        name = (line.split() or [""])[0]
        pid = name[len(NETNS_PREFIX):].split("x")[0] if name.startswith(NETNS_PREFIX) else ""
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            remove_netns(name)


# -- load --------------------------------------------------------------------

def bench_argv(url: str, grpc: bool, c: int, seconds: float, width: int) -> list[str]:
    """mcp-bench's command line for one run (inputs given: the peers' metadata differ)."""
    exe = executable("mcp-bench")
    argv = [exe, "-u", url, "-c", str(c), "--duration", str(seconds), "--warmup", str(max(20, 2 * c)),
            "--input", f"INPUT0:FP32:1,{width}", "--timeout", "10", "--output-format", "json",
            "--max-error-rate", "1"]       # errors are counted in the point (parse_run), not an exit code
    if grpc:
        argv += ["--grpc", "--connections", "1" if c == 1 else "4"]
    return argv


def parse_run(out: str) -> dict:
    """One mcp-bench JSON result -> the point this benchmark keeps."""
    res = json.loads(out)
    row = res["rows"][0]
    return {"rps": row["throughput_rps"], "p50_ms": row["latency_ms"]["p50"], "p99_ms": row["latency_ms"]["p99"],
            "errors": row["errors"], "error_classes": row.get("error_classes") or {},
            "client_us": res["run"].get("client_cpu_us_per_request")}


def run_load(argv: list[str], timeout: float) -> dict:
    """mcp-bench in a process of its own: its Python work stays out of ours."""
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        return {"rps": 0.0, "p50_ms": None, "p99_ms": None, "errors": 1, "client_us": None,
                "error_classes": {"mcp-bench": (p.stderr or p.stdout).strip()[-300:]}}
    return parse_run(p.stdout)


# The relu gRPC c=1 point again with a C client (module docstring): where it applies.
# Also run with h2load (nghttp2's C client): relu gRPC, every c. The overhead-bound model's
# figure is the server's, so the client must not be what bounds it: grpcio's client once hid
# that Triton's C++ front end was ahead of ours at c=16 and c=64 (README, "mcp-bench's own gRPC client").
H2LOAD_MODEL_PROTO = ("relu", "grpc")
H2LOAD_CONNECTIONS = 4          # above c=1, as mcp-bench's --connections: c/4 streams on each
INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"


def grpc_message(model: dict) -> bytes:
    """One serialized ModelInferRequest for `model`: batch 1, raw_input_contents (as mcp-bench sends)."""
    import numpy as np
    from mcp26.inference.protos import grpc_service_pb2 as pb
    width = RELU_WIDTH if model["name"] == "relu" else MLP_IN
    req = pb.ModelInferRequest(model_name=model["name"])
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, width])
    req.raw_input_contents.append(np.random.default_rng(1).standard_normal(width).astype("<f4").tobytes())
    return req.SerializeToString()


def answer_length(authority: str, message: bytes) -> int:
    """One call with grpcio: the length of the server's answer (RuntimeError on a non-OK status)."""
    import grpc
    with grpc.insecure_channel(authority) as channel:
        call = channel.unary_unary(INFER_PATH, request_serializer=None, response_deserializer=None)
        try:
            return len(call(message, timeout=10))
        except grpc.RpcError as e:
            raise RuntimeError(f"gRPC ModelInfer on {authority}: {e.code().name} {e.details()}") from None


def h2load_grpc_argv(authority: str, body_path: str, seconds: float, log: str, c: int = 1) -> list[str]:
    conns = 1 if c == 1 else min(c, H2LOAD_CONNECTIONS)
    return ["h2load", "-c", str(conns), "-m", str(max(1, c // conns)), "-D", str(max(1, round(seconds))),
            "--warm-up-time", "1", f"--log-file={log}",
            "-d", body_path, "-H", "content-type: application/grpc", "-H", "te: trailers",
            f"http://{authority}{INFER_PATH}"]


def parse_h2load_grpc(out: str, log_rows: list[tuple[int, int, int]], answer_bytes: int) -> dict:
    """h2load's summary and per-request log (benchmarks/h2load_log.py) -> a point. A call counts
    as answered when it got HTTP 200 and its message: h2load's DATA bytes short of one framed
    answer (5-byte prefix + message) per 200 are calls that ended without one (a gRPC error)."""
    got = h2load_log.summary(log_rows)
    framed = answer_bytes + 5
    m = re.search(r"\((\d+)\) data", out)
    data = int(m.group(1)) if m else 0
    missing = max(0, round((got["ok"] * framed - data) / framed))
    errors = got["errors"] + missing
    if not got["ok"]:
        return {"rps": 0.0, "p50_ms": None, "p99_ms": None, "errors": max(errors, 1), "client_us": None,
                "error_classes": {"h2load": out.strip()[-300:]}}
    rps = (got["ok"] - missing) / got["span_s"] if got["span_s"] > 0 else 0.0
    return {"rps": round(rps, 1), "p50_ms": got["p50_ms"], "p99_ms": got["p99_ms"], "errors": errors,
            "client_us": None, "error_classes": {"grpc error (no message)": missing} if missing else {},
            "calls": got["ok"] - missing}


def run_h2load_grpc(authority: str, message: bytes, seconds: float, c: int = 1) -> dict:
    """A gRPC point with h2load: c calls in flight (one connection at c=1, else 4 with c/4 streams each)."""
    try:
        answer_bytes = answer_length(authority, message)
    except RuntimeError as e:
        return {"rps": 0.0, "p50_ms": None, "p99_ms": None, "errors": 1, "client_us": None,
                "error_classes": {"grpc": str(e)[:300]}}
    with tempfile.TemporaryDirectory(prefix="h2load-grpc-") as tmp:
        body, log = os.path.join(tmp, "call.bin"), os.path.join(tmp, "calls.log")
        with open(body, "wb") as fh:            # the message as one gRPC frame
            fh.write(b"\x00" + len(message).to_bytes(4, "big") + message)
        p = subprocess.run(h2load_grpc_argv(authority, body, seconds, log, c), capture_output=True, text=True,
                           timeout=seconds + 60)
        rows = h2load_log.read(log) if os.path.exists(log) else []
    return parse_h2load_grpc(p.stdout + p.stderr, rows, answer_bytes)


def median_point(runs: list[dict]) -> dict:
    """The median of each figure over a point's rounds (errors summed)."""
    def med(key):
        vals = [r[key] for r in runs if r.get(key) is not None]
        return statistics.median(vals) if vals else None
    classes: dict = {}
    for r in runs:
        for k, v in r["error_classes"].items():
            classes[k] = v if isinstance(v, str) else classes.get(k, 0) + v
    return {"rps": med("rps"), "p50_ms": med("p50_ms"), "p99_ms": med("p99_ms"),
            "client_us": med("client_us") if any("client_us" in r for r in runs) else None,
            "errors": sum(r["errors"] for r in runs), "error_classes": classes,
            "rounds": [{k: r[k] for k in ("rps", "p50_ms", "p99_ms")} for r in runs]}


def turn_order(labels: list[str], round_no: int) -> list[str]:
    """Servers take turns, the first rotating each round."""
    k = round_no % len(labels) if labels else 0
    return labels[k:] + labels[:k]


# -- results -----------------------------------------------------------------

def ratio(ours: dict | None, peer: dict | None) -> float | None:
    """Our throughput over the peer's; None where either has no clean figure."""
    if not ours or not peer or ours["errors"] or peer["errors"] or not ours["rps"] or not peer["rps"]:
        return None
    return round(ours["rps"] / peer["rps"], 2)


def floors(points: list[dict]) -> list[dict]:
    """Issue 16 item 1's floors on these points: >= 2x KServe's throughput at
    c=1 (the overhead-bound model), ahead of every peer at c=16 and c=64
    (both models); and, for reference, REST c=1 p50 <= 0.5 ms (relu)."""
    out = []
    for p in points:
        key = f"{p['model']} {p['protocol']} c={p['concurrency']}{client_tag(p)}"
        servers = {**p["servers"], "ours": best_of_ours(p["servers"])}
        if p["concurrency"] == 1 and p["model"] == "relu" and "kserve" in servers:
            r = ratio(servers.get("ours"), servers["kserve"])
            out.append({"floor": ">= 2x KServe at c=1", "where": key, "value": r,
                        "holds": r is not None and r >= 2})
        if p["concurrency"] == 1 and p["model"] == "relu" and p["protocol"] == "rest" and servers.get("ours"):
            p50 = servers["ours"]["p50_ms"]
            out.append({"floor": "REST p50 <= 0.5 ms at c=1", "where": key, "value": p50,
                        "holds": p50 is not None and p50 <= 0.5})
        if p["concurrency"] in (16, 64):
            for peer in PEERS:
                if peer in SAME_PEER:
                    continue
                layouts = [s for s in PEERS if s in servers and SAME_PEER.get(s, s) == peer]
                if not layouts:
                    continue
                ratios = {s: ratio(servers.get("ours"), servers[s]) for s in layouts}
                r = None if None in ratios.values() else min(ratios.values())   # against its best layout
                best = min(ratios, key=lambda s: ratios[s] if ratios[s] is not None else 0)
                out.append({"floor": f"ahead of {peer}", "where": key, "value": r, "against": best,
                            "holds": r is not None and r > 1})
    return out


def client_tag(point: dict) -> str:
    """'' for mcp-bench (every point), ' h2load' for the C client's."""
    client = point.get("client", "mcp-bench")
    return "" if client == "mcp-bench" else f" {client}"


def best_of_ours(servers: dict) -> dict | None:
    """The point of whichever of our layouts answered most (clean runs only)."""
    mine = [servers[s] for s in OURS if servers.get(s) and not servers[s]["errors"] and servers[s]["rps"]]
    return max(mine, key=lambda pt: pt["rps"]) if mine else servers.get("ours")


def cell(pt: dict | None, ours: dict | None = None) -> str:
    if pt is None:
        return "-"
    if pt["errors"] and not pt["rps"]:
        return "failed"
    fmt = lambda v: "-" if v is None else (f"{v:.2f}" if v < 10 else f"{v:.0f}")  # noqa: E731
    s = f"{pt['rps']:.0f}/s {fmt(pt['p50_ms'])}/{fmt(pt['p99_ms'])}"
    if pt["errors"]:
        s += f" ({pt['errors']} err)"
    if ours is not None:
        r = ratio(ours, pt)
        s += f" x{r:.2f}" if r is not None else " x-"
    return s


def table(result: dict) -> str:
    """One row per model x protocol x concurrency: each server's req/s and
    p50/p99 (ms); a peer's cell ends with ours / theirs (throughput)."""
    servers = [s for s in SERVERS if s in result["servers"]]
    head = ["model", "proto", "c"] + [s if s in OURS else f"{s} (ours/it)" for s in servers]
    rows = []
    for p in result["points"]:
        ours = best_of_ours(p["servers"])
        rows.append([p["model"], p["protocol"], f"{p['concurrency']}{client_tag(p)}"] +
                    [cell(p["servers"].get(s), None if s in OURS else ours) for s in servers])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    fmt = lambda r: "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip()  # noqa: E731
    lines = [fmt(head), "  ".join("-" * w for w in widths), *map(fmt, rows)]
    lines.append("cells: req/s p50/p99 ms, then x ours/peer req/s (ours: the better of our layouts there); "
                 "c: mcp-bench's, or h2load's (gRPC from a C client)")
    for f in result["floors"]:
        v = "-" if f["value"] is None else f"{f['value']:.2f}" + (" ms" if "p50" in f["floor"] else "x")
        best = f" (its best layout here: {f['against']})" if f.get("against") in SAME_PEER else ""
        lines.append(f"floor {f['floor']:<26} {f['where']:<22} {v:>9}  {'holds' if f['holds'] else 'MISSED'}{best}")
    for p in result["points"]:
        srv = p["servers"]
        if p["protocol"] == "grpc" and p["concurrency"] == 1 and "grpc-floor" in srv and "kserve" in srv:
            r = ratio(srv["grpc-floor"], srv["kserve"])
            lines.append(f"reference: a bare grpc.aio handler (grpc-floor) does {'-' if r is None else f'{r:.2f}'}x "
                         f"KServe at {p['model']} grpc c=1{client_tag(p)}")
        client = (srv.get("ours") or {}).get("client_us")
        if p["concurrency"] == 1 and p["model"] == "relu" and client and "kserve" in srv and srv["kserve"]["rps"]:
            kserve_rps = srv["kserve"]["rps"]
            lines.append(f"client bound: at {p['model']} {p['protocol']} c=1 mcp-bench spent {client:.0f} us of CPU a "
                         f"request against ours: no server passes {1e6 / client:.0f} req/s with it "
                         f"({1e6 / client / kserve_rps:.2f}x KServe's {kserve_rps:.0f}); 2x KServe leaves "
                         f"{1e6 / (2 * kserve_rps) - client:.0f} us a round trip for the server and the kernel")
    for s, why in result["unavailable"].items():
        lines.append(f"{s}: unavailable: {why[:300]}")
    for p in result["points"]:
        for s, pt in p["servers"].items():
            for note in pt.get("restarted", ()):
                lines.append(f"{s} died before a run at {p['model']} {p['protocol']} c={p['concurrency']}"
                             f"{client_tag(p)} and was started again: {note[:300]}")
    return "\n".join(lines)


# -- run ---------------------------------------------------------------------

def measure_model(model: dict, labels: list[str], protocols: list[str], levels: list[int], seconds: float,
                  rounds: int, result: dict) -> None:
    """Start every server for `model`, run the points, stop them; a server whose
    configuration differs by protocol (server_config) is restarted between protocols."""
    from benchmarks.peers.common import PeerUnavailable
    started: dict = {}          # label -> (its configuration, the running server)
    try:
        width = RELU_WIDTH if model["name"] == "relu" else MLP_IN
        for proto in protocols:
            for label in labels:
                if label in result["unavailable"]:
                    continue
                if not serves(label, model):
                    continue
                config = server_config(label, model, proto)
                if label in started:
                    if started[label][0] == config:
                        continue
                    started.pop(label)[1].stop()
                print(f"  starting {label} ({model['name']}, {proto}) ...", flush=True)
                try:
                    srv = make_server(label, model, proto).start()
                except (PeerUnavailable, RuntimeError, TimeoutError) as e:
                    if label in OURS:
                        raise
                    result["unavailable"][label] = f"{model['name']}: {e}"
                    print(f"  {label} unavailable: {str(e)[:300]}", flush=True)
                    continue
                started[label] = (config, srv)
                versions = result["servers"].setdefault(label, {})
                seen = versions.get(model["name"])
                versions[model["name"]] = srv.version if seen in (None, srv.version) else f"{seen}; {srv.version}"
            for c in levels:
                active = {s: started[s][1] for s in started
                          if proto in getattr(started[s][1], "protocols", PROTOCOLS)}

                def mcp_bench(srv, c=c):
                    url = srv.grpc_url(model["name"]) if proto == "grpc" else srv.rest_url(model["name"])
                    return run_load(bench_argv(url, proto == "grpc", c, seconds, width), timeout=seconds + 60)
                clients = [("mcp-bench", mcp_bench)]
                if (model["name"], proto) == H2LOAD_MODEL_PROTO and shutil.which("h2load"):
                    message = grpc_message(model)
                    clients.append(("h2load", lambda srv, c=c: run_h2load_grpc(
                        srv.grpc_url(model["name"]).split("/")[0], message, seconds, c)))
                for client, run_one in clients:
                    point = {"model": model["name"], "protocol": proto, "concurrency": c, "client": client,
                             "servers": measure_point(active, rounds, run_one)}
                    result["points"].append(point)
                    print(f"  {model['name']} {proto} c={c}{client_tag(point)}: " +
                          "  ".join(f"{s} {cell(p)}" for s, p in point["servers"].items()), flush=True)
    finally:
        for _, srv in started.values():
            srv.stop()


def measure_point(servers: dict, rounds: int, run_one) -> dict:
    """`run_one(server)` for every server, `rounds` times, the servers taking turns; the median of each.
    A server found exited before its run is started again (the run it died in keeps its errors),
    and the point says so under `restarted`."""
    runs: dict[str, list[dict]] = {s: [] for s in servers}
    restarted: dict[str, list[str]] = {}
    for rnd in range(rounds):
        for label in turn_order(list(servers), rnd):
            srv = servers[label]
            note = exit_note(srv)
            if note:
                print(f"  {label} had exited ({note[:300]}); starting it again", flush=True)
                restarted.setdefault(label, []).append(note)
                try:
                    srv.start()
                except Exception as e:      # noqa: BLE001 - its runs below then fail and say why
                    restarted[label].append(f"restart failed: {e}"[:600])
            runs[label].append(run_one(srv))
    out = {s: median_point(r) for s, r in runs.items()}
    for label, notes in restarted.items():
        out[label]["restarted"] = notes
    return out


def exit_note(srv) -> str | None:
    """Why `srv`'s process is gone (its exit status and the tail of its log), or None while it runs."""
    holder = getattr(srv, "proc", None)               # a PeerProcess or ServeProcess, or a Popen
    popen = getattr(holder, "proc", holder)
    if popen is None or not hasattr(popen, "poll") or popen.poll() is None:
        return None
    tail = holder.log_tail() if hasattr(holder, "log_tail") else ""
    return f"exited with status {popen.returncode}: {tail[-600:]}"


def parse_args(argv: list[str]) -> argparse.Namespace:
    env = os.environ.get
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_peers", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", default=env("PEERS", ",".join(PEERS)), help="comma list of triton,triton-x2,kserve,"
                    "mlserver (env PEERS); '' for ours alone")
    ap.add_argument("--references", default=env("PEER_REFERENCES", ",".join(REFERENCES)),
                    help="grpc-floor: a bare grpc.aio server, gRPC points only, not judged (env PEER_REFERENCES; '' none)")
    ap.add_argument("--models", default=env("PEER_MODELS", ",".join(MODELS)), help="relu,mlp (env PEER_MODELS)")
    ap.add_argument("--protocols", default=env("PEER_PROTOCOLS", ",".join(PROTOCOLS)), help="rest,grpc (env PEER_PROTOCOLS)")
    ap.add_argument("--concurrency", default=env("PEER_CONCURRENCY", ",".join(map(str, CONCURRENCY))),
                    help="comma list (env PEER_CONCURRENCY)")
    ap.add_argument("--seconds", type=float, default=float(env("PEER_SECONDS", "2")), help="per run (env PEER_SECONDS)")
    # 3: a median that one slow round cannot move (of 2 it is the mean); MLP REST c=64 read 0.95-1.17x
    # Triton in 2-round runs and 1.10x over 6 rounds of 4 s, each round spread +-10 % (2026-12-05)
    ap.add_argument("--rounds", type=int, default=int(env("PEER_ROUNDS", "3")), help="runs per point, median kept "
                    "(env PEER_ROUNDS)")
    ap.add_argument("--json", default=os.path.join(ROOT, "artifacts", "bench", "peers.json"), help="where to write")
    a = ap.parse_args(argv)
    a.peers = [p for p in a.peers.split(",") if p]
    a.references = [r for r in a.references.split(",") if r]
    a.models = [m for m in a.models.split(",") if m]
    a.protocols = [p for p in a.protocols.split(",") if p]
    a.concurrency = [int(c) for c in a.concurrency.split(",") if c]
    for what, got, known in (("peer", a.peers, PEERS), ("model", a.models, MODELS), ("protocol", a.protocols, PROTOCOLS),
                             ("reference", a.references, REFERENCES)):
        bad = set(got) - set(known)
        if bad:
            ap.error(f"unknown {what} {', '.join(sorted(bad))}; known: {', '.join(known)}")
    if a.seconds <= 0 or a.rounds < 1 or any(c < 1 for c in a.concurrency):
        ap.error("--seconds > 0, --rounds >= 1 and concurrency >= 1")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if os.geteuid() != 0:
        print("bench_peers needs root: it runs every server in a private network namespace", file=sys.stderr)
        return 2
    from harness.bpf_env import in_netns
    t0 = time.monotonic()
    result = {"config": {"peers": args.peers, "references": args.references, "models": args.models, "protocols": args.protocols,
                         "concurrency": args.concurrency, "seconds": args.seconds, "rounds": args.rounds,
                         "batching": BATCHING, "cpus": os.cpu_count()},
              "load_average_start": os.getloadavg(), "servers": {}, "unavailable": {}, "points": []}
    result["unavailable"].update(install_peers(args.peers))
    files = model_files()
    ns = create_netns()
    print(f"network namespace {ns} (lo only); servers and load run inside it", flush=True)
    try:
        with in_netns(ns):
            for name in args.models:
                measure_model(model_spec(name, files[name]), [*OURS, *args.peers, *args.references], args.protocols,
                              args.concurrency, args.seconds, args.rounds, result)
    finally:
        remove_netns(ns)
    result["floors"] = floors(result["points"])
    result["load_average_end"] = os.getloadavg()
    result["wall_s"] = round(time.monotonic() - t0, 1)
    print()
    for s, by_model in result["servers"].items():
        print(f"{s}: {'; '.join(sorted(set(by_model.values())))}")
    print(table(result))
    la0, la1 = result["load_average_start"], result["load_average_end"]
    print(f"\nload average {la0[0]:.2f} at start, {la1[0]:.2f} at end; {result['wall_s']} s")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {os.path.relpath(args.json, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
