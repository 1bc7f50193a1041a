"""`mcpctl policy build FILE.py [-o OUT.wasm]` and `mcpctl policy run FILE --signals JSON`."""
from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
import time

from mcp26.scheduler.decisions import EndpointInfo, FlowSignals, ReplicaSignals, RequestInfo, Signals


def register_policy(subparsers) -> None:
    p = subparsers.add_parser("policy", help="scheduling policy plugins: Python built into sandboxed Wasm components")
    sub = p.add_subparsers(dest="policy_command", required=True)
    b = sub.add_parser("build", help="build a policy plugin (FILE.py) into a component with componentize-py")
    b.add_argument("file", help="the plugin, a Python file defining class WitWorld (world mcp:scheduler/policy)")
    b.add_argument("-o", "--output", help="the component to write (default: FILE with .wasm)")
    b.set_defaults(func=_build)
    r = sub.add_parser("run", help="load a plugin (FILE.wasm, or FILE.py built first) and call it once")
    r.add_argument("file", help="the policy: a .py plugin (built and cached) or a built .wasm component")
    r.add_argument("--signals", help="decide(): Signals as JSON, fields as scheduler/decisions.py names them "
                                     "({\"now_s\": 0, \"replicas\": [{\"endpoint\": ..., \"memory_fraction\": ...}], "
                                     "\"flows\": [...]}); '-' reads stdin")
    r.add_argument("--request", help="score(): RequestInfo as JSON")
    r.add_argument("--endpoints", help="score(): a JSON list of EndpointInfo")
    r.add_argument("--fuel", type=int, default=100_000_000, help="fuel per call (0: metering off)")
    r.add_argument("--deadline-ms", type=float, default=500.0, help="wall-clock budget per call (0: none)")
    r.add_argument("--memory-mb", type=int, default=256, help="linear-memory limit")
    r.add_argument("--cache-dir", help="where built and compiled components are kept (default ~/.cache/mcp-mesh/policy)")
    r.set_defaults(func=_run)


def _build(args) -> int:
    from mcp26.scheduler.plugins.build import BuildError, build
    out = args.output or str(pathlib.Path(args.file).with_suffix(".wasm"))
    t0 = time.perf_counter()
    try:
        path = build(args.file, out)
    except BuildError as e:
        print(f"mcpctl policy build: {e}", file=sys.stderr)
        return 1
    print(f"{path} ({path.stat().st_size / 1e6:.1f} MB, {time.perf_counter() - t0:.1f} s)")
    return 0


def _json_arg(text: str):
    return json.loads(sys.stdin.read() if text == "-" else text)


def signals_from_json(obj: dict) -> Signals:
    return Signals(now_s=float(obj.get("now_s", time.time())),
                   replicas=tuple(ReplicaSignals(**r) for r in obj.get("replicas", ())),
                   flows=tuple(FlowSignals(**f) for f in obj.get("flows", ())))


def _run(args) -> int:
    from mcp26.scheduler.plugins.host import PolicyHost
    from mcp26.scheduler.plugins.sandbox import Limits
    if not (args.signals or args.endpoints):
        print("mcpctl policy run: give --signals (decide) and/or --endpoints (score)", file=sys.stderr)
        return 2
    try:
        signals = signals_from_json(_json_arg(args.signals)) if args.signals else None
        endpoints = [EndpointInfo(**e) for e in _json_arg(args.endpoints)] if args.endpoints else None
        request = RequestInfo(**_json_arg(args.request)) if args.request else RequestInfo()
    except (ValueError, TypeError) as e:
        print(f"mcpctl policy run: bad JSON input: {e}", file=sys.stderr)
        return 2
    limits = Limits(fuel=args.fuel or None, deadline_ms=args.deadline_ms or None, memory_bytes=args.memory_mb << 20)
    host = PolicyHost(args.file, limits=limits, cache_dir=args.cache_dir)
    try:
        loaded = host.load()
    except Exception as e:  # noqa: BLE001 - a build or load error, reported as such
        print(f"mcpctl policy run: {args.file}: {e}", file=sys.stderr)
        return 1
    out: dict = {"plugin": loaded}
    failed = False
    if signals is not None:
        d = host.decide(signals)
        out["decide"] = {"ok": d.ok, "error": d.error, "elapsed_us": round(d.elapsed_us, 1),
                         "actions": [dataclasses.asdict(a) for a in d.actions]}
        failed |= not d.ok
    if endpoints is not None:
        scores = host.score(request, endpoints)
        out["score"] = {"ok": scores is not None, "scores": scores, "error": None if scores is not None else host.last_error}
        failed |= scores is None
    out["stats"] = {k: v for k, v in host.stats().items() if k in ("failures", "cost_us", "instantiations")}
    print(json.dumps(out, indent=2, default=str))
    return 1 if failed else 0
