"""Kernel -> user space delivery of flow records, three ways, side by side in one run:

- mmap ring: the seed's flow ring as a BPF_F_MMAPABLE array map (bpf/c/flow_ring.h, the code the
  latency sampler runs), read in place through a memoryview (mesh.flow_ring.FlowRingReader);
- BPF ring buffer: bpf_ringbuf_reserve/submit, read with libbcc's ring_buffer consumer;
- perf buffer: bpf_perf_event_output (per-CPU), read with libbcc's perf reader, with
  wakeup_events=1 (bcc's default: every event queues a wakeup irq_work, whether or not anyone
  waits) and with wakeup_events=64.

Every transport carries the same 64-byte record (struct flow_record) of the same stream; the
consumer decodes each record into the same tuple (struct.unpack), polling on an interval (no
epoll wakeups; the decision loop reads on its period).

Events come from BPF_PROG_TEST_RUN (one tc program per transport run `repeat` times in the
kernel on a crafted frame), not from real traffic: it generates events far faster than
loopback TCP could and times the producer with the kernel's own clock.

1. burst: 200 rounds of 512 events (half of every ring: none drops), then a full drain. The
   producer's ns/event is the kernel's test-run duration; the consumer's is its drain time.
2. flood: the producer runs back to back for 1 s while the consumer drains concurrently
   (another thread; ctypes drops the GIL in the syscall): delivered events/s and drops.

Run as root from the repo root: `python -m benchmarks flow_ring`. Writes artifacts/bench/flow_ring.json.
"""
from __future__ import annotations

import ctypes as ct
import json
import os
import pathlib
import struct
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
BURST, ROUNDS = 512, 200
FLOOD_SECONDS, FLOOD_REPEAT = 1.0, 4096
PAGES = 16                      # 64 KiB: the mmap ring's size, for the ring buffer and each per-CPU perf buffer

SOURCE = r"""
struct bench_counters { u64 ringbuf_drops; u64 perf_drops; u64 perf_batched_drops; u64 seq; };
BPF_ARRAY(counters, struct bench_counters, 1);
BPF_RINGBUF_OUTPUT(rb, PAGES);
BPF_PERF_OUTPUT(pb);
BPF_PERF_OUTPUT(pb_batched);

/* The same record for every transport: a fixed flow, a running sequence as the rtt. */
static __always_inline u64 next_event(struct flow_key *k, struct bench_counters **c)
{
    u32 zero = 0;
    *c = counters.lookup(&zero);
    k->saddr[2] = k->daddr[2] = bpf_htonl(0xffff);
    k->saddr[3] = bpf_htonl(0x0a000001);
    k->daddr[3] = bpf_htonl(0x0a000002);
    k->sport = 40000;
    k->dport = 8090;
    return *c ? __sync_fetch_and_add(&(*c)->seq, 1) : 0;
}

static __always_inline void fill(struct flow_record *e, struct flow_key *k, u64 n, u64 now)
{
    __builtin_memcpy(e->saddr, k->saddr, 16);
    __builtin_memcpy(e->daddr, k->daddr, 16);
    e->sport = k->sport;
    e->dport = k->dport;
    e->family = 4;
    e->pad[0] = e->pad[1] = e->pad[2] = 0;
    e->commit = (n & 0xffffffff) | (((n & FLOW_SEQ_MASK) + 1) << 32);
    e->payload_bytes = 1500000;
    e->ts_ns = now;
}

/* The baseline: the event is made (and counted), then delivered nowhere. */
int to_nowhere(struct __sk_buff *skb)
{
    struct flow_key k = {};
    struct bench_counters *c;
    u64 n = next_event(&k, &c);
    return n == ~0ULL ? TC_ACT_SHOT : TC_ACT_OK;
}

int to_mmap_ring(struct __sk_buff *skb)
{
    struct flow_key k = {};
    struct bench_counters *c;
    u64 n = next_event(&k, &c);
    flow_ring_push(&k, 4, n & 0xffffffff, 1500000, bpf_ktime_get_ns());
    return TC_ACT_OK;
}

int to_ringbuf(struct __sk_buff *skb)
{
    struct flow_key k = {};
    struct bench_counters *c;
    u64 n = next_event(&k, &c);
    struct flow_record *e = rb.ringbuf_reserve(sizeof(*e));
    if (!e) {
        if (c)
            __sync_fetch_and_add(&c->ringbuf_drops, 1);
        return TC_ACT_OK;
    }
    fill(e, &k, n, bpf_ktime_get_ns());
    rb.ringbuf_submit(e, 0);
    return TC_ACT_OK;
}

int to_perf(struct __sk_buff *skb)
{
    struct flow_key k = {};
    struct bench_counters *c;
    u64 n = next_event(&k, &c);
    struct flow_record e;
    fill(&e, &k, n, bpf_ktime_get_ns());
    if (pb.perf_submit(skb, &e, sizeof(e)) < 0 && c)
        __sync_fetch_and_add(&c->perf_drops, 1);
    return TC_ACT_OK;
}

int to_perf_batched(struct __sk_buff *skb)
{
    struct flow_key k = {};
    struct bench_counters *c;
    u64 n = next_event(&k, &c);
    struct flow_record e;
    fill(&e, &k, n, bpf_ktime_get_ns());
    if (pb_batched.perf_submit(skb, &e, sizeof(e)) < 0 && c)
        __sync_fetch_and_add(&c->perf_batched_drops, 1);
    return TC_ACT_OK;
}
"""
PROGRAMS = {"mmap ring (BPF_F_MMAPABLE array)": "to_mmap_ring",
            "BPF ring buffer (reserve/submit)": "to_ringbuf",
            "perf buffer (perf_event_output)": "to_perf",
            "perf buffer, wakeup every 64 events": "to_perf_batched"}
PERF_BATCH_WAKEUP = 64


class Counters(ct.Structure):
    _fields_ = [("ringbuf_drops", ct.c_uint64), ("perf_drops", ct.c_uint64), ("perf_batched_drops", ct.c_uint64),
                ("seq", ct.c_uint64)]


class Bench:
    def __init__(self):
        from bcc import BPF
        from mcp26.bpf import layout
        from mcp26.mesh.flow_ring import map_fd
        from mcp26.bpf.program import inline_source
        from mcp26.mesh import flow_ring as R
        seen: set = set()
        text = inline_source("packet.h", seen) + inline_source("flow_ring.h", seen) + SOURCE
        self.b = BPF(text=text.encode(), cflags=layout.CFLAGS + [f"-DPAGES={PAGES}"])
        self.fds = {f: self.b.load_func(f.encode(), BPF.SCHED_CLS).fd for f in [*PROGRAMS.values(), "to_nowhere"]}
        self.R, self.rec = R, struct.Struct("<16s16sHHB3xIIQQ")
        self.mapping = map_fd(self.b[b"flow_ring"].map_fd)
        R.init(self.mapping)
        self.ring = R.FlowRingReader(self.mapping)
        self.got = {"rb": 0, "pb": 0, "pb_batched": 0}
        self.lost_perf = 0
        unpack, string_at = self.rec.unpack, ct.string_at

        def on_rb(_ctx, data, _size):
            unpack(string_at(data, 64))
            self.got["rb"] += 1
            return 0

        def on_pb(_cpu, data, _size):
            unpack(string_at(data, 64))
            self.got["pb"] += 1

        def on_pb_batched(_cpu, data, _size):
            unpack(string_at(data, 64))
            self.got["pb_batched"] += 1

        def on_lost(lost):            # the same losses perf_submit's -ENOSPC counted (kept as a cross-check)
            self.lost_perf += lost

        self.b[b"rb"].open_ring_buffer(on_rb)
        self.b[b"pb"].open_perf_buffer(on_pb, page_cnt=PAGES, lost_cb=on_lost)
        self.b[b"pb_batched"].open_perf_buffer(on_pb_batched, page_cnt=PAGES, lost_cb=on_lost,
                                               wakeup_events=PERF_BATCH_WAKEUP)
        from mcp26.bpf import packets as P
        self.frame = P.tcp_frame("10.0.0.1", "10.0.0.2", 40000, 8090, b"x" * 64)

    def counters(self) -> Counters:
        return self.b[b"counters"][ct.c_int(0)]

    def drops(self, prog: str) -> int:
        c = self.counters()
        return {"to_mmap_ring": self.ring.drops, "to_ringbuf": c.ringbuf_drops,
                "to_perf": c.perf_drops, "to_perf_batched": c.perf_batched_drops}[prog]

    def drain(self, prog: str) -> int:
        """Consumes what is there now; the number of records decoded."""
        if prog == "to_mmap_ring":
            return len(self.ring.read_raw())
        key = {"to_ringbuf": "rb", "to_perf": "pb", "to_perf_batched": "pb_batched"}[prog]
        before = self.got[key]
        if prog == "to_ringbuf":
            self.b.ring_buffer_consume()
        else:
            self.b.perf_buffer_poll(timeout=0)
        return self.got[key] - before

    def produce(self, prog: str, repeat: int) -> int:
        from mcp26.bpf.syscall import prog_test_run
        return prog_test_run(self.fds[prog], self.frame, repeat=repeat).duration_ns

    def burst(self, prog: str) -> dict:
        drops0 = self.drops(prog)
        kernel_ns = consumer_ns = got = 0
        t0 = time.perf_counter_ns()
        for _ in range(ROUNDS):
            kernel_ns += self.produce(prog, BURST) * BURST
            c0 = time.perf_counter_ns()
            n = self.drain(prog)
            while n < BURST:                            # the perf reader may need a second poll
                k = self.drain(prog)
                if k == 0 and time.perf_counter_ns() - c0 > 1e9:
                    break
                n += k
            consumer_ns += time.perf_counter_ns() - c0
            got += n
        wall = (time.perf_counter_ns() - t0) / 1e9
        events = BURST * ROUNDS
        return {"events": events, "delivered": got, "drops": self.drops(prog) - drops0,
                "producer_ns_per_event": kernel_ns / events, "consumer_ns_per_event": consumer_ns / max(got, 1),
                "events_per_s": got / wall}

    def flood(self, prog: str) -> dict:
        drops0 = self.drops(prog)
        produced = [0]
        stop = threading.Event()

        def producer():
            end = time.monotonic() + FLOOD_SECONDS
            while time.monotonic() < end:
                self.produce(prog, FLOOD_REPEAT)
                produced[0] += FLOOD_REPEAT
            stop.set()

        got = 0
        t0 = time.perf_counter()
        th = threading.Thread(target=producer)
        th.start()
        while not stop.is_set():
            n = self.drain(prog)
            got += n
            if n == 0:
                time.sleep(0.0001)
        th.join()
        wall = time.perf_counter() - t0
        for _ in range(3):
            got += self.drain(prog)
        drops = self.drops(prog) - drops0
        return {"produced": produced[0], "delivered": got, "drops": drops, "drop_fraction": drops / produced[0],
                "delivered_per_s": got / wall, "produced_per_s": produced[0] / wall}

    def close(self) -> None:
        self.ring.close()
        try:
            self.mapping.close()
        except BufferError:
            pass
        self.b.cleanup()


def main() -> int:
    out = ROOT / "artifacts" / "bench" / "flow_ring.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        reason = "needs root (loads BPF programs)"
        print(f"bench_flow_ring: skipped: {reason}")
        out.write_text(json.dumps({"skipped": reason}))
        return 0
    t0 = time.monotonic()
    bench = Bench()
    rows = []
    try:
        for name, prog in PROGRAMS.items():
            bench.burst(prog)                             # warm (page faults, first polls)
        baseline = min(bench.produce("to_nowhere", BURST) for _ in range(ROUNDS))
        for name, prog in PROGRAMS.items():
            rows.append({"transport": name, "burst": bench.burst(prog), "flood": bench.flood(prog)})
    finally:
        bench.close()
    load = os.getloadavg()
    print(f"\nflow records kernel -> user space, 64 B each, 64 KiB per ring; events from BPF_PROG_TEST_RUN "
          f"(load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} CPUs)")
    print(f"{'':<36} {'burst ' + str(ROUNDS) + 'x' + str(BURST):^40} {'flood ' + str(FLOOD_SECONDS) + ' s':^32}")
    print(f"{'transport':<36} {'kernel ns/ev':>12} {'consumer ns/ev':>15} {'events/s':>11} "
          f"{'delivered/s':>12} {'produced/s':>11} {'drops':>7}")
    for r in rows:
        b, f = r["burst"], r["flood"]
        assert b["drops"] == 0 and b["delivered"] == b["events"], r
        print(f"{r['transport']:<36} {b['producer_ns_per_event']:>12.1f} {b['consumer_ns_per_event']:>15.1f} "
              f"{b['events_per_s']:>11,.0f} {f['delivered_per_s']:>12,.0f} {f['produced_per_s']:>11,.0f} "
              f"{f['drop_fraction']:>7.1%}")
    print(f"(kernel ns/ev: BPF_PROG_TEST_RUN's mean, including {baseline} ns for the test run and making the "
          "event (the same program delivering nowhere); consumer "
          "ns/ev: Python draining and decoding each record; drops: flood records the kernel could not deliver)")
    out.write_text(json.dumps({"rows": rows, "baseline_kernel_ns_per_event": baseline, "loadavg": load,
                               "perf_lost_records_reported": bench.lost_perf, "kernel": os.uname().release,
                               "burst": BURST, "rounds": ROUNDS, "flood_seconds": FLOOD_SECONDS,
                               "seconds": time.monotonic() - t0}, indent=2))
    print(f"\nwrote {out.relative_to(ROOT)} ({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
