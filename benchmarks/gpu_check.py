"""The GPU path, checked on a machine with an NVIDIA GPU: `benchmarks/gpu_check.sh` (installs
`.[gpu]` first) or `python -m benchmarks.gpu_check`. Prints one table; writes
artifacts/bench/gpu_check.json. Meant to finish in well under 10 minutes.

1. Providers: what onnxruntime lists, and what `--device tensorrt:0`, `cuda:0` and `auto`
   really run on (onnxruntime-gpu lists TensorRT even where libnvinfer is absent, and a
   session falls back to the next provider).
2. TensorRT engine cache: builtin:mlp loaded on tensorrt:0 with an empty cache (the
   engine is built) and again (the engine is read from disk): load + warm-up seconds,
   engine files written (inference.runtime.trt_cache_dir).
3. Runs on the GPU, builtin:mlp, median of 200, batch 1, 32 and 256: session.run; I/O
   binding with outputs bound to host memory (runtime.OnnxModel.run_bound, what the server
   uses on a GPU provider); the CPU provider's run beside them; CUDA graph capture and
   replay (enable_cuda_graph, inputs and outputs in device buffers at fixed addresses);
   each checked equal to the CPU's answer.
4. Serving: `mcpctl serve --device auto` on the GPU (the provider its model metadata
   reports), the batching comparison (balanced vs --max-batch 1, c = 32, REST and gRPC,
   mcp-bench), the same balanced load on `--device cpu` (the GPU's gain), and priority
   isolation (the latency-critical preset with its priority worker: a 100/s
   latency-critical stream on the worker's port alone, then beside a 64-wide batch-class
   closed loop on the main port; its p99 ratio, floor <= 2x, as bench_inference judges it).

Without a GPU it says so and exits 0; GPU_CHECK_ALLOW_CPU=1 runs what it can on the
CPU provider (a dry run of the script itself).
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

from mcp26.serving.executables import executable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = int(os.environ.get("GPU_CHECK_RUNS", "200"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "5"))
ROWS: list[tuple[str, str, str]] = []


def row(check: str, value: str, note: str = "") -> None:
    ROWS.append((check, value, note))
    print(f"  {check}: {value}  {note}", flush=True)


def gpu_name() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    p = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                       capture_output=True, text=True)
    return p.stdout.strip().splitlines()[0] if p.returncode == 0 and p.stdout.strip() else None


def median_us(fn, runs: int = RUNS) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def check_providers(ort, path: str) -> str:
    """The best provider that really runs here: onnxruntime-gpu lists TensorRT and CUDA
    whether or not their libraries (libnvinfer, libcudart, cuDNN) can be loaded, and a
    session that cannot load one falls back to the next, so each is tried."""
    available = ort.get_available_providers()
    row("onnxruntime", ort.__version__, ", ".join(available))
    from mcp26.inference import runtime
    plan = [p if isinstance(p, str) else p[0] for p in runtime.provider_plan("auto")]
    row("--device auto offers", " > ".join(plan))
    for device, provider in (("tensorrt:0", "TensorrtExecutionProvider"), ("cuda:0", "CUDAExecutionProvider")):
        if provider not in available:
            continue
        with tempfile.TemporaryDirectory() as cache:       # no engine of an earlier run
            os.environ["MCP_MESH_CACHE"] = cache
            try:
                got = runtime.OnnxModel.load("mlp", "1", path, device, warmup=False).provider
            except Exception as e:
                got = f"{type(e).__name__}: {e}"[:160]
            finally:
                os.environ.pop("MCP_MESH_CACHE", None)
        row(f"--device {device} runs on", got)
    auto = runtime.OnnxModel.load("mlp", "1", path, "auto", warmup=False).provider
    row("--device auto runs on", auto)
    return {"TensorrtExecutionProvider": "tensorrt:0", "CUDAExecutionProvider": "cuda:0"}.get(auto, "cpu")


def check_trt_cache(path: str, device: str) -> None:
    if not device.startswith("tensorrt"):
        row("TensorRT engine cache", "skipped", "TensorRT does not run here (see above)")
        return
    from mcp26.inference import runtime
    with tempfile.TemporaryDirectory() as cache:
        os.environ["MCP_MESH_CACHE"] = cache
        try:
            cold = runtime.OnnxModel.load("mlp", "1", path, device)
            files = sum(len(f) for _, _, f in os.walk(runtime.trt_cache_dir()))
            warm = runtime.OnnxModel.load("mlp", "1", path, device)
        finally:
            os.environ.pop("MCP_MESH_CACHE", None)
    row("TensorRT engine cache", f"cold {cold.load_seconds + cold.warmup_seconds:.2f} s -> "
        f"warm {warm.load_seconds + warm.warmup_seconds:.2f} s", f"{files} files written; provider {warm.provider}")


def check_runs(ort, path: str, device: str) -> None:
    from mcp26.inference import runtime
    cpu = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    on_gpu = device != "cpu"
    model = runtime.OnnxModel.load("mlp", "1", path, "cuda:0" if on_gpu else "cpu")
    row("session for runs", model.provider)
    for batch in (1, 32, 256):
        x = np.random.default_rng(batch).standard_normal((batch, 64)).astype(np.float32)
        want = cpu.run(["OUTPUT0"], {"INPUT0": x})[0]
        plain = median_us(lambda: model.session.run(["OUTPUT0"], {"INPUT0": x}))
        bound = median_us(lambda: model.run_bound({"INPUT0": x}, ["OUTPUT0"]))
        same = np.allclose(model.run_bound({"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"], want, rtol=1e-2, atol=1e-3)
        on_cpu = median_us(lambda: cpu.run(["OUTPUT0"], {"INPUT0": x}))
        row(f"batch {batch}: run / I/O binding", f"{plain:.0f} / {bound:.0f} us",
            f"CPU provider {on_cpu:.0f} us; answers equal the CPU's: {same}")
        if not on_gpu:
            row(f"batch {batch}: CUDA graph", "skipped", "no GPU")
            continue
        graph = ort.InferenceSession(path, providers=[("CUDAExecutionProvider", {"enable_cuda_graph": "1"})])
        x_dev = ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0)
        y_dev = ort.OrtValue.ortvalue_from_shape_and_type([batch, 16], np.float32, "cuda", 0)
        binding = graph.io_binding()
        binding.bind_ortvalue_input("INPUT0", x_dev)
        binding.bind_ortvalue_output("OUTPUT0", y_dev)
        graph.run_with_iobinding(binding)           # captures the graph
        replay = median_us(lambda: graph.run_with_iobinding(binding))
        same = np.allclose(y_dev.numpy(), want, rtol=1e-2, atol=1e-3)
        row(f"batch {batch}: CUDA graph replay", f"{replay:.0f} us", f"answers equal the CPU's: {same}")


def mcp_bench(url: str, *args: str, grpc: bool = False) -> dict:
    cmd = [executable("mcp-bench"), "-u", url, "--output-format", "json",
           "--duration", str(SECONDS), *args] + (["--grpc"] if grpc else [])
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=SECONDS + 120).stdout)


def check_serving(device: str) -> None:
    from mcp26.demo.stack.ports import free_port
    from mcp26.inference.bench.serve_process import ServeProcess
    dev = "auto" if device != "cpu" else "cpu"
    results = {}
    setups = [("balanced", ["--device", dev, "--qos-policy", "balanced"]),
              ("max-batch 1", ["--device", dev, "--max-batch", "1"])]
    if dev != "cpu":        # the same server and load on the CPU provider, for the GPU's gain
        setups.append(("CPU balanced", ["--device", "cpu", "--qos-policy", "balanced"]))
    for name, flags in setups:
        with ServeProcess("builtin:mlp", free_port(), free_port(), *flags) as s:
            with urllib.request.urlopen(s.rest_url, timeout=10) as r:      # what the server says it runs on
                row(f"serve {name}: model on", json.load(r)["execution_provider"])
            for proto, url in (("REST", s.rest_url), ("gRPC", s.grpc_url)):
                r = mcp_bench(url, "-c", "32", "--warmup", "200", grpc=proto == "gRPC")["rows"][0]
                results[(name, proto)] = r
                row(f"serve {name} {proto} c=32", f"{r['throughput_rps']:,.0f} req/s",
                    f"p99 {r['latency_ms']['p99']:.1f} ms")
    for proto in ("REST", "gRPC"):
        a, b = results[("balanced", proto)], results[("max-batch 1", proto)]
        row(f"batching gain {proto}", f"{a['throughput_rps'] / max(b['throughput_rps'], 1e-9):.2f}x", "balanced / max-batch 1")
        if ("CPU balanced", proto) in results:
            c = results[("CPU balanced", proto)]
            row(f"GPU gain {proto}", f"{a['throughput_rps'] / max(c['throughput_rps'], 1e-9):.2f}x",
                f"balanced, GPU / CPU provider; p99 {a['latency_ms']['p99']:.1f} vs {c['latency_ms']['p99']:.1f} ms")
    worker = free_port()        # the judged setup of bench_inference: the top class on its priority worker
    with ServeProcess("builtin:mlp", free_port(), free_port(), "--device", dev, "--qos-policy", "latency-critical",
                      "--priority-http-port", str(worker)) as s:
        high_url = s.rest_url.replace(f":{s.http_port}/", f":{worker}/")
        high = ["--rate", "100", "-c", "8", "--priority-mix", "latency-critical=1"]
        alone = mcp_bench(high_url, *high)["rows"][0]["latency_ms"]["p99"]
        low = subprocess.Popen([executable("mcp-bench"), "-u", s.rest_url,
                                "-c", "64", "--duration", str(SECONDS + 4), "--priority-mix", "low=1",
                                "--output-format", "json"], stdout=subprocess.PIPE, text=True)   # batch class, main port
        time.sleep(2)
        loaded = mcp_bench(high_url, *high)["rows"][0]["latency_ms"]["p99"]
        low_out = json.loads(low.communicate(timeout=SECONDS + 120)[0])["rows"][0]
        row("priority isolation (REST, worker)", f"high p99 {alone:.1f} -> {loaded:.1f} ms = {loaded / alone:.2f}x",
            f"floor <= 2x; low load served {low_out['throughput_rps']:,.0f}/s")


def check_heterogeneous() -> None:
    """Issue 41's rows: ORT's device list, the example repository's vision model placed on the
    GPU, one graph partitioned CPU -> GPU (equal to unsplit; throughput beside the whole graph
    on each device), cut moves, the multimodal ensemble in process."""
    import asyncio
    import numpy as np
    import onnxruntime as ort
    from mcp26.mesh.batching_policy import preset
    from mcp26.inference import devices, model_repository, partition as P
    from mcp26.inference.examples.build_repository import build, example_request
    from mcp26.inference.model_server import ModelServer
    from mcp26.inference.runtime import OnnxModel
    from mcp26.inference.telemetry import Telemetry
    found = devices.devices()
    row("ORT devices", ", ".join(f"{d.label}={d.ep}" for d in found))
    gpu = "gpu:0" if any(d.kind == "gpu" for d in found) else \
        "cuda:0" if "CUDAExecutionProvider" in ort.get_available_providers() else "cpu"
    repo = build(os.path.join(ROOT, ".cache", "gpu-check-multimodal"))
    path = os.path.join(repo, "vision", "1", "model.onnx")
    x = np.random.default_rng(0).standard_normal((32, 3, 32, 32)).astype(np.float32)
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"IMAGE": x})[0]
    whole = {}
    for dev in ("cpu", gpu):
        m = OnnxModel.load("vision", "1", path, dev)
        diff = float(np.abs(m.run({"IMAGE": x})["EMBEDDING"] - ref).max())
        whole[dev] = median_us(lambda: m.run({"IMAGE": x}), 50)
        row(f"vision --device {dev}", f"{whole[dev]:.0f} us/batch32, max diff {diff:.1e}",
            json.dumps(m.where()[0])[:90])
    pm = P.PartitionedModel.load_partitioned("vision", "1", path, P.Spec.parse(f"stages=2;devices=cpu,{gpu};micro=8"))
    try:
        diff = float(np.abs(pm.run({"IMAGE": x})["EMBEDDING"] - ref).max())
        us = median_us(lambda: pm.run({"IMAGE": x}), 50)
        best = min(whole.values())
        row(f"partition cpu,{gpu} at {pm.pipeline.cuts}", f"{us:.0f} us/batch32, {best / us:.2f}x the best "
            f"single device", f"max diff {diff:.1e} (<= 1e-4 on a GPU's kernels)")
        cuts = P.valid_cuts(pm.graph)
        swaps = sorted(pm.move_to([cuts[i % len(cuts)]]).seconds * 1e3 for i in range(1, 21))
        row("reconfiguration (20 cut moves)", f"p50 {swaps[10]:.1f} ms, p99 {swaps[-1]:.1f} ms",
            "build + warm the new stages + swap")
    finally:
        pm.pipeline.stop()
    server = ModelServer(Telemetry.get(None))
    server.repository = model_repository.Repository(repo, "auto", preset("balanced"))
    server.repository.load_all(server)
    server.ready = True
    try:
        ens, req = server.get("multimodal"), example_request(1)

        async def one():
            return await ens.infer(ens.prepare(req, [], {}), None, None)
        loop = asyncio.new_event_loop()
        lat = []
        for _ in range(200):
            t = time.perf_counter()
            loop.run_until_complete(one())
            lat.append((time.perf_counter() - t) * 1e6)
        loop.close()
        lat.sort()
        row("multimodal ensemble in process", f"p50 {lat[100]:.0f} us, p99 {lat[198]:.0f} us",
            "; ".join(f"{s.model}: {served.model.where()[0].get('device')}" for s, served in ens._step_models()))
    finally:
        server.stop()


def main() -> int:
    gpu = gpu_name()
    if not gpu and os.environ.get("GPU_CHECK_ALLOW_CPU") != "1":
        print("gpu_check: no NVIDIA GPU here (nvidia-smi finds none); nothing checked. "
              "GPU_CHECK_ALLOW_CPU=1 runs the CPU parts as a dry run.")
        return 0
    t0 = time.time()
    import onnxruntime as ort
    from mcp26.inference.builtin_models import builtin_path
    row("GPU", gpu or "none (dry run on CPU)")
    path = builtin_path("mlp")
    device = check_providers(ort, path)
    for step in (lambda: check_trt_cache(path, device), lambda: check_runs(ort, path, device),
                 lambda: check_serving(device), check_heterogeneous):
        try:
            step()
        except Exception as e:     # one failed check is a row, not the end of the table
            row("FAILED", f"{type(e).__name__}: {e}"[:200])
    print(f"\nGPU check ({time.time() - t0:.0f} s, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())})")
    width = max(len(r[0]) for r in ROWS)
    for check, value, note in ROWS:
        print(f"{check:<{width}}  {value:<40} {note}")
    out = os.path.join(ROOT, "artifacts", "bench", "gpu_check.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as fh:
        json.dump({"gpu": gpu, "rows": ROWS}, fh, indent=1)
    return 1 if any(r[0] == "FAILED" for r in ROWS) else 0


if __name__ == "__main__":
    sys.exit(main())
