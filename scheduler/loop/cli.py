"""`mcpctl scheduler run` and `mcpctl scheduler status` (scheduler/README.md "Decision loop")."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from mcp26.mesh import cli_context
from mcp26.mesh.cli_output import add_output_flag, render


def _pairs(values, flag: str) -> dict:
    out = {}
    for v in values or []:
        k, sep, val = v.partition("=")
        if not sep:
            raise ValueError(f"{flag} {v!r}: expected ENDPOINT=VALUE")
        out[k] = val
    return out


def register(subparsers) -> None:
    p = subparsers.add_parser("scheduler", help="the decision loop: live signals in, a policy decides, the mesh acts")
    sub = p.add_subparsers(dest="scheduler_command", required=True)
    r = sub.add_parser("run", help="run the decision loop over an InferencePool")
    r.add_argument("--config-dir", required=True, help="the watched directory (InferencePool, WorkloadEntries)")
    r.add_argument("--pool", required=True, help="the InferencePool, NAMESPACE/NAME")
    cli_context.add_control_plane_flag(r, legacy=("--control-plane-admin",))    # where remaps and weights go
    r.add_argument("--period-ms", type=float, default=200.0, help="the loop's period (default 200)")
    r.add_argument("--budget-ms", type=float, default=None, help="a policy call's time budget (default period/4)")
    r.add_argument("--policy", default=None, help="FILE.py|FILE.wasm: a Wasm policy plugin (hot-swapped on change); "
                   "builtin-python: the seed table in plain Python; python:FILE.py: a plain Python file "
                   "in-process; default: the seed table as a Wasm plugin")
    r.add_argument("--remap-hold-s", type=float, default=None,
                   help="override the policy's remap hold (default: the policy's own, 60 s in the seed table)")
    r.add_argument("--replica-admin", action="append", help="ENDPOINT=HOST:PORT of a replica's admin API")
    r.add_argument("--replica-pid", action="append", help="ENDPOINT=PID (memory from its cgroup)")
    r.add_argument("--flow-ring", metavar="PATH", action="append", help="a shared-memory flow ring "
                   "(mesh/flow_ring.py), repeat for more: on bpffs, the map the sampler and the write-burst tracer "
                   "write (`mcpctl bpf attach --sample` pins it at /sys/fs/bpf/mcp-mesh/IF/flow_ring); else a "
                   "file a user-space producer writes (`mcpctl serve --flow-ring PATH`, `mcpctl bpf latency "
                   "--flow-ring PATH`). The loop also wakes on each ring's bell, not only every period")
    r.add_argument("--rebatch-on-burst", metavar="PRESET", help="with --policy builtin-python: a replica whose "
                   "process wrote a burst (`mcpctl bpf trace-writes`, its pid from --replica-pid) gets this "
                   "batcher preset (a batcher-policy action)")
    r.add_argument("--engine-state", action="append", metavar="ENDPOINT=PATH", help="a replica's engine state "
                   "page (`mcpctl serve --engine-state PATH`), sampled every 1 ms as a resource signal")
    r.add_argument("--no-resources", action="store_true", help="do not sample the resource signals (NUMA "
                   "distances, PCIe links, the replicas' engine state: scheduler/loop/resources.py)")
    r.add_argument("--flow-marks", metavar="PATH", help="write the flows marked latency-critical here for the "
                   "Endpoint Picker (`mcpctl epp serve --flow-marks PATH`; scheduler/loop/marks.py)")
    r.add_argument("--admin-port", type=int, default=0, help="status HTTP port on 127.0.0.1 (default: any)")
    r.add_argument("--log-level", default="INFO", help="Python log level (default INFO)")
    r.set_defaults(func=_run)
    s = sub.add_parser("status", help="the loop's last decisions, their inputs, expiry and call cost")
    s.add_argument("--admin", required=True, help="the loop's admin address, HOST:PORT")
    add_output_flag(s, ("text",), legacy_json=True, what="json and yaml print the loop's /status")
    s.set_defaults(func=_status)


def _run(args) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not os.path.isdir(args.config_dir) or "/" not in args.pool:
        print("mcpctl scheduler run: --config-dir must be a directory and --pool NAMESPACE/NAME", file=sys.stderr)
        return 2
    try:
        admin = _pairs(args.replica_admin, "--replica-admin")
        pids = {k: int(v) for k, v in _pairs(args.replica_pid, "--replica-pid").items()}
        pages = _pairs(args.engine_state, "--engine-state")
    except ValueError as e:
        print(f"mcpctl scheduler run: {e}", file=sys.stderr)
        return 2
    flows_fn = None
    if args.flow_ring:
        from mcp26.scheduler.loop.flows import FlowSource
        try:
            flows_fn = FlowSource.at(*args.flow_ring)
        except (OSError, ValueError) as e:      # no such pin, not a flow ring, no privilege
            print(f"mcpctl scheduler run: --flow-ring {' '.join(args.flow_ring)}: {e}", file=sys.stderr)
            return 1
    try:
        control_plane = urllib.parse.urlsplit(cli_context.url(args)).netloc    # the applier's HOST:PORT
    except cli_context.ContextError as e:
        print(f"mcpctl scheduler run: {e}", file=sys.stderr)
        return 2
    from mcp26.scheduler.loop.service import run
    resources = None
    if not args.no_resources:
        from mcp26.scheduler.loop.resources import ResourceSampler
        from mcp26.scheduler.loop.signals import _nvml
        resources = ResourceSampler(engine_pages=pages, nvml=_nvml())
    elif pages:
        print("mcpctl scheduler run: --engine-state needs the resource signals (drop --no-resources)", file=sys.stderr)
        return 2

    async def main():
        task = asyncio.create_task(run(args.config_dir, args.pool, control_plane, args.period_ms,
                                       args.policy, args.admin_port, remap_hold_s=args.remap_hold_s,
                                       budget_ms=args.budget_ms, replica_admin=admin, replica_pids=pids,
                                       flows_fn=flows_fn, flow_marks=args.flow_marks,
                                       burst_preset=args.rebatch_on_burst, resources=resources))
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            pass

    try:
        asyncio.run(main())
    except (OSError, ValueError) as e:
        print(f"mcpctl scheduler run: {e}", file=sys.stderr)
        return 1
    return 0


def _status(args) -> int:
    try:
        with urllib.request.urlopen(f"http://{args.admin}/status", timeout=5) as r:
            doc = json.load(r)
    except (urllib.error.URLError, OSError, ValueError) as e:
        print(f"mcpctl scheduler status: {args.admin}: {e}", file=sys.stderr)
        return 1
    if args.output != "text":
        sys.stdout.write(render(doc, args.output))
        return 0
    print(f"policy {doc['policy']}  period {doc['period_ms']:.0f} ms  budget {doc['budget_ms']:.0f} ms  "
          f"cycles {doc['cycles']}  failures {doc['failures']}")
    print(f"jitter p50/p99 {doc['jitter_ms']['p50']}/{doc['jitter_ms']['p99']} ms  "
          f"policy call p50/p99 {doc['policy_call_ms']['p50']}/{doc['policy_call_ms']['p99']} ms  "
          f"cpu/cycle {doc['cycle_cpu_ms']['mean']} ms")
    plug = doc.get("plugin")
    if plug:
        cost = plug["cost_us"]["decide"]
        print(f"plugin {plug['source']}  calls {plug['calls']}  failures {plug['failures'] or '{}'}  "
              f"decide p50/p99 {cost['p50']}/{cost['p99']} us fuel {cost['fuel_last']}  "
              f"swaps {plug['swaps']} (failed {plug['swap_failures']})")
        if plug.get("last_error"):
            print(f"plugin last error: {plug['last_error']}")
    if doc.get("last_failure"):
        f = doc["last_failure"]
        print(f"last failure: cycle {f['cycle']} {f['reason']}: {f['detail']} (the last decision stood)")
    for rm in doc["in_force"]["class_remaps"]:
        print(f"in force: class {rm['from']} -> {rm['to']}, expires in {rm['expires_in_s']:.1f} s")
    for fl in doc["in_force"]["flows"]:
        print(f"in force: flow {fl['flow']} -> {fl['class']}, expires in {fl['expires_in_s']:.1f} s")
    for w in doc["in_force"].get("endpoint_weights", []):
        print(f"in force: endpoint {w['endpoint']} weight {w['weight']} in {w['cluster']}, "
              f"expires in {w['expires_in_s']:.1f} s")
    latest = doc.get("latest") or {}
    for rep in (latest.get("inputs") or {}).get("replicas", []):
        queue = ", ".join(f"{k} {n}" for k, n in sorted((rep.get("queue_depth") or {}).items()) if n) or "0"
        print(f"  replica {rep['endpoint']}: memory {rep['memory_fraction']:.1%} ({rep['memory_source']}), "
              f"kv {rep['kv_utilisation']:.1%}, waiting {queue}, running {rep.get('running', 0)}, "
              f"age {rep['age_ms']:.0f} ms")
    print("decisions (newest last):")
    for d in doc["decisions"][-8:]:
        when = time.strftime("%H:%M:%S", time.localtime(d["at"]))
        what = (f"FAILED {d['failure']['reason']}: {d['failure']['detail']}" if "failure" in d else
                "; ".join(f"{a['kind']} {a['subject']}{' -> ' + a['value'] if a['value'] else ''}"
                          f"{' (' + a['reason'] + ')' if a.get('reason') else ''}"
                          f"{' error: ' + a['error'] if a.get('error') else ''}" for a in d.get("actions", [])))
        print(f"  #{d['cycle']} {when} call {d['call_ms']:.3f} ms: {what or 'no action'}")
    return 0
