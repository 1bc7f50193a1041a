/* Latency sampler: first request byte -> first response byte, both ways.
 *
 * On the server's interface, a data segment arriving (tc ingress) for a
 * service port opens a request if none is open on that flow; the first data
 * segment leaving (tc egress) from that port closes it and emits the time
 * between them to the `latency_events` ring buffer. Later segments of the same
 * response are ignored until the next request arrives, so keep-alive
 * HTTP/1.1 gives one sample per request; on multiplexed HTTP/2 it samples the
 * connection's request/response turns. Each sample also goes to the flow
 * ring (flow_ring.h), the map the decision loop reads in place, as
 * FLOW_KIND_EGRESS (closed at tc egress).
 *
 * On a client's interface the same turn runs the other way: a data segment
 * leaving (tc egress) for a service port opens, the first one arriving (tc
 * ingress) from it closes - the round trip as the client sees it, network
 * included - into the flow ring as FLOW_KIND_INGRESS (closed at tc ingress).
 * On lo a connection is both, and gives one sample of each.
 */
#pragma once

#include "packet.h"
#include "flow_ring.h"

struct latency_event {
    u64 latency_ns;
    u16 port;           /* the service (local) port */
    u8 family;
    u8 pad[5];
    /* the flow and what it carried (for the decision loop's flow ring, mesh/flow_ring.py) */
    struct flow_key flow;   /* client -> server, as the request travelled */
    u64 payload_bytes;      /* request bytes seen before the response's first byte */
    u64 ts_ns;              /* bpf_ktime_get_ns at the response's first byte */
};

/* The request's bytes are the sequence space it covered (seq_end - seq0), not the sum of the
   segments seen: a retransmitted segment is not counted twice. */
struct latency_open_v {
    u64 t0;
    u32 seq0;           /* sequence number of the request's first byte */
    u32 seq_end;        /* one past the highest byte seen so far */
};

/* Keyed client -> server, as the request travels. */
BPF_TABLE("lru_hash", struct flow_key, struct latency_open_v, latency_open, 16384);
BPF_TABLE("lru_hash", struct flow_key, struct latency_open_v, latency_open_out, 16384);   /* client side */
BPF_HASH(sample_ports, u16, u8, 256);
BPF_RINGBUF_OUTPUT(latency_events, 16);   /* 16 pages */

static __always_inline int is_service_port(struct qos_config *cfg, u16 port)
{
    if (sample_ports.lookup(&port))
        return 1;
    if (cfg->flags & CFG_SAMPLE_LISTED_ONLY)
        return 0;
    /* Without a list: anything outside the ephemeral range is a service. */
    return port < cfg->ephemeral_lo || port > cfg->ephemeral_hi;
}

/* A request's segment (client -> server) on an open request: counts its bytes. */
static __always_inline void extend_request(struct latency_open_v *open, struct pkt *p)
{
    u32 end = p->seq + p->payload_len;
    if ((s32)(end - open->seq_end) > 0)      /* new bytes (mod 2^32); a retransmit is not */
        open->seq_end = end;
}

static __always_inline struct latency_open_v new_request(struct pkt *p)
{
    struct latency_open_v v = {.t0 = bpf_ktime_get_ns(), .seq0 = p->seq, .seq_end = p->seq + p->payload_len};
    return v;
}

static __always_inline void sample_request_in(struct qos_config *cfg, struct pkt *p)
{
    if (!p->is_tcp || p->payload_len == 0 || !is_service_port(cfg, p->flow.dport))
        return;
    /* a request already open keeps its first byte's time and counts the bytes */
    struct latency_open_v *open = latency_open.lookup(&p->flow);
    if (open) {
        extend_request(open, p);
        return;
    }
    struct latency_open_v v = new_request(p);
    latency_open.insert(&p->flow, &v);
}

/* the client side: the request leaves through tc egress */
static __always_inline void sample_request_out(struct qos_config *cfg, struct pkt *p)
{
    if (!p->is_tcp || p->payload_len == 0 || !is_service_port(cfg, p->flow.dport))
        return;
    struct latency_open_v *open = latency_open_out.lookup(&p->flow);
    if (open) {
        extend_request(open, p);
        return;
    }
    struct latency_open_v v = new_request(p);
    latency_open_out.insert(&p->flow, &v);
}

/* ... and its answer arrives through tc ingress: FLOW_KIND_INGRESS into the flow ring */
static __always_inline void sample_response_in(struct qos_config *cfg, struct pkt *p)
{
    if (!p->is_tcp || p->payload_len == 0 || !is_service_port(cfg, p->flow.sport))
        return;
    struct flow_key k = {};
    __builtin_memcpy(k.saddr, p->flow.daddr, 16);
    __builtin_memcpy(k.daddr, p->flow.saddr, 16);
    k.sport = p->flow.dport;
    k.dport = p->flow.sport;
    struct latency_open_v *start = latency_open_out.lookup(&k);
    if (!start)
        return;
    u64 t0 = start->t0, bytes = (u32)(start->seq_end - start->seq0);
    latency_open_out.delete(&k);
    u64 now = bpf_ktime_get_ns();
    flow_ring_push(&k, p->family, FLOW_KIND_INGRESS, (now - t0) / 1000, bytes, now);
}

static __always_inline void sample_response_out(struct qos_config *cfg, struct pkt *p)
{
    if (!p->is_tcp || p->payload_len == 0 || !is_service_port(cfg, p->flow.sport))
        return;
    struct flow_key k = {};
    __builtin_memcpy(k.saddr, p->flow.daddr, 16);
    __builtin_memcpy(k.daddr, p->flow.saddr, 16);
    k.sport = p->flow.dport;
    k.dport = p->flow.sport;
    struct latency_open_v *start = latency_open.lookup(&k);
    if (!start)
        return;
    u64 t0 = start->t0, bytes = (u32)(start->seq_end - start->seq0);
    latency_open.delete(&k);
    u64 now = bpf_ktime_get_ns();
    flow_ring_push(&k, p->family, FLOW_KIND_EGRESS, (now - t0) / 1000, bytes, now);
    struct latency_event *e = latency_events.ringbuf_reserve(sizeof(*e));
    if (!e)
        return;                     /* ring full: the sample is dropped, traffic is not */
    e->latency_ns = now - t0;
    e->port = p->flow.sport;
    e->family = p->family;
    __builtin_memset(e->pad, 0, sizeof(e->pad));
    e->flow = k;
    e->payload_bytes = bytes;
    e->ts_ns = now;
    latency_events.ringbuf_submit(e, 0);
}
