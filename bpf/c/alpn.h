/* TLS ClientHello ALPN classifier.
 *
 * Reads the ALPN extension (RFC 7301) of a ClientHello in the flow's first
 * data segment and looks each offered protocol up in `alpn_dscp` (filled by
 * user space from mesh.qos.ALPN_DSCP), in the client's preference order. The
 * server's choice is not visible (TLS 1.3 encrypts it), so the client's most
 * preferred protocol that has a class wins.
 *
 * Every loop is bounded by a constant and every read is checked, so a
 * truncated or malformed ClientHello just yields "no class".
 */
#pragma once

#include "packet.h"

/* ALPN_NAME_MAX (key size; names up to ALPN_NAME_MAX-1 bytes match),
 * TLS_MAX_EXTENSIONS, ALPN_MAX_PROTOCOLS and the ALPN_* states of a flow
 * (ALPN_NOT_CLIENT_HELLO, ALPN_NO_EXTENSION, ALPN_UNCLASSED, ALPN_CLASSED)
 * are -D flags from bpf/layout.py. */
#define TLS_EXT_ALPN        16

struct alpn_name {
    char name[ALPN_NAME_MAX];   /* zero padded */
};

struct flow_alpn {
    u8 state;
    u8 dscp;
    u8 len;
    u8 pad;
    char proto[ALPN_NAME_MAX];  /* the matched protocol, else the first offered */
};

BPF_HASH(alpn_dscp, struct alpn_name, u8, 64);

static __always_inline u16 be16_at(u8 *b) { return ((u16)b[0] << 8) | b[1]; }

/* Looks at the ALPN extension body [off, end); fills `out`. */
static __always_inline void parse_alpn_ext(struct __sk_buff *skb, u32 off, u32 end,
                                           struct flow_alpn *out)
{
    u8 b[2];

    if (bpf_skb_load_bytes(skb, off, b, 2) < 0)
        return;
    if (off + 2 + be16_at(b) != end)      /* list length must fill the extension */
        return;
    off += 2;

    u8 state = ALPN_UNCLASSED;
    for (int i = 0; i < ALPN_MAX_PROTOCOLS; i++) {
        if (off >= end)
            break;
        u8 n;
        if (bpf_skb_load_bytes(skb, off, &n, 1) < 0)
            return;
        if (n == 0 || off + 1 + n > end)  /* empty or overrunning name: malformed */
            return;
        if (n < ALPN_NAME_MAX) {
            struct alpn_name key = {};
            if (bpf_skb_load_bytes(skb, off + 1, key.name, n & (ALPN_NAME_MAX - 1)) < 0)
                return;
            u8 *dscp = alpn_dscp.lookup(&key);
            if (dscp && state != ALPN_CLASSED) {
                state = ALPN_CLASSED;
                out->dscp = *dscp;
                out->len = n;
                __builtin_memcpy(out->proto, key.name, ALPN_NAME_MAX);
            } else if (i == 0) {
                out->len = n;
                __builtin_memcpy(out->proto, key.name, ALPN_NAME_MAX);
            }
        }
        off += 1 + n;
    }
    out->state = state;
}

/* Parses a ClientHello starting at `off` (the TCP payload). The segment may
 * hold only the start of a large ClientHello: the extensions present in it are
 * read, and the flow is classed only if the ALPN extension is wholly here. */
static __always_inline void parse_client_hello(struct __sk_buff *skb, u32 off,
                                               struct flow_alpn *out)
{
    u8 h[9];     /* record header (5) + handshake header (4) */

    out->state = ALPN_NOT_CLIENT_HELLO;
    if (bpf_skb_load_bytes(skb, off, h, sizeof(h)) < 0)
        return;
    if (h[0] != 0x16 || h[1] != 0x03 || h[5] != 0x01)  /* handshake, TLS, ClientHello */
        return;
    u32 rec_len = be16_at(&h[3]);
    u32 hs_len = ((u32)h[6] << 16) | be16_at(&h[7]);
    if (hs_len + 4 > rec_len)       /* a ClientHello split over records: not handled */
        return;
    u32 end = off + 9 + hs_len;     /* end of the ClientHello */

    u32 p = off + 9 + 2 + 32;       /* client_version, random */
    u8 n1;
    if (bpf_skb_load_bytes(skb, p, &n1, 1) < 0)        /* session id */
        return;
    p += 1 + n1;
    u8 b[4];
    if (bpf_skb_load_bytes(skb, p, b, 2) < 0)          /* cipher suites */
        return;
    p += 2 + be16_at(b);
    if (bpf_skb_load_bytes(skb, p, &n1, 1) < 0)        /* compression methods */
        return;
    p += 1 + n1;
    if (p == end) {                 /* no extensions at all */
        out->state = ALPN_NO_EXTENSION;
        return;
    }
    if (bpf_skb_load_bytes(skb, p, b, 2) < 0)
        return;
    u32 ext_end = p + 2 + be16_at(b);
    if (ext_end != end)             /* extensions must fill the ClientHello */
        return;
    p += 2;

    for (int i = 0; i < TLS_MAX_EXTENSIONS; i++) {
        if (p + 4 > ext_end)
            break;
        if (bpf_skb_load_bytes(skb, p, b, 4) < 0)      /* end of this segment */
            return;
        u32 type = be16_at(b), len = be16_at(&b[2]);
        if (p + 4 + len > ext_end)
            return;                 /* overruns the extension block: malformed */
        if (type == TLS_EXT_ALPN) {
            if (p + 4 + len > skb->len)
                return;             /* ALPN cut off by the segment end */
            parse_alpn_ext(skb, p + 4, p + 4 + len, out);
            if (out->state == ALPN_NOT_CLIENT_HELLO) {
                out->len = 0;       /* malformed ALPN: forget a half-read name */
                out->dscp = 0;
                __builtin_memset(out->proto, 0, ALPN_NAME_MAX);
            }
            return;
        }
        p += 4 + len;
    }
    if (p == ext_end)
        out->state = ALPN_NO_EXTENSION;
}
