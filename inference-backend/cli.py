"""`mcpctl serve`: the inference backend (plugged in via the mcp26.mcpctl entry point).

With `--replicas N`, N server processes run, replica i on every base port
plus i*stride, where stride is the span of the base ports plus one: the
defaults (http 8080, grpc 8081) give 8080/8081, 8082/8083, ... Each replica
is one endpoint of the pool (istio-manifests/examples/inference-pool.yaml).
`--envoy-port P` also runs Envoy on P in front of them (inference.envoy_bootstrap):
gRPC and REST balanced over the replicas by their ORCA load reports.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time

from mcp26.serving.grpc import frontends
from mcp26.mesh.cli_output import add_output_flag, render
from mcp26.mesh.batching_policy import DEFAULT_PRESET, PRESETS
from mcp26.serving.executables import executable
from mcp26.inference.event_lines import emit_event

DEFAULT_WORKERS = 1
MAX_INSTANCES = 64                  # a compute thread each: more than a machine has cores is a typo


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve an ONNX model over KServe v2 (REST + gRPC)",
                              description="Serve an ONNX model over the KServe v2 protocol with dynamic "
                                          "batching and priority queues.")
    p.add_argument("--model", help="PATH.onnx, PATH.mcp26bin (mcpctl model pack), builtin:mlp, builtin:resnet50 or "
                                   "builtin:tiny-decoder (or --model-repository)")
    p.add_argument("--model-repository", metavar="DIR",
                   help="serve a Triton model repository: DIR/NAME/config.pbtxt and DIR/NAME/VERSION/model.onnx, "
                        "ensembles included (inference-backend/README.md: Model repository)")
    p.add_argument("--load-model", action="append", default=[], metavar="NAME",
                   help="with --model-repository and --model-control-mode explicit: load NAME at start "
                        "(Triton's --load-model; repeatable)")
    p.add_argument("--name", help="served model name (default: the file's or built-in's name)")
    p.add_argument("--default-model", metavar="NAME",
                   help="the model `POST /infer` and `/v2/infer` stand for (default: the only one served)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--http-port", type=int, default=8080, help="KServe v2 REST port (default 8080)")
    p.add_argument("--grpc-port", type=int, default=8081, help="KServe v2 gRPC port (default 8081)")
    p.add_argument("--priority-grpc-port", type=int, default=None,
                   help="start a priority worker, a second process serving only x-mcp-qos-class: "
                        "latency-critical (Envoy routes that class to it), with gRPC on this port; "
                        "this process then runs at nice 19 (inference-backend/README.md); off unless given")
    p.add_argument("--priority-http-port", type=int, default=None,
                   help="the priority worker's REST port (with or without --priority-grpc-port)")
    # The priority worker is `mcpctl serve --serve-class latency-critical`, started by its parent.
    p.add_argument("--serve-class", default=None, help=argparse.SUPPRESS)
    p.add_argument("--admin-port", type=int, default=None,
                   help="admin listener (reload, policy, status); off unless given")
    p.add_argument("--device", default="auto",
                   help="where the model runs: a list of ONNX Runtime's devices in priority order (cpu, gpu:0, "
                        "npu:0,gpu:1, dsp:0), a selection policy (prefer-npu, prefer-gpu, prefer-cpu, "
                        "max-performance, max-efficiency, min-power), or auto | cuda:N | tensorrt:N "
                        "(default auto); `mcpctl devices` lists what is here")
    p.add_argument("--partition", metavar="SPEC",
                   help="split the model's graph into pipelined stages over devices: 'stages=2' (cuts chosen from "
                        "ONNX Runtime's per-node cost) or 'cut=TENSOR,...', with ';devices=cpu,gpu:0', ';micro=4', "
                        "';dynamic=1' (move the cut while serving); inference-backend/partition.py")
    p.add_argument("--qos-policy", default=DEFAULT_PRESET, choices=sorted(PRESETS),
                   help=f"batcher preset (default {DEFAULT_PRESET}); see inference-backend/README.md")
    p.add_argument("--policy-file", help="an L7SchedulingPolicy YAML; watched and applied on change")
    p.add_argument("--max-batch", type=int, help="override max_batch_size of the policy")
    p.add_argument("--max-queue-delay-us", type=int, help="override max_queue_delay_microseconds")
    p.add_argument("--intra-op-threads", type=int,
                   help="ONNX Runtime intra-op threads (default: CPU cores / (replicas x workers x instances), "
                        "shared with the reserved lane when the policy has one)")
    p.add_argument("--instances", type=int, default=1,
                   help="compute threads per model, each running batches beside the others on its share of the "
                        "ONNX threads (Triton's instance_group count; default 1)")
    p.add_argument("--split-under-load", action="store_true",
                   help="one instance on all intra-op threads while the load fits one batch; one single-threaded "
                        "instance per thread, at background CPU priority, while more than a batch waits "
                        "(inference-backend/README.md, Split under load)")
    p.add_argument("--kv-cache-mb", type=float, default=64, help="KV-cache budget of a decoder model (MiB)")
    p.add_argument("--kv-idle-seconds", type=float, default=5.0,
                   help="drop KV-cache blocks no sequence uses after this many idle seconds (default 5)")
    p.add_argument("--openai-model", action="append", default=[], metavar="NAME=MODEL[:VERSION]",
                   help="serve the served MODEL (only its VERSION, if given) under the OpenAI model name NAME "
                        "on /v1/completions and /v1/chat/completions; repeatable")
    p.add_argument("--max-body-bytes", type=int, default=64 << 20, help="largest REST body (413 above)")
    p.add_argument("--session-key-file", help="verify the L6 session signature with this key (403 on mismatch)")
    p.add_argument("--session-max-age", type=float, default=30.0, metavar="SECONDS",
                   help="a session signature is accepted this long after the sidecar issued it "
                        "(default 30; mesh.session allows 5 s of clock skew on top)")
    p.add_argument("--trace-file", help="write OpenTelemetry spans as JSON lines here")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="workload labels for the policy's selector.matchLabels")
    p.add_argument("--watch-model", action="store_true", help="reload the model when its file changes")
    p.add_argument("--drain-seconds", type=float, default=1.0,
                   help="on SIGTERM, keep serving this long while reporting not ready (default 1)")
    p.add_argument("--replicas", type=int, default=1, help="run N server processes (ports as above)")
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                   help="processes serving the same ports, each with its own event loop, "
                        f"batcher and ONNX session (default {DEFAULT_WORKERS}; inference-backend/README.md: Workers)")
    # A worker other than the first: `mcpctl serve --worker-index I`, started by the first.
    p.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    # ... and the descriptors it inherits from the first: {"counts": [FD], "http": [FD...], "grpc": [FD...]}
    p.add_argument("--inherit-listeners", type=json.loads, default=None, help=argparse.SUPPRESS)
    p.add_argument("--connection-balance", default="exact", choices=("exact", "kernel"),
                   help="with --workers: exact (default) shares each port's socket and keeps the workers' "
                        "connection counts within one; kernel: SO_REUSEPORT's hash (README: Workers)")
    p.add_argument("--envoy-port", type=int, help="with --replicas: run Envoy on this port in front of them")
    p.add_argument("--envoy-admin-port", type=int, help="Envoy's admin port (with --envoy-port)")
    p.add_argument("--enable-profiler", action="store_true", help="ONNX Runtime per-operator profile")
    p.add_argument("--model-control-mode", default="none", choices=("none", "poll", "explicit"),
                   help="Triton's: explicit allows repository load / unload (default none); poll (with "
                        "--model-repository) applies the directory's changes as they appear")
    p.add_argument("--no-fast-path", action="store_true",
                   help="plain Triton batching: a lone request waits max_queue_delay, every batch runs on the "
                        "compute thread (for comparison; README: fast path)")
    p.add_argument("--rest-frontend", default="fast", choices=("fast", "aiohttp"),
                   help="fast (default): KServe v2 infer on an httptools fast lane, every other REST request "
                        "handed to aiohttp; aiohttp: all REST on aiohttp (README: Against the peers)")
    p.add_argument("--grpc-frontend", default=frontends.LANE, choices=frontends.GRPC_FRONTENDS,
                   help="fast (default): the gRPC port on an asyncio HTTP/2 lane serving the same services; "
                        "grpcio: grpcio's grpc.aio server (README: gRPC lane)")
    p.add_argument("--cache-config", action="append", default=[], metavar="NAME,KEY=VALUE",
                   help="the response cache, as Triton's flag: local,size=BYTES and/or redis,host=H,port=P"
                        "[,cluster=true][,timeout_ms=50][,failures=2][,open_ms=1000][,ttl_s=N][,hmac_key_file=F]; "
                        "--model uses it, a repository model where its config.pbtxt has response_cache {enable: true}")
    p.add_argument("--numa-node", default="auto", metavar="auto|N|off",
                   help="pin the process to one NUMA node's CPUs: auto (the node nearest the GPU, else the one "
                        "with the most CPUs), a node id, or off (default auto)")
    p.add_argument("--engine-state", metavar="PATH", help="write the engine state page here after every batch, "
                   "for the decision loop's resource signals (`mcpctl scheduler run --engine-state EP=PATH`)")
    p.add_argument("--flow-ring", metavar="PATH", help="write each OpenAI request's token throughput and KV-cache "
                   "hit rate per flow into this flow ring file (`mcpctl scheduler run --flow-ring PATH`)")
    p.add_argument("--log-level", default="info", help="debug, info, warning or error (default info)")
    p.set_defaults(func=run)
    d = subparsers.add_parser("devices", help="list the devices and execution providers ONNX Runtime offers here",
                              description="List ONNX Runtime's (execution provider, device) pairs, named as "
                                          "`mcpctl serve --device` names them (cpu:0, gpu:1, npu:0).")
    add_output_flag(d, ("table",))
    d.set_defaults(func=run_devices)


def run_devices(args) -> int:
    import onnxruntime as ort
    from mcp26.inference import devices
    found = devices.devices()
    if args.output != "table":
        sys.stdout.write(render({"onnxruntime": ort.__version__, "plugins": devices.register_plugins(),
                                 "devices": [d.describe() for d in found]}, args.output))
    else:
        print(devices.table(found))
    return 0


def _labels(items: list[str]) -> dict:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise SystemExit(f"mcpctl serve: --label {item!r}: expected KEY=VALUE")
        out[k] = v
    return out


def run(args) -> int:
    worker = " [priority worker]" if args.serve_class else f" [worker {args.worker_index}]" if args.worker_index else ""
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s %(name)s{worker}: %(message)s")
    if args.worker_index:           # started by the first worker, after its gRPC threads began
        from mcp26.inference.priority_worker import bind_to_parent
        bind_to_parent()
    for flag in ("replicas", "workers", "instances"):
        if getattr(args, flag) < 1:
            print(f"mcpctl serve: --{flag} must be at least 1, got {getattr(args, flag)}", file=sys.stderr)
            return 2
    if args.instances > MAX_INSTANCES:
        print(f"mcpctl serve: --instances must be at most {MAX_INSTANCES}, got {args.instances}", file=sys.stderr)
        return 2
    if args.split_under_load and args.instances > 1:
        print("mcpctl serve: --split-under-load chooses the instances itself; leave out --instances", file=sys.stderr)
        return 2
    if args.workers > 1 and args.model_control_mode == "explicit":
        # a repository load / unload reaches the one worker the connection landed on
        print("mcpctl serve: --model-control-mode explicit needs --workers 1", file=sys.stderr)
        return 2
    priority = args.priority_grpc_port is not None or args.priority_http_port is not None
    if (args.model is None) == (args.model_repository is None):
        print("mcpctl serve: give one of --model FILE and --model-repository DIR", file=sys.stderr)
        return 2
    if args.model_repository:
        alone = [f for f, on in (("--replicas", args.replicas > 1), ("--workers", args.workers > 1),
                                 ("--priority-grpc-port/--priority-http-port", priority),
                                 ("--watch-model", args.watch_model), ("--name", args.name),
                                 ("--split-under-load", args.split_under_load),
                                 ("--partition (use the model's parameters { key: \"partition\" })", args.partition))
                 if on]
        if alone:
            print(f"mcpctl serve: --model-repository serves in one process: leave out {', '.join(alone)}",
                  file=sys.stderr)
            return 2
    elif args.load_model or args.model_control_mode == "poll":
        if args.model_control_mode == "poll":
            print("mcpctl serve: --model-control-mode poll watches a --model-repository", file=sys.stderr)
            return 2
        print("mcpctl serve: --load-model is for --model-repository", file=sys.stderr)
        return 2
    if args.partition and (args.replicas > 1 or args.workers > 1 or args.instances > 1 or args.split_under_load
                           or priority or args.envoy_port):
        print("mcpctl serve: --partition runs one pipeline in one process: leave out --replicas, --workers, "
              "--instances, --split-under-load, --envoy-port and the priority worker", file=sys.stderr)
        return 2
    if args.serve_class:
        from mcp26.mesh.qos import QosClass
        try:
            QosClass.parse(args.serve_class)
        except ValueError as e:
            print(f"mcpctl serve: --serve-class: {e}", file=sys.stderr)
            return 2
    if args.replicas > 1 or args.envoy_port:
        from mcp26.inference.builtin_models import BUILDERS, builtin_path
        if args.model.startswith("builtin:") and args.model[8:] in BUILDERS:
            builtin_path(args.model[8:])       # generate once, not in every replica at the same time
        return run_replicas(args)
    from mcp26.inference.server import ServeOptions, serve
    from mcp26.inference.model_server import check_model_spec
    from mcp26.inference.openai_api import parse_model_map
    from mcp26.inference import devices
    try:
        devices.check(args.device)        # an absent device: the list of what is here, before any load
        if args.model_repository:
            from mcp26.inference.model_repository import scan
            scan(args.model_repository, args.device)     # every config.pbtxt checked before listening
        else:
            check_model_spec(args.model)
        if args.partition:
            from mcp26.inference.partition import Spec
            Spec.parse(args.partition, args.device)
        intra = args.intra_op_threads     # None: the cores, shared by the instances and the lane (model_server)
        if intra is None and args.workers > 1:    # the workers (and their instances) share the cores
            intra = max(1, (os.cpu_count() or 1) // (args.workers * args.instances))
        opts = ServeOptions(
            model=args.model, model_repository=args.model_repository, load_models=args.load_model, name=args.name,
            default_model=args.default_model, partition=args.partition,
            host=args.host, http_port=args.http_port, grpc_port=args.grpc_port,
            priority_argv=_priority_argv(args) if priority else None, serve_class=args.serve_class,
            admin_port=args.admin_port, device=args.device, qos_policy=args.qos_policy, policy_file=args.policy_file,
            max_batch=args.max_batch, max_queue_delay_us=args.max_queue_delay_us, intra_op_threads=intra,
            instances=args.instances, split_under_load=args.split_under_load,
            kv_cache_mb=args.kv_cache_mb, kv_idle_seconds=args.kv_idle_seconds,
            openai_models=parse_model_map(args.openai_model), max_body_bytes=args.max_body_bytes,
            session_key_file=args.session_key_file,
            session_max_age=args.session_max_age,
            trace_file=args.trace_file, enable_profiler=args.enable_profiler, labels=_labels(args.label),
            watch_model=args.watch_model, drain_seconds=args.drain_seconds, fast_path=not args.no_fast_path,
            model_control_mode=args.model_control_mode, workers=args.workers, worker_index=args.worker_index,
            connection_balance=args.connection_balance, inherited=args.inherit_listeners,
            rest_frontend=args.rest_frontend, grpc_frontend=args.grpc_frontend,
            numa_node=args.numa_node, engine_state=args.engine_state, flow_ring=args.flow_ring,
            cache_config=args.cache_config,
            worker_argv=_child_argv(args, skip=("workers",)) if args.workers > 1 and not args.worker_index else None)
        return serve(opts)
    except (ValueError, OSError) as e:
        print(f"mcpctl serve{worker}: {e}", file=sys.stderr)
        return 2


# Flags passed to every replica as given (the port flags are set per replica).
_SHARED_FLAGS = ("model", "name", "default_model", "host", "device", "qos_policy", "policy_file", "max_batch",
                 "max_queue_delay_us", "intra_op_threads", "instances", "kv_cache_mb", "kv_idle_seconds",
                 "max_body_bytes",
                 "session_key_file", "session_max_age", "trace_file", "log_level", "drain_seconds",
                 "model_control_mode", "workers", "rest_frontend", "grpc_frontend", "connection_balance",
                 "numa_node")
_SWITCHES = ("watch_model", "enable_profiler", "no_fast_path", "split_under_load")


def _child_argv(args, skip: tuple = ()) -> list[str]:
    out = ["serve"]
    for name in _SHARED_FLAGS:
        value = None if name in skip else getattr(args, name)
        if value is not None:
            out += ["--" + name.replace("_", "-"), str(value)]
    for name in _SWITCHES:
        if getattr(args, name):
            out.append("--" + name.replace("_", "-"))
    for label in args.label:
        out += ["--label", label]
    for mapping in args.openai_model:
        out += ["--openai-model", mapping]
    for item in args.cache_config:          # every process shares the Redis cache (each its own local one)
        out += ["--cache-config", item]
    return out


def _priority_argv(args) -> list[str]:
    """The priority worker's command line: this server's model, policy and keys,
    the top class only, one intra-op thread, its own ports (0: any free port)
    and a loopback admin port on any free port (the parent forwards to it)."""
    from mcp26.inference.priority_worker import SERVE_CLASS, WORKER_INTRA_OP_THREADS
    argv = _child_argv(args, skip=("intra_op_threads", "workers", "instances"))
    return [*argv, "--serve-class", SERVE_CLASS.header_value, "--intra-op-threads", str(WORKER_INTRA_OP_THREADS),
            "--grpc-port", str(args.priority_grpc_port or 0), "--http-port", str(args.priority_http_port or 0),
            "--admin-port", "0"]


def run_replicas(args) -> int:
    """N child `mcpctl serve` processes (and Envoy in front with --envoy-port);
    stop them all when one dies or on a signal."""
    from mcp26.inference.envoy_bootstrap import envoy_bootstrap, replica_ports
    log = logging.getLogger("mcp26.inference")
    if args.intra_op_threads is None:  # replicas share the cores
        args.intra_op_threads = max(1, (os.cpu_count() or 1) // (args.replicas * args.workers * args.instances))
    argv = _child_argv(args)
    children = []
    layout = replica_ports(args.http_port, args.grpc_port, args.replicas, args.admin_port,
                           args.priority_http_port, args.priority_grpc_port)
    for i, ports in enumerate(layout):
        cmd = [sys.executable, "-m", "mcp26.mesh.cli", *argv, "--http-port", str(ports["http"]),
               "--grpc-port", str(ports["grpc"])]
        for key, flag in (("admin", "--admin-port"), ("priority_http", "--priority-http-port"),
                          ("priority_grpc", "--priority-grpc-port")):
            if key in ports:
                cmd += [flag, str(ports[key])]
        children.append(subprocess.Popen(cmd))
        log.info("replica %d: pid %d, ports %s", i, children[-1].pid, ports)
    envoy = None
    if args.envoy_port:
        import tempfile
        import yaml
        bootstrap = envoy_bootstrap(args.envoy_port, [p["http"] for p in layout], [p["grpc"] for p in layout],
                                    admin_port=args.envoy_admin_port, host=args.host,
                                    priority_http_ports=[p["priority_http"] for p in layout if "priority_http" in p],
                                    priority_grpc_ports=[p["priority_grpc"] for p in layout if "priority_grpc" in p])
        if not args.envoy_admin_port:
            bootstrap.pop("admin", None)
        fd, path = tempfile.mkstemp(prefix="mcp-pool-envoy-", suffix=".yaml")
        with os.fdopen(fd, "w") as fh:
            yaml.safe_dump(bootstrap, fh)
        envoy = subprocess.Popen([executable("envoy"), "-c", path,
                                  "--disable-hot-restart", "-l", "warning", "--concurrency", "1"])
        children.append(envoy)
        log.info("envoy: pid %d, listener %s:%d -> %d replicas (bootstrap %s)", envoy.pid, args.host,
                 args.envoy_port, args.replicas, path)
        emit_event({"event": "envoy", "port": args.envoy_port, "admin_port": args.envoy_admin_port,
                    "replicas": layout})
    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        while not stopping and all(c.poll() is None for c in children):
            time.sleep(0.2)
    finally:
        for c in children:
            if c.poll() is None:
                c.terminate()
        for c in children:
            try:
                c.wait(10)
            except subprocess.TimeoutExpired:
                c.kill()
        if envoy is not None:
            os.unlink(path)
    codes = [c.returncode for c in children]
    return 0 if stopping else max(abs(x or 0) for x in codes) or 1
