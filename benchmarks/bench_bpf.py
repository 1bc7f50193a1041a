"""eBPF QoS datapath cost, measured side by side in one run.

1. ns per packet, the kernel's own figure (BPF_PROG_TEST_RUN duration):
   the QoS egress program on several packet kinds vs an empty tc program.
   - steady state: one packet run `REPEAT` times in the kernel;
   - first data segment of a flow (ALPN parse): one run per call, each on a
     new flow, so every run parses; the empty program is timed the same way.
2. TCP throughput over a veth pair between two namespaces this script
   creates (and removes): no program, the marker rewriting every packet,
   and marker + ALPN + latency sampler.

Run as root from the repo root: `python -m benchmarks bpf`.
Writes artifacts/bench/bpf.json.
"""
from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
import time


# Smaller values (BPF_BENCH_*) only for the benchmark's own end-to-end test.
REPEAT = int(os.environ.get("BPF_BENCH_REPEAT", 1_000_000))
FIRST_SEGMENT_FLOWS = int(os.environ.get("BPF_BENCH_FLOWS", 20_000))
THROUGHPUT_SECONDS = float(os.environ.get("BPF_BENCH_SECONDS", 1.0))
ROUNDS = int(os.environ.get("BPF_BENCH_ROUNDS", 5))   # configurations interleaved per round; the median is reported
ROOT = pathlib.Path(__file__).resolve().parent.parent

SINK = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); n = 0; t0 = None
buf = bytearray(1 << 20)
while True:
    k = c.recv_into(buf)
    if not k: break
    if t0 is None: t0 = time.monotonic()
    n += k
print(n, time.monotonic() - t0, flush=True)
"""

SOURCE = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
size = int(sys.argv[3]); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
chunk = b"x" * size; end = time.monotonic() + float(sys.argv[4])
while time.monotonic() < end:
    for _ in range(64): c.sendall(chunk)
c.close()
"""


def ns_per_packet() -> list[dict]:
    from mcp26.bpf import packets as P
    from mcp26.bpf.policy import build_policy
    from mcp26.bpf.program import QosDatapath, load_empty
    from mcp26.bpf.syscall import prog_test_run

    dp = QosDatapath()
    empty_bpf, empty_fds = load_empty()
    egress, empty = dp.prog_fds["qos_egress"], empty_fds["pass"]
    c4, s4, c6, s6 = "10.231.0.1", "10.231.0.2", "fd00:231::1", "fd00:231::2"
    rows = []

    def steady(name: str, fd: int, frame: bytes, mark: int = 0) -> dict:
        prog_test_run(fd, frame, repeat=1, mark=mark)            # warm (and classify the flow)
        best = min(prog_test_run(fd, frame, repeat=REPEAT, mark=mark).duration_ns for _ in range(3))
        return {"case": name, "method": f"repeat={REPEAT}", "ns_per_packet": best}

    dp.configure(build_policy(ports=["8080=46"], cidrs=["10.232.0.0/16=8"], marks=["0x10=34"], alpn=True))
    data4 = P.tcp_frame(c4, s4, 40000, 8080, b"x" * 100)
    base = steady("empty program", empty, data4)
    rows.append(base)
    rows.append(steady("marker: IPv4 port match (rewrite + csum)", egress, data4))
    rows.append(steady("marker: IPv6 port match (rewrite)", egress, P.tcp_frame(c6, s6, 40000, 8080, b"x" * 100)))
    rows.append(steady("marker: SO_MARK match", egress, P.tcp_frame(c4, s4, 40001, 7000, b"x"), mark=0x10))
    hello = P.openssl_client_hello(["h2", "http/1.1"])
    rows.append(steady("ALPN: later segment of a classed flow", egress, P.tcp_frame(c4, s4, 40002, 443, hello)))
    dp.configure(build_policy(ports=["8080=46"]))
    rows.append(steady("marker: no match (all lookups miss)", egress, P.tcp_frame(c4, s4, 40000, 7000, b"x" * 100)))
    for r in rows[1:]:
        r["vs_empty"] = r["ns_per_packet"] / max(base["ns_per_packet"], 1)

    # First data segment: one run per call on a fresh flow, so each run parses.
    dp.configure(build_policy(alpn=True))

    def first_segments(name: str, fd: int, payload: bytes) -> dict:
        total = 0
        for i in range(FIRST_SEGMENT_FLOWS):
            if i % 60000 == 0:
                dp.maps["flow_alpn"].clear()
            frame = P.tcp_frame(c4, s4, 1024 + i % 60000, 443, payload)
            total += prog_test_run(fd, frame).duration_ns
        return {"case": name, "method": f"repeat=1 x {FIRST_SEGMENT_FLOWS} new flows",
                "ns_per_packet": total / FIRST_SEGMENT_FLOWS}

    base1 = first_segments("empty program", empty, hello)
    parse = first_segments("ALPN: parse ClientHello (OpenSSL, h2)", egress, hello)
    dp.maps["flow_alpn"].clear()
    plain = first_segments("ALPN: first segment not TLS", egress, b"GET / HTTP/1.1\r\n\r\n")
    for r in (parse, plain):
        r["vs_empty"] = r["ns_per_packet"] / max(base1["ns_per_packet"], 1e-9)
    rows += [base1, parse, plain]
    dp.close()
    empty_bpf.cleanup()
    return rows


def throughput() -> list[dict]:
    from mcp26.bpf import attach
    from mcp26.bpf.policy import build_policy
    from harness.bpf_env import VethPair, in_netns, remove_stale_namespaces

    remove_stale_namespaces()
    port = 5201
    configs = {
        "no program": None,
        "marker (every packet rewritten)": build_policy(ports=[f"{port}=46"]),
        "marker + ALPN + sampler": build_policy(ports=[f"{port}=46"], alpn=True, sample=True),
    }
    results: dict[tuple[str, int], list[float]] = {}
    cpu: dict[tuple[str, int], list[float]] = {}
    with VethPair() as pair:
        for _ in range(ROUNDS):
            for name, policy in configs.items():
                with in_netns(pair.client_ns):
                    if policy is None:
                        attach.detach(pair.client_if)
                    else:
                        attach.attach(pair.client_if, policy)
                for size in (65536, 1024):
                    gbps, us_per_mib = _one_transfer(pair, port, size)
                    results.setdefault((name, size), []).append(gbps)
                    cpu.setdefault((name, size), []).append(us_per_mib)
        with in_netns(pair.client_ns):
            attach.detach(pair.client_if)
    rows = []
    for size in (65536, 1024):
        base = statistics.median(results[("no program", size)])
        base_cpu = statistics.median(cpu[("no program", size)])
        for name in configs:
            runs = results[(name, size)]
            med = statistics.median(runs)
            med_cpu = statistics.median(cpu[(name, size)])
            rows.append({"case": name, "write_size": size, "gbit_per_s": med, "vs_no_program": med / base,
                         "runs_gbit_per_s": runs, "spread": (max(runs) - min(runs)) / med,
                         "sender_cpu_us_per_mib": med_cpu, "cpu_vs_no_program": med_cpu / base_cpu})
    return rows


def _one_transfer(pair, port: int, size: int) -> tuple[float, float]:
    """(Gbit/s, sender CPU µs per MiB). The sender's CPU time includes the veth
    transmit and, on the same CPU, the receive softirq where tc runs; it moves
    less with other load on the machine than throughput does."""
    sink = subprocess.Popen(["ip", "netns", "exec", pair.server_ns, sys.executable, "-c", SINK, pair.V4[1], str(port)],
                            stdout=subprocess.PIPE, text=True)
    assert sink.stdout.readline().strip() == "ready"
    try:
        source = subprocess.Popen(["ip", "netns", "exec", pair.client_ns, sys.executable, "-c", SOURCE, pair.V4[1],
                                   str(port), str(size), str(THROUGHPUT_SECONDS)])
        _, status, usage = os.wait4(source.pid, 0)
        source.returncode = os.waitstatus_to_exitcode(status)
        assert source.returncode == 0, "the sender failed"
        n, seconds = sink.stdout.readline().split()
        sink.wait(10)
    finally:   # a sink still waiting to accept would outlive the run (and hold its caller's pipes)
        if sink.poll() is None:
            sink.kill()
            sink.wait()
    mib = int(n) / (1 << 20)
    return int(n) * 8 / float(seconds) / 1e9, (usage.ru_utime + usage.ru_stime) * 1e6 / mib


def main() -> int:
    out = pathlib.Path(os.environ.get("BPF_BENCH_OUT") or ROOT / "artifacts" / "bench" / "bpf.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        reason = "needs root (loads tc programs, creates network namespaces)"
        print(f"bench_bpf: skipped: {reason}")
        out.write_text(json.dumps({"skipped": reason}))
        return 0
    t0 = time.monotonic()
    per_packet = ns_per_packet()
    print(f"\n{'program / packet':<44} {'method':<28} {'ns/pkt':>8} {'x empty':>8}")
    for r in per_packet:
        ratio = f"{r['vs_empty']:.2f}" if "vs_empty" in r else "1.00"
        print(f"{r['case']:<44} {r['method']:<28} {r['ns_per_packet']:>8.1f} {ratio:>8}")
    tput = throughput()
    print(f"\n{'veth TCP throughput (median of ' + str(ROUNDS) + ')':<36} {'write':>7} {'Gbit/s':>8} "
          f"{'x none':>8} {'spread':>7} {'cpu us/MiB':>11} {'x none':>8}")
    for r in tput:
        print(f"{r['case']:<36} {r['write_size']:>7} {r['gbit_per_s']:>8.2f} {r['vs_no_program']:>8.2f} "
              f"{r['spread']:>6.0%} {r['sender_cpu_us_per_mib']:>11.0f} {r['cpu_vs_no_program']:>8.2f}")
    print("(spread: (max-min)/median over the rounds; differences inside it are noise)")
    out.write_text(json.dumps({"ns_per_packet": per_packet, "veth_throughput": tput,
                               "kernel": os.uname().release, "seconds": time.monotonic() - t0}, indent=2))
    print(f"\nwrote {out} ({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
