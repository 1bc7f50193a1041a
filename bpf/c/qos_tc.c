/* tc programs of the MCP Mesh QoS datapath (loaded by bpf/program.py).
 *
 * qos_egress   marks the DSCP of selected flows and closes latency samples;
 * qos_ingress  classes reply flows by an arriving ClientHello's ALPN and
 *              opens latency samples.
 *
 * A flow's DSCP comes from, in order: the socket mark (SO_MARK, which Envoy
 * sets per cluster), the destination or source port, the destination CIDR,
 * TCP Fast Open (a SYN carrying data marks its connection EF from that very
 * packet, both ways), and the TLS ALPN detected on its first data segment.
 * No match: the packet leaves unchanged. Every program returns TC_ACT_OK:
 * QoS never drops.
 */
/* CFG_* flags, ALPN_* states and sizes come from bpf/layout.py as -D flags. */
#ifndef CFG_ALPN
#error "compile through bpf/program.py, which defines the shared constants"
#endif

struct qos_config {
    u32 flags;
    u16 ephemeral_lo;   /* net.ipv4.ip_local_port_range */
    u16 ephemeral_hi;
    u32 owner_flags;    /* user space's own bookkeeping, unused here */
    u8 tfo_dscp;        /* a TCP Fast Open connection's DSCP (CFG_TFO) */
    u8 pad[3];
};

#include "packet.h"
#include "alpn.h"
#include "latency.h"

struct cidr_key {
    u32 prefixlen;      /* of the IPv4-mapped IPv6 address */
    u32 addr[4];
};

BPF_ARRAY(config, struct qos_config, 1);
BPF_HASH(mark_dscp, u32, u8, 256);
BPF_HASH(port_dscp, u16, u8, 1024);
BPF_LPM_TRIE(cidr_dscp, struct cidr_key, u8, 1024);
BPF_TABLE("lru_hash", struct flow_key, struct flow_alpn, flow_alpn, 65536);

/* The DSCP for this packet's flow, or -1 to leave it alone. */
static __always_inline int classify(struct __sk_buff *skb, struct qos_config *cfg, struct pkt *p)
{
    u8 *dscp;

    if (skb->mark) {
        u32 mark = skb->mark;
        dscp = mark_dscp.lookup(&mark);
        if (dscp)
            return *dscp;
    }
    if (p->is_tcp) {
        u16 port = p->flow.dport;
        dscp = port_dscp.lookup(&port);
        if (dscp)
            return *dscp;
        port = p->flow.sport;
        dscp = port_dscp.lookup(&port);
        if (dscp)
            return *dscp;
    }
    struct cidr_key ck = {.prefixlen = 128};
    __builtin_memcpy(ck.addr, p->flow.daddr, 16);
    dscp = cidr_dscp.lookup(&ck);
    if (dscp)
        return *dscp;

    if (!(cfg->flags & (CFG_ALPN | CFG_TFO)) || !p->is_tcp)
        return -1;
    if ((p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN) {
        flow_alpn.delete(&p->flow);   /* a new connection on a reused 4-tuple */
        if (!(cfg->flags & CFG_TFO) || p->payload_len == 0)
            return -1;
        /* TCP Fast Open: data in the SYN, so the connection is EF from this packet on */
        struct flow_alpn tfo = {.state = FLOW_TFO, .dscp = cfg->tfo_dscp};
        flow_alpn.update(&p->flow, &tfo);
        return cfg->tfo_dscp;
    }
    struct flow_alpn *known = flow_alpn.lookup(&p->flow);
    if (known)
        return known->state == ALPN_CLASSED || known->state == FLOW_TFO ? known->dscp : -1;
    if (!(cfg->flags & CFG_ALPN) || p->payload_len == 0)
        return -1;
    /* The first data segment decides the flow, whatever it holds. */
    struct flow_alpn seen = {};
    parse_client_hello(skb, p->payload_off, &seen);
    flow_alpn.update(&p->flow, &seen);
    return seen.state == ALPN_CLASSED ? seen.dscp : -1;
}

/* A ClientHello arriving classes the reply direction, so that a server's
 * responses carry the DSCP of the protocol its client asked for; a SYN
 * carrying data (TCP Fast Open) classes it EF, from the SYN-ACK on. */
static __always_inline void classify_incoming(struct __sk_buff *skb, struct qos_config *cfg, struct pkt *p)
{
    struct flow_key reply = {};

    if (!p->is_tcp)
        return;
    __builtin_memcpy(reply.saddr, p->flow.daddr, 16);
    __builtin_memcpy(reply.daddr, p->flow.saddr, 16);
    reply.sport = p->flow.dport;
    reply.dport = p->flow.sport;
    if ((p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN) {
        flow_alpn.delete(&reply);
        if ((cfg->flags & CFG_TFO) && p->payload_len > 0) {
            struct flow_alpn tfo = {.state = FLOW_TFO, .dscp = cfg->tfo_dscp};
            flow_alpn.update(&reply, &tfo);
        }
        return;
    }
    if (!(cfg->flags & CFG_ALPN) || p->payload_len == 0 || flow_alpn.lookup(&reply))
        return;                     /* decided already, by either direction */
    struct flow_alpn seen = {};
    parse_client_hello(skb, p->payload_off, &seen);
    flow_alpn.update(&reply, &seen);
}

int qos_egress(struct __sk_buff *skb)
{
    u32 zero = 0;
    struct qos_config *cfg = config.lookup(&zero);
    struct pkt p;

    if (!cfg || parse_packet(skb, &p) < 0)
        return TC_ACT_OK;
    int dscp = classify(skb, cfg, &p);
    if (dscp >= 0)
        set_dscp(skb, &p, dscp);
    if (cfg->flags & CFG_SAMPLE) {
        sample_response_out(cfg, &p);
        sample_request_out(cfg, &p);
    }
    return TC_ACT_OK;
}

int qos_ingress(struct __sk_buff *skb)
{
    u32 zero = 0;
    struct qos_config *cfg = config.lookup(&zero);
    struct pkt p;

    if (!cfg || !(cfg->flags & (CFG_ALPN | CFG_TFO | CFG_SAMPLE)) || parse_packet(skb, &p) < 0)
        return TC_ACT_OK;
    if (cfg->flags & (CFG_ALPN | CFG_TFO))
        classify_incoming(skb, cfg, &p);
    if (cfg->flags & CFG_SAMPLE) {
        sample_request_in(cfg, &p);
        sample_response_in(cfg, &p);
    }
    return TC_ACT_OK;
}
