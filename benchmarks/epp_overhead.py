"""The Endpoint Picker's own cost per request: the same request through Envoy
with the picker vs through Envoy without it (and direct), to trivial echo
upstreams, interleaved request by request, for each ext_proc processing mode
side by side (mesh/endpoint_picker.py):

  lean     request headers, then the buffered body: two messages, each
           answered before Envoy goes on (the gateway's mode, LEAN_MODE);
           a live session's next turn is picked on its headers alone and
           its body skipped (SESSION_MODE): one message. Both rows: the
           same session every request (after the first, header picks), and
           a new session every request (the pick waits for the body)
  answer   the response headers too (ANSWER_MODE): three messages
  duplex   GIE's own: the body FULL_DUPLEX_STREAMED (headers and body without
           waiting, the body echoed back), the response streamed through too

Each mode with the picker (`mcpctl epp serve`, on its default gRPC server,
serving.grpc.server) and with a null processor (benchmarks/epp_null_processor.py,
on the same server: the protocol's cost alone, no decision). With lean, three
more rows: the picker on grpc.aio (`--grpc-frontend grpcio`, what it ran on
before), and a session turn's one-message exchange split: the null processor
asked for the headers alone, and a native processor (a second Envoy answering
a fixed pick, benchmarks/epp_fixed_processor.py): ext_proc with no Python in
it, though with that Envoy's own work in it (the null processor on the lane
has read below it). Every row that always picks the same endpoint is checked
to have landed there.

`python -m benchmarks.epp_overhead [--requests N] [--modes lean,answer,duplex]`
(also run by `python -m benchmarks epp`); writes artifacts/bench/epp_overhead.json.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.epp_fixed_processor import ONE_MESSAGE_MODE, fixed_processor_bootstrap
from benchmarks.epp_sessions import percentile
from benchmarks.epp_stack import IDLE_METRICS, Picker, replica_hosts
from harness.endpoint_picker import write_pool
from mcp26.demo.stack.ports import port_free_on_all
from mcp26.demo.stack.envoy import Envoy
from harness.inference_gateway import balanced_gateway_bootstrap, gateway_bootstrap
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.processes import stop_processes
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.mesh import endpoint_picker as epp

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODES = {"lean": epp.LEAN_MODE, "answer": epp.ANSWER_MODE, "duplex": epp.DUPLEX_MODE}
def chat_body(history_kb: int = 0) -> bytes:
    """A chat request as the sessions benchmark sends it, but not streamed (an echo upstream
    answers JSON): a system prompt, then `history_kb` KiB of earlier turns (a later turn of a
    chat resends its whole history), then the question."""
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "y" * 1017}
             for i in range(history_kb)]
    return json.dumps({"model": "tiny-decoder", "max_tokens": 16, "temperature": 0, "messages": [
        {"role": "system", "content": "You are assistant 0 of the mesh. " + "x" * 400}, *turns,
        {"role": "user", "content": "How does the picker choose a replica?"}]}).encode()
FLOOR_US = 1000.0          # issue #14: the picker adds at most 1 ms at p50
WARMUP = 50                # rounds that warm connections and caches, not counted


def _timed_post(conn: http.client.HTTPConnection, body: bytes, session: str) -> tuple[float, str | None]:
    """(µs, the echo upstream that answered)."""
    t = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=body,
                 headers={"content-type": "application/json", epp.SESSION_HEADER: session})
    r = conn.getresponse()
    r.read()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}")
    return (time.perf_counter() - t) * 1e6, r.getheader("x-upstream")


def overhead(requests: int, modes: tuple[str, ...] = ("lean", "answer"), history_kb: int = 0) -> dict:
    """Per-request latency (µs) to trivial echo upstreams: direct, through Envoy balancing
    alone (round robin), and per mode through Envoy asking a null ext_proc server (the gRPC
    conversation alone) and the picker; interleaved request by request."""
    body = chat_body(history_kb)
    hosts = replica_hosts(2)
    port = port_free_on_all(hosts)
    ups = [EchoUpstream(f"echo-{h}", port=port, host=h) for h in hosts]
    for u in ups:
        u.metrics = dict(IDLE_METRICS)
        u.start()
    directory = tempfile.mkdtemp(prefix="bench-epp-overhead-")
    write_pool(directory, hosts, port)
    picker, aio_picker, null, envoys = None, None, None, []
    try:
        picker = Picker(directory, 2)
        # the same picker on grpc.aio (its --grpc-frontend before the lane): the lane's share, side by side
        aio_picker = Picker(directory, 2, None, "--grpc-frontend", "grpcio") if "lean" in modes else None
        pool = [(h, port) for h in hosts]
        null_grpc = free_port()
        null = subprocess.Popen([sys.executable, "-m", "benchmarks.epp_null_processor", str(null_grpc),
                                 f"{hosts[0]}:{port}"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
        null.stdout.readline()
        fixed_port = free_port()
        envoys.append(Envoy(fixed_processor_bootstrap(fixed_port, f"{hosts[0]}:{port}")).start())
        targets = {"direct": (hosts[0], port)}

        def gateway(name: str, bootstrap: dict, listen: int) -> None:
            envoys.append(Envoy(bootstrap).start())
            targets[name] = ("127.0.0.1", listen)

        plain = free_port()
        gateway("envoy", balanced_gateway_bootstrap(plain, pool, "round_robin"), plain)
        for m in modes:
            for who, grpc_port in (("null", null_grpc), ("epp", picker.port)):
                listen = free_port()
                gateway(f"{who}:{m}", gateway_bootstrap({listen: False}, pool, grpc_port, mode=MODES[m]), listen)
            if m == "lean":   # the same gateway, each request a new session: the pick waits for the body
                targets["epp:lean-new"] = targets["epp:lean"]
                listen = free_port()
                gateway("epp-grpcio:lean", gateway_bootstrap({listen: False}, pool, aio_picker.port,
                                                             mode=MODES[m]), listen)
                # a session turn's one message, from the null processor and from a native one
                for who, grpc_port in (("null", null_grpc), ("fixed", fixed_port)):
                    listen = free_port()
                    gateway(f"{who}:one", gateway_bootstrap({listen: False}, pool, grpc_port,
                                                            mode=ONE_MESSAGE_MODE), listen)
        conns = {k: http.client.HTTPConnection(h, p, timeout=5) for k, (h, p) in targets.items()}
        lat = {k: [] for k in targets}
        names = list(targets)
        for i in range(requests + WARMUP):
            for j in range(len(names)):
                k = names[(i + j) % len(names)]       # rotate the order: no target always goes first
                # a live session's next turn (picked on its headers in lean mode), or a new one
                us, upstream = _timed_post(conns[k], body, f"new-{i}" if k.endswith("-new") else "overhead")
                if k.startswith(("null:", "fixed:")) and upstream != ups[0].name:
                    # those processors always pick the first replica: anything else was not their pick
                    raise RuntimeError(f"{k}: answered by {upstream}, not the pick {ups[0].name}")
                if i >= WARMUP:
                    lat[k].append(us)
        for c in conns.values():
            c.close()
        stats = picker.stats()
    finally:
        for e in envoys:
            e.stop()
        stop_processes([p for p in (null,) if p], grace=2)
        for p in (picker, aio_picker):
            if p:
                p.stop()
        for u in ups:
            u.stop()
    p50 = {k: statistics.median(v) for k, v in lat.items()}
    p99 = {k: percentile(v, 99) for k, v in lat.items()}
    return {"requests": requests, "modes": list(modes), "body_bytes": len(body),
            "p50_us": {k: round(v, 1) for k, v in p50.items()},
            "p99_us": {k: round(v, 1) for k, v in p99.items()},
            "over_envoy_p50_us": {k: round(p50[k] - p50["envoy"], 1) for k in names if ":" in k},
            "over_envoy_p99_us": {k: round(p99[k] - p99["envoy"], 1) for k in names if ":" in k},
            # the figures the floor is judged on: the first mode given (the gateway's, lean, by default)
            "epp_overhead_p50_us": round(p50[f"epp:{modes[0]}"] - p50["envoy"], 1),
            "epp_overhead_p99_us": round(p99[f"epp:{modes[0]}"] - p99["envoy"], 1),
            "epp_new_session_overhead_p50_us": round(p50["epp:lean-new"] - p50["envoy"], 1)
            if "epp:lean-new" in p50 else None,
            "epp_header_picks": stats.get("header_picks"), "epp_decisions": stats.get("decisions"),
            "epp_session_mode_refused": stats.get("session_mode_refused"),
            "null_ext_proc_overhead_p50_us": round(p50[f"null:{modes[0]}"] - p50["envoy"], 1),
            # a session turn's one message: what ext_proc costs with a native processor, what the
            # Python gRPC stream adds to that, and what the picker adds to a null Python processor
            "one_message_split_p50_us": {
                "ext_proc_native": round(p50["fixed:one"] - p50["envoy"], 1),
                "python_grpc_stream": round(p50["null:one"] - p50["fixed:one"], 1),
                "picker": round(p50["epp:lean"] - p50["null:one"], 1)} if "fixed:one" in p50 else None,
            "envoy_vs_direct_p50_us": round(p50["envoy"] - p50["direct"], 1),
            "epp_mean_decision_us": stats.get("mean_decision_us"),
            "epp_gc": stats.get("gc"),          # the picker's GC pauses while serving (serving/gc_pauses.py)
            "loadavg_1m": round(os.getloadavg()[0], 2)}


def table(over: dict) -> str:
    rows = [("direct", "direct to the replica"), ("envoy", "Envoy alone (round robin)")]
    for m in over["modes"]:
        rows += [(f"null:{m}", f"Envoy + null processor, {m}"), (f"epp:{m}", f"Envoy + EPP, {m}")]
        if m == "lean":
            rows[-1] = (f"epp:{m}", "Envoy + EPP, lean: a session's next turn")
            rows += [("epp:lean-new", "Envoy + EPP, lean: a new session"),
                     ("epp-grpcio:lean", "Envoy + EPP on grpc.aio, lean: next turn"),
                     ("null:one", "Envoy + null processor, one message"),
                     ("fixed:one", "Envoy + native fixed pick, one message")]
    lines = [f"EPP overhead per request ({over['requests']} requests per row of a {over['body_bytes']}-byte "
             f"chat body, interleaved; "
             f"load average {over['loadavg_1m']})",
             f"{'':40}{'p50 µs':>10}{'p99 µs':>10}{'+p50 µs':>10}{'+p99 µs':>10}{'p50 ratio':>11}"]
    base = over["p50_us"]["envoy"]
    for key, label in rows:
        plus50, plus99 = over["over_envoy_p50_us"].get(key), over["over_envoy_p99_us"].get(key)
        lines.append(f"{label:40}{over['p50_us'][key]:>10.0f}{over['p99_us'][key]:>10.0f}"
                     f"{'' if plus50 is None else f'{plus50:+.0f}':>10}{'' if plus99 is None else f'{plus99:+.0f}':>10}"
                     f"{over['p50_us'][key] / base:>10.2f}x")
    lines.append(f"the picker's decision alone: {over['epp_mean_decision_us']} µs mean; picked on the headers "
                 f"(a live session's turn, one ext_proc message): {over['epp_header_picks']} of "
                 f"{over['epp_decisions']} decisions")
    split = over.get("one_message_split_p50_us")
    if split:
        lines.append(f"a session turn's +p50, split: ext_proc with a native processor {split['ext_proc_native']:+.0f} µs, "
                     f"the Python gRPC stream {split['python_grpc_stream']:+.0f} µs, "
                     f"the picker's own work {split['picker']:+.0f} µs")
    gc = over.get("epp_gc")
    if gc:
        full, young = gc["pauses"]["2"], gc["pauses"]["0"]
        lines.append(f"the picker's GC while serving: {gc['frozen_objects']} startup objects frozen; "
                     f"{full['count']} full collections, longest {full['longest_ms']} ms; "
                     f"{young['count']} young, longest {young['longest_ms']} ms")
    return "\n".join(lines)


def floor(over: dict) -> dict:
    return {"value": over["epp_overhead_p50_us"], "holds": over["epp_overhead_p50_us"] <= FLOOR_US}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.epp_overhead", description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=1000, help="requests per row (default 1000)")
    p.add_argument("--modes", default="lean,answer,duplex",
                   help="comma-separated, of " + ", ".join(MODES) + "; the first is the one the floor is on")
    p.add_argument("--history-kb", type=int, default=0,
                   help="KiB of earlier turns in each request's body (a later chat turn; default 0)")
    p.add_argument("--out", default=str(ROOT / "artifacts" / "bench" / "epp_overhead.json"))
    args = p.parse_args(argv)
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if not modes or set(modes) - set(MODES):
        p.error(f"--modes: of {', '.join(MODES)}")
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    over = overhead(args.requests, modes, args.history_kb)
    print(table(over))
    f = floor(over)
    print(f"floor EPP p50 overhead <= 1 ms ({modes[0]}): +{f['value']:.0f} µs -> {'holds' if f['holds'] else 'MISSED'}")
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"overhead": over, "floor": f}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
