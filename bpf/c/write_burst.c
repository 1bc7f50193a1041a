/* The write-burst tracer (the seed's kernel chapter): a program on the
 * tracepoint syscalls/sys_enter_write that watches the processes in
 * `write_watch` (the model server) and records their write bursts into the
 * shared flow ring (flow_ring.h, FLOW_KIND_WRITE_BURST), ringing its bell so
 * the decision loop wakes at once.
 *
 * A burst is a run of write() calls by one process with less than
 * `gap_ns` between them; it is recorded once, when its bytes reach
 * `min_bytes`. Threads of one process on several CPUs update its burst
 * without a lock: a count may lose an update under that race, a burst is
 * still recorded once it is one (the `reported` flag is set before the push).
 * Loaded by bpf/write_burst.py (`mcpctl bpf trace-writes`).
 */
#include "packet.h"
#include "flow_ring.h"

struct burst_cfg {
    u64 gap_ns;
    u64 min_bytes;
};

struct burst {
    u64 start_ns;
    u64 last_ns;
    u64 bytes;
    u32 writes;
    u32 reported;
};

BPF_HASH(write_watch, u32, struct burst_cfg, 64);    /* tgid -> its thresholds */
BPF_HASH(write_burst, u32, struct burst, 64);        /* tgid -> its burst now */

TRACEPOINT_PROBE(syscalls, sys_enter_write)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct burst_cfg *cfg = write_watch.lookup(&tgid);
    if (!cfg)
        return 0;
    u64 now = bpf_ktime_get_ns();
    struct burst *b = write_burst.lookup(&tgid);
    if (!b) {
        struct burst zero = {};
        write_burst.update(&tgid, &zero);
        b = write_burst.lookup(&tgid);
        if (!b)
            return 0;
    }
    if (now - b->last_ns > cfg->gap_ns) {        /* a quiet gap: a new burst starts */
        b->start_ns = now;
        b->bytes = 0;
        b->writes = 0;
        b->reported = 0;
    }
    b->last_ns = now;
    b->bytes += args->count;
    b->writes += 1;
    if (b->reported || b->bytes < cfg->min_bytes)
        return 0;
    b->reported = 1;
    /* the record: pid and write calls in the source address, no ports (mesh/flow_ring.py) */
    struct flow_key k = {};
    k.saddr[0] = tgid;
    k.saddr[1] = b->writes;
    flow_ring_push(&k, 0, FLOW_KIND_WRITE_BURST, (now - b->start_ns) / 1000, b->bytes, now);
    return 0;
}
