"""`mcpctl bpf attach|status|detach|latency|trace-writes`: the QoS datapath from the shell.

State persists in bpffs between invocations (see attach.py), so `status`
and `detach` act on what an earlier `attach` left.
"""
from __future__ import annotations

import sys
import time

from mcp26.bpf.policy import PolicyError, build_policy
from mcp26.mesh.cli_output import add_output_flag, render


def register(subparsers) -> None:
    p = subparsers.add_parser("bpf", help="eBPF QoS: DSCP marking and latency sampling on an interface")
    sub = p.add_subparsers(dest="bpf_command", metavar="ACTION", required=True)

    a = sub.add_parser("attach", help="load the tc programs onto an interface (replaces ours there)")
    a.add_argument("--interface", "-i", required=True, help="network interface to attach the tc egress program to")
    a.add_argument("--dscp-port", action="append", default=[], metavar="PORT=DSCP",
                   help="mark TCP to or from PORT; DSCP is 0-63 or a QoS class name")
    a.add_argument("--dscp-cidr", action="append", default=[], metavar="CIDR=DSCP",
                   help="mark packets to a destination CIDR (IPv4 or IPv6)")
    a.add_argument("--dscp-mark", action="append", default=[], metavar="MARK=DSCP",
                   help="mark packets of sockets with this SO_MARK (Envoy cluster socket option)")
    a.add_argument("--alpn", action="store_true", help="mark TLS flows by ClientHello ALPN (mesh.qos.ALPN_DSCP)")
    a.add_argument("--tfo", action="store_true",
                   help="mark connections that open with TCP Fast Open (data in the SYN) EF from that packet on "
                        "(mesh.qos.TFO_CLASS)")
    a.add_argument("--sample", action="store_true",
                   help="time requests (first byte in -> first response byte out) on service ports")
    a.add_argument("--sample-port", action="append", default=[], type=str, metavar="PORT",
                   help="sample only these service ports (implies --sample)")
    add_output_flag(a, ("text",), legacy_json=True, what="the attached state")
    a.set_defaults(func=_attach)

    s = sub.add_parser("status", help="what is attached, its maps and the flows it classified")
    s.add_argument("--interface", "-i", help="only this interface (default: every interface with a program attached)")
    add_output_flag(s, ("text",), legacy_json=True, what="what is attached")
    s.set_defaults(func=_status)

    d = sub.add_parser("detach", help="remove our filters, pinned maps and the qdisc attach added")
    d.add_argument("--interface", "-i", required=True, help="network interface to detach the programs from")
    d.set_defaults(func=_detach)

    lat = sub.add_parser("latency", help="read the sampler: p50/p99 per service port")
    lat.add_argument("--interface", "-i", required=True, help="interface whose first-byte latency samples to read")
    lat.add_argument("--seconds", type=float, default=5.0, help="how long to read (default 5)")
    lat.add_argument("--prometheus-port", type=int, default=0,
                     help="also serve the OpenTelemetry metrics for Prometheus on 127.0.0.1:PORT")
    add_output_flag(lat, ("table",), legacy_json=True, what="the latency summary")
    lat.add_argument("--flow-ring", metavar="PATH", help="also write each sample (flow, rtt, request bytes) into "
                     "the shared-memory flow ring file at PATH (mesh/flow_ring.py; created if missing) for the "
                     "decision loop (`mcpctl scheduler run --flow-ring PATH`). Not needed where the sampler "
                     "is attached: the kernel writes the same ring itself, pinned at "
                     "<pin dir>/flow_ring (shown by attach and status)")
    lat.set_defaults(func=_latency)

    tw = sub.add_parser("trace-writes", help="record a process's write bursts into the shared flow ring "
                        "(tracepoint syscalls/sys_enter_write), until stopped")
    tw.add_argument("--pid", type=int, action="append", required=True, help="the process to watch (the model "
                    "server); repeat for more")
    tw.add_argument("--flow-ring", required=True, metavar="PATH",
                    help="the ring on bpffs: an attached datapath's <pin dir>/flow_ring (shared), or a new pin")
    tw.add_argument("--gap-us", type=int, default=None, help="writes closer than this are one burst (default 1000)")
    tw.add_argument("--min-bytes", type=int, default=None,
                    help="a burst is recorded once it has written this much (default 65536)")
    tw.set_defaults(func=_trace_writes)


def _fail(message: str, code: int = 1) -> int:
    print(f"mcpctl bpf: {message}", file=sys.stderr)
    return code


def _guard(fn):
    """Turns the datapath's known failures into one clear line and an exit code."""
    def run(args) -> int:
        from mcp26.bpf.attach import AttachError
        from mcp26.bpf.program import BpfUnavailable
        try:
            return fn(args)
        except PolicyError as e:
            return _fail(f"invalid argument: {e}", 2)
        except (BpfUnavailable, AttachError, FileNotFoundError) as e:
            return _fail(str(e))
    return run


@_guard
def _attach(args) -> int:
    from mcp26.bpf import attach
    policy = build_policy(ports=args.dscp_port, cidrs=args.dscp_cidr, marks=args.dscp_mark,
                          alpn=args.alpn, sample=args.sample, sample_ports=args.sample_port, tfo=args.tfo)
    state = attach.attach(args.interface, policy)
    if args.output != "text":
        sys.stdout.write(render(state, args.output))
    else:
        print(f"attached to {args.interface}: " + _describe(state))
        if state["sample"] and state.get("flow_ring"):
            print(f"flow ring (kernel-written): {state['flow_ring']['path']}  "
                  f"(mcpctl scheduler run --flow-ring {state['flow_ring']['path']})")
    return 0


@_guard
def _status(args) -> int:
    from mcp26.bpf import attach
    from mcp26.bpf.program import check_privilege
    check_privilege()
    states = attach.status(args.interface)
    if args.output != "text":
        sys.stdout.write(render(states, args.output))
        return 0
    if not states:
        print(f"nothing attached{' to ' + args.interface if args.interface else ''}")
        return 0
    for st in states:
        print(f"{st['interface']}: {_describe(st)}")
        for hook, fs in st["filters"].items():
            progs = ", ".join(f"prog id {f['prog_id']}" for f in fs) or "none"
            print(f"  tc {hook}: {progs}")
        if not st["interface_present"]:
            print("  interface is gone: run `mcpctl bpf detach` to remove the pins")
        ring = st.get("flow_ring")
        if st["sample"] and ring:
            print(f"  flow ring {ring['path']}: {ring['produced']} records, {ring['pending']} unread, "
                  f"{ring['drops']} dropped")
        if st["flow_counts"]:
            print("  flows seen: " + ", ".join(f"{n} {state}" for state, n in sorted(st["flow_counts"].items())))
        for f in st["flows"]:
            dscp = f" -> DSCP {f['dscp']}" if f["dscp"] is not None else ""
            print(f"  flow {f['flow']}: {f['state']} {f['alpn']}{dscp}")
    return 0


@_guard
def _detach(args) -> int:
    from mcp26.bpf import attach
    if attach.detach(args.interface):
        print(f"detached from {args.interface}")
    else:
        print(f"nothing attached to {args.interface}")
    return 0


@_guard
def _latency(args) -> int:
    from mcp26.bpf.latency import LatencyCollector, LatencyStats, open_pinned
    from mcp26.bpf.program import check_privilege
    check_privilege()
    stats = LatencyStats()
    if args.prometheus_port:
        from prometheus_client import REGISTRY, start_http_server
        REGISTRY.register(LatencyCollector(stats))
        start_http_server(args.prometheus_port, addr="127.0.0.1")
    ring = writer = None
    if args.flow_ring:
        from mcp26.mesh.flow_ring import MappedRing
        import os as _os
        ring = MappedRing(args.flow_ring, create=not _os.path.exists(args.flow_ring))
        writer = ring.writer()
    with open_pinned(args.interface, stats, flow_ring=writer) as reader:
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            reader.poll(100)
    if ring is not None:
        writer.close()
        ring.close()
    summary = stats.summary()
    if args.output != "table":
        sys.stdout.write(render({str(p): v for p, v in summary.items()}, args.output))
    else:
        print(f"{'port':>6} {'samples':>8} {'p50 us':>10} {'p99 us':>10}")
        for port, v in summary.items():
            print(f"{port:>6} {v['samples']:>8} {v['p50_us']:>10.1f} {v['p99_us']:>10.1f}")
    return 0


def _describe(st: dict) -> str:
    parts = []
    if st["ports"]:
        parts.append("ports " + ", ".join(f"{p}={d}" for p, d in sorted(st["ports"].items())))
    if st["cidrs"]:
        parts.append("cidrs " + ", ".join(f"{c}={d}" for c, d in st["cidrs"].items()))
    if st["marks"]:
        parts.append("marks " + ", ".join(f"{hex(m)}={d}" for m, d in sorted(st["marks"].items())))
    if st.get("tfo") is not None:
        parts.append(f"tfo={st['tfo']}")
    if st["alpn"]:
        parts.append("alpn " + ", ".join(f"{a}={d}" for a, d in st["alpn_dscp"].items()))
    if st["sample"]:
        parts.append("sampling " + (", ".join(map(str, st["sample_ports"])) or "non-ephemeral ports"))
    return "; ".join(parts) or "no classification (programs loaded, nothing marked)"


@_guard
def _trace_writes(args) -> int:
    import signal
    from mcp26.bpf.write_burst import DEFAULT_GAP_US, DEFAULT_MIN_BYTES, WriteBurstTracer
    gap = DEFAULT_GAP_US if args.gap_us is None else args.gap_us
    least = DEFAULT_MIN_BYTES if args.min_bytes is None else args.min_bytes
    if gap <= 0 or least <= 0:
        return _fail("invalid argument: --gap-us and --min-bytes must be positive", 2)
    tracer = WriteBurstTracer(args.flow_ring)
    try:
        for pid in args.pid:
            try:
                tracer.watch(pid, gap, least)
            except ValueError as e:
                return _fail(f"--pid {pid}: {e}", 2)
        print(json.dumps({"event": "ready", "flow_ring": args.flow_ring, "pids": args.pid, "gap_us": gap,
                          "min_bytes": least}), flush=True)
        stop = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.append(1))
        while not stop:
            time.sleep(0.2)
    finally:
        tracer.close()
    return 0
