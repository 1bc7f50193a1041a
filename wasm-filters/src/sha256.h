#ifndef MCP_SHA256_H
#define MCP_SHA256_H
#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t h[8];
    uint64_t len;
    uint8_t buf[64];
    size_t fill;
} sha256_ctx;

typedef struct {
    sha256_ctx inner, outer;
} hmac_sha256_ctx;

void sha256_init(sha256_ctx *c);
void sha256_update(sha256_ctx *c, const void *data, size_t n);
void sha256_final(sha256_ctx *c, uint8_t out[32]);

/* HMAC is streamed: init with the key, feed the message into ->inner. */
void hmac_sha256_init(hmac_sha256_ctx *m, const uint8_t *key, size_t key_len);
#define hmac_sha256_update(m, d, n) sha256_update(&(m)->inner, (d), (n))
void hmac_sha256_final(hmac_sha256_ctx *m, uint8_t out[32]);

#endif
