/* The baseline for benchmarks: a tc program that only returns. */
#include <uapi/linux/pkt_cls.h>

int pass(struct __sk_buff *skb)
{
    return TC_ACT_OK;
}
