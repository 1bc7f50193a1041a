/* The seed's flow ring, written by the kernel itself: a one-entry BPF_F_MMAPABLE
 * array map whose value is the ring's layout (header, then at 0x1000 1024
 * records of 64 bytes). User space maps the map's fd and reads the records in
 * place. Layout and protocol: mesh/flow_ring.py (the one definition; the
 * constants come from it as -D flags and are checked here).
 *
 * Many writers (every CPU running the tc program) reserve slots with an
 * atomic add on the producer index; a record is published by one atomic
 * exchange of its commit word (rtt_us | seq << 32), so a reader never takes a
 * half-written record. No spin locks: mmapable maps may not hold them.
 *
 * Each record published also rings the bell: an 8-byte record in the BPF
 * ring buffer `flow_ring_bell`, whose fd wakes the reader's epoll (a BPF
 * program cannot write an eventfd). A program that shares another's ring (the
 * write-burst tracer) defines FLOW_RING_PINNED and FLOW_RING_BELL_PINNED, the
 * pins of both maps, and uses those.
 */
#pragma once

#ifndef FLOW_RING_MAGIC
#error "compile through bpf/program.py, which defines the flow ring's layout"
#endif

struct flow_record {
    u8 saddr[16];           /* the client (IPv4 as ::ffff:a.b.c.d) */
    u8 daddr[16];           /* the server */
    u16 sport;
    u16 dport;
    u8 family;
    u8 kind;                /* FLOW_KIND_*: what the record holds (mesh/flow_ring.py) */
    u8 pad[2];
    u64 commit;             /* rtt_us (low half) | seq << 32; 0 while being written */
    u64 payload_bytes;
    u64 ts_ns;
};

struct flow_ring {
    u32 magic;
    u32 record_size;
    u64 prod;               /* records ever reserved (atomic add) */
    u64 cons;               /* records ever read: the reader stores it, we only load it */
    u64 drops;
    u8 header_pad[FLOW_RING_OFF - 32];
    struct flow_record ring[FLOW_RING_SLOTS];
};

_Static_assert(sizeof(struct flow_record) == FLOW_RECORD, "flow record size");
_Static_assert(__builtin_offsetof(struct flow_record, commit) == FLOW_REC_OFF_COMMIT, "commit word offset");
_Static_assert(__builtin_offsetof(struct flow_record, kind) == FLOW_REC_OFF_KIND, "kind offset");
_Static_assert(__builtin_offsetof(struct flow_ring, prod) == FLOW_RING_OFF_PROD, "producer offset");
_Static_assert(__builtin_offsetof(struct flow_ring, cons) == FLOW_RING_OFF_CONS, "consumer offset");
_Static_assert(__builtin_offsetof(struct flow_ring, drops) == FLOW_RING_OFF_DROPS, "drops offset");
_Static_assert(__builtin_offsetof(struct flow_ring, ring) == FLOW_RING_OFF, "ring offset");
_Static_assert((FLOW_RING_SLOTS & (FLOW_RING_SLOTS - 1)) == 0, "slots: a power of two (masked index)");

#ifdef FLOW_RING_PINNED
BPF_TABLE_PINNED("array", u32, struct flow_ring, flow_ring, 1, FLOW_RING_PINNED, BPF_F_MMAPABLE);
/* BPF_RINGBUF_OUTPUT's table, opened from its pin (bcc: "maps/<type>:<pin>") */
struct flow_ring_bell_table_t {
    int key;
    u32 leaf;
    int (*ringbuf_output) (void *, u64, u64);
    void* (*ringbuf_reserve) (u64);
    void (*ringbuf_discard) (void *, u64);
    void (*ringbuf_submit) (void *, u64);
    u32 max_entries;
};
__attribute__((section("maps/ringbuf:" FLOW_RING_BELL_PINNED)))
struct flow_ring_bell_table_t flow_ring_bell = { .max_entries = 4096 };
#else
BPF_F_TABLE("array", u32, struct flow_ring, flow_ring, 1, BPF_F_MMAPABLE);
BPF_RINGBUF_OUTPUT(flow_ring_bell, 1);
#endif

#define FLOW_RING_LOAD(x) (*(volatile u64 *)&(x))

/* Appends one record; a full ring drops it (counted), the traffic never waits. */
static __always_inline void flow_ring_push(const struct flow_key *k, u8 family, u8 kind, u64 rtt_us,
                                           u64 payload_bytes, u64 ts_ns)
{
    u32 zero = 0;
    struct flow_ring *r = flow_ring.lookup(&zero);

    if (!r)
        return;
    if (FLOW_RING_LOAD(r->prod) - FLOW_RING_LOAD(r->cons) >= FLOW_RING_SLOTS) {
        __sync_fetch_and_add(&r->drops, 1);      /* the reader is a full ring behind */
        return;
    }
    u64 idx = __sync_fetch_and_add(&r->prod, 1);
    /* Writers raced for the last free slots: this one overwrites the oldest
     * unread record, which the reader sees by its commit word and skips. */
    if (idx - FLOW_RING_LOAD(r->cons) >= FLOW_RING_SLOTS)
        __sync_fetch_and_add(&r->drops, 1);
    struct flow_record *e = &r->ring[idx & (FLOW_RING_SLOTS - 1)];
    __sync_lock_test_and_set(&e->commit, 0);     /* being written; a full barrier before the stores */
    __builtin_memcpy(e->saddr, k->saddr, 16);
    __builtin_memcpy(e->daddr, k->daddr, 16);
    e->sport = k->sport;
    e->dport = k->dport;
    e->family = family;
    e->kind = kind;
    e->pad[0] = e->pad[1] = 0;
    e->payload_bytes = payload_bytes;
    e->ts_ns = ts_ns;
    if (rtt_us > 0xffffffffULL)
        rtt_us = 0xffffffffULL;
    __sync_lock_test_and_set(&e->commit, rtt_us | (((idx & FLOW_SEQ_MASK) + 1) << 32));   /* publish */
    u64 one = 1;
    flow_ring_bell.ringbuf_output(&one, sizeof(one), BPF_RB_FORCE_WAKEUP);   /* the reader's epoll */
}
