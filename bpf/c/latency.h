/* Latency sampler: first request byte in -> first response byte out.
 *
 * On the server's interface, a data segment arriving (tc ingress) for a
 * service port opens a request if none is open on that flow; the first data
 * segment leaving (tc egress) from that port closes it and emits the time
 * between them to the `latency_events` ring buffer. Later segments of the same
 * response are ignored until the next request arrives, so keep-alive
 * HTTP/1.1 gives one sample per request; on multiplexed HTTP/2 it samples the
 * connection's request/response turns.
 */
#pragma once

#include "packet.h"

struct latency_event {
    u64 latency_ns;
    u16 port;           /* the service (local) port */
    u8 family;
    u8 pad[5];
};

/* Keyed client -> server, as the request travels. */
BPF_TABLE("lru_hash", struct flow_key, u64, latency_open, 16384);
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

static __always_inline void sample_request_in(struct qos_config *cfg, struct pkt *p)
{
    if (!p->is_tcp || p->payload_len == 0 || !is_service_port(cfg, p->flow.dport))
        return;
    u64 now = bpf_ktime_get_ns();
    /* BPF_NOEXIST: a request already open keeps its first byte's time. */
    latency_open.insert(&p->flow, &now);
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
    u64 *start = latency_open.lookup(&k);
    if (!start)
        return;
    u64 t0 = *start;
    latency_open.delete(&k);
    struct latency_event *e = latency_events.ringbuf_reserve(sizeof(*e));
    if (!e)
        return;                     /* ring full: the sample is dropped, traffic is not */
    e->latency_ns = bpf_ktime_get_ns() - t0;
    e->port = p->flow.sport;
    e->family = p->family;
    __builtin_memset(e->pad, 0, sizeof(e->pad));
    latency_events.ringbuf_submit(e, 0);
}
