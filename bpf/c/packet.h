/* Packet parsing shared by the QoS programs: Ethernet -> IPv4/IPv6 -> TCP.
 *
 * Everything is read with bpf_skb_load_bytes() at computed offsets rather than
 * direct packet access: the verifier accepts variable offsets there, and
 * non-linear skbs (GSO, paged data) are handled by the kernel.
 */
#pragma once

#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/tcp.h>

#define L2_LEN          ETH_HLEN
#define IP4_TOS_OFF     (L2_LEN + offsetof(struct iphdr, tos))
#define IP4_CSUM_OFF    (L2_LEN + offsetof(struct iphdr, check))
#define TCP_FLAG_FIN    0x01
#define TCP_FLAG_SYN    0x02
#define TCP_FLAG_RST    0x04
#define TCP_FLAG_ACK    0x10

/* One TCP flow as seen on the wire. IPv4 addresses are stored IPv4-mapped
 * (::ffff:a.b.c.d) so that one key and one LPM trie serve both families. */
struct flow_key {
    u32 saddr[4];       /* network byte order */
    u32 daddr[4];
    u16 sport;          /* host byte order */
    u16 dport;
    u32 pad;
};

struct pkt {
    struct flow_key flow;
    u8 family;          /* 4 or 6, 0 when not IP */
    u8 is_tcp;
    u8 tcp_flags;
    u8 tos;             /* current TOS / traffic class byte */
    u32 payload_off;    /* TCP payload offset from the start of the frame */
    u32 payload_len;
    u32 seq;            /* TCP sequence number of the payload's first byte */
};

static __always_inline void map_v4(u32 *out, __be32 addr)
{
    out[0] = 0;
    out[1] = 0;
    out[2] = bpf_htonl(0x0000ffff);
    out[3] = addr;
}

/* Fills `p` from the frame; returns 0 when it is IPv4 or IPv6, -1 otherwise. */
static __always_inline int parse_packet(struct __sk_buff *skb, struct pkt *p)
{
    u32 l4_off;
    u32 ip_end;
    u8 proto;

    __builtin_memset(p, 0, sizeof(*p));
    if (skb->protocol == bpf_htons(ETH_P_IP)) {
        struct iphdr ip;
        if (bpf_skb_load_bytes(skb, L2_LEN, &ip, sizeof(ip)) < 0)
            return -1;
        if (ip.ihl < 5)
            return -1;
        p->family = 4;
        p->tos = ip.tos;
        map_v4(p->flow.saddr, ip.saddr);
        map_v4(p->flow.daddr, ip.daddr);
        /* Later fragments carry no TCP header. */
        if (ip.frag_off & bpf_htons(0x1fff))
            return 0;
        proto = ip.protocol;
        l4_off = L2_LEN + ip.ihl * 4;
        /* tot_len, not skb->len: short frames may carry Ethernet padding. */
        ip_end = L2_LEN + bpf_ntohs(ip.tot_len);
    } else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
        struct ipv6hdr ip6;
        if (bpf_skb_load_bytes(skb, L2_LEN, &ip6, sizeof(ip6)) < 0)
            return -1;
        p->family = 6;
        p->tos = (ip6.priority << 4) | (ip6.flow_lbl[0] >> 4);
        __builtin_memcpy(p->flow.saddr, &ip6.saddr, 16);
        __builtin_memcpy(p->flow.daddr, &ip6.daddr, 16);
        /* Extension headers are not walked: TCP must follow directly. */
        proto = ip6.nexthdr;
        l4_off = L2_LEN + sizeof(struct ipv6hdr);
        ip_end = l4_off + bpf_ntohs(ip6.payload_len);
    } else {
        return -1;
    }
    if (proto != IPPROTO_TCP)
        return 0;

    struct tcphdr tcp;
    if (bpf_skb_load_bytes(skb, l4_off, &tcp, sizeof(tcp)) < 0)
        return 0;
    p->is_tcp = 1;
    p->flow.sport = bpf_ntohs(tcp.source);
    p->flow.dport = bpf_ntohs(tcp.dest);
    p->tcp_flags = ((u8 *)&tcp)[13];
    p->seq = bpf_ntohl(tcp.seq);
    p->payload_off = l4_off + tcp.doff * 4;
    if (ip_end > skb->len)
        ip_end = skb->len;
    p->payload_len = ip_end > p->payload_off ? ip_end - p->payload_off : 0;
    return 0;
}

/* Rewrites the DSCP (upper six bits of TOS / traffic class), keeping ECN. */
static __always_inline int set_dscp(struct __sk_buff *skb, struct pkt *p, u8 dscp)
{
    u8 tos = (dscp << 2) | (p->tos & 0x3);

    if (tos == p->tos)
        return 0;
    if (p->family == 4) {
        /* The IPv4 header checksum covers TOS; fix it incrementally over the
         * 16-bit word holding version/IHL and TOS. */
        u16 old_word, new_word;
        if (bpf_skb_load_bytes(skb, L2_LEN, &old_word, 2) < 0)
            return -1;
        new_word = old_word;
        ((u8 *)&new_word)[1] = tos;
        if (bpf_l3_csum_replace(skb, IP4_CSUM_OFF, old_word, new_word, 2) < 0)
            return -1;
        return bpf_skb_store_bytes(skb, IP4_TOS_OFF, &tos, 1, 0);
    }
    if (p->family == 6) {
        /* version(4) | traffic class(8) | flow label(20); no header checksum,
         * and the TCP pseudo-header does not cover the traffic class. */
        u8 b[2];
        if (bpf_skb_load_bytes(skb, L2_LEN, b, 2) < 0)
            return -1;
        b[0] = (b[0] & 0xf0) | (tos >> 4);
        b[1] = (b[1] & 0x0f) | (tos << 4);
        return bpf_skb_store_bytes(skb, L2_LEN, b, 2, 0);
    }
    return -1;
}
