/* MCP Mesh L6->L7 header contract, a Proxy-Wasm (ABI 0.2.1) HTTP filter.
 *
 * Per request: drop every session/QoS/identity header the client sent, set
 * the session headers from the claims jwt_authn verified (read from its
 * dynamic metadata, which a client cannot write), strip tenant-scoped headers
 * outside the caller's tenant whitelist, compute the QoS class, and sign the
 * session headers bound to this request (x-mcp-session-sig v2, HMAC-SHA256
 * over the issue time, :method, x-request-id and the headers; mesh/session.py
 * defines the canonical form). Per response: map the
 * gRPC status (or HTTP status) to an error class.
 *
 * The C side hard-codes no contract: header names, classes, levels, the
 * error map and the key all arrive in the JSON plugin configuration that
 * the control plane generates from mesh definitions (mesh.header_contract).
 * It fails closed: a bad configuration makes proxy_on_configure return
 * false; a request arriving with no usable configuration gets a 500.
 */
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "proxy_wasm.h"
#include "sha256.h"

#define EXPORT(name) __attribute__((export_name(#name)))

/* ---------------------------------------------------------------- limits */
#define MAX_NODES 2048
#define MAX_PATH 8          /* property path segments */
#define MAX_STRIP 48
#define MAX_CLAIMS 16
#define MAX_SIGNED 16
#define MAX_TENANTS 64
#define MAX_ALLOWED 32
#define MAX_PREFIXES 8
#define MAX_COMMON 64
#define MAX_CLASSES 8
#define MAX_PAIRS 16
#define MAX_ERR_CODES 17    /* gRPC status 0..16 */
#define MAX_HTTP_ERR 16
#define MAX_VALUE 1024      /* longest claim value we will put into a header */
#define MAX_ROOTS 8
#define MAX_NAME 128        /* longest header name the configuration may use */

typedef struct { const char *p; uint32_t n; } str_t;
typedef struct { str_t key; int cls; } class_pair;      /* value -> class index */
typedef struct { str_t claim; str_t header; } claim_map;
typedef struct { str_t name; str_t allowed[MAX_ALLOWED]; int n_allowed; int strict; } tenant_t;
typedef struct { str_t name; int64_t level; } qos_class;
typedef struct { int from, to; int64_t until_ns; } class_remap;   /* the decision loop's, with expiry */
#define MAX_REMAPS 8

typedef struct {
    char *buf;                              /* owns the (in-place parsed) JSON text */
    str_t payload[MAX_PATH]; int n_payload;
    str_t strip[MAX_STRIP]; int n_strip;
    claim_map claims[MAX_CLAIMS]; int n_claims;
    /* tenants */
    str_t tenant_header;
    str_t prefixes[MAX_PREFIXES]; int n_prefixes;
    str_t common[MAX_COMMON]; int n_common;
    tenant_t tenants[MAX_TENANTS]; int n_tenants;
    /* session signature */
    str_t sig_header;
    str_t signed_hdrs[MAX_SIGNED]; int n_signed;
    uint8_t key[64]; int key_len;
    hmac_sha256_ctx hmac;                   /* the keyed state, computed once */
    /* QoS */
    str_t qos_header, priority_header, tier_claim;
    qos_class classes[MAX_CLASSES]; int n_classes;
    class_pair priority[MAX_PAIRS]; int n_priority;
    class_pair protocol_map[MAX_PAIRS]; int n_protocol;
    str_t alpn_header;                      /* set by Envoy from the TLS ALPN (empty: not configured) */
    class_pair alpn_map[MAX_PAIRS]; int n_alpn;
    class_pair tiers[MAX_PAIRS]; int n_tiers;
    str_t protocol_path[MAX_PATH]; int n_protocol_path;
    str_t route_class_path[MAX_PATH]; int n_route_class_path;   /* an L7SchedulingPolicy route's class */
    int default_class, ceiling_class;
    class_remap remaps[MAX_REMAPS]; int n_remaps;
    /* identity */
    str_t identity_header;
    str_t identity_path[MAX_PATH]; int n_identity_path;
    /* error classes */
    str_t error_header;
    str_t grpc_class[MAX_ERR_CODES];
    int64_t http_code[MAX_HTTP_ERR]; str_t http_class[MAX_HTTP_ERR]; int n_http;
    str_t http_4xx, http_5xx, http_ok, grpc_default;
} config_t;

/* ------------------------------------------------------------ utilities */
static void logmsg(int level, const char *msg) { proxy_log(level, msg, strlen(msg)); }

static int str_eq(str_t a, const char *b, size_t n) { return a.n == n && memcmp(a.p, b, n) == 0; }

static char lower(char c) { return (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c; }

static int str_ieq(str_t a, const char *b, size_t n) {
    if (a.n != n) return 0;
    for (size_t i = 0; i < n; i++) if (lower(a.p[i]) != lower(b[i])) return 0;
    return 1;
}

/* RFC 7230 tchar. */
static int is_tchar(unsigned char c) {
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return 1;
    return c && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static int is_token(const char *p, size_t n) {
    if (!n) return 0;
    for (size_t i = 0; i < n; i++) if (!is_tchar((unsigned char)p[i])) return 0;
    return 1;
}

/* A lower-case token: what a header name in the config must be. */
static int is_header_name(str_t s) {
    if (s.n > MAX_NAME || !is_token(s.p, s.n)) return 0;
    for (uint32_t i = 0; i < s.n; i++) if (s.p[i] >= 'A' && s.p[i] <= 'Z') return 0;
    return 1;
}

/* A value we may put into a header unchanged (mesh.session.carriable): visible
 * ASCII and SP/HTAB, no CTL, and no SP/HTAB at either end, which HTTP/1 would
 * strip so that the signature no longer matched. */
static int is_header_value(const char *p, size_t n) {
    if (!n || n > MAX_VALUE) return 0;
    if (p[0] == ' ' || p[0] == '\t' || p[n - 1] == ' ' || p[n - 1] == '\t') return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f || c >= 0x80) return 0;
    }
    return 1;
}

/* `pattern` is an exact name or a prefix ending in '*'. */
static int name_matches(str_t pattern, const char *name, size_t n) {
    if (pattern.n && pattern.p[pattern.n - 1] == '*')
        return n >= pattern.n - 1 && memcmp(pattern.p, name, pattern.n - 1) == 0;
    return pattern.n == n && memcmp(pattern.p, name, n) == 0;
}

static int in_list(const str_t *list, int count, const char *name, size_t n) {
    for (int i = 0; i < count; i++) if (name_matches(list[i], name, n)) return 1;
    return 0;
}

/* ------------------------------------------------------ configuration */
typedef struct { const json_node *nodes; const char *err; } cfg_parse;

/* "<key>: <msg>" in a static buffer: configuration errors name the field. */
static char field_msg[120];
static const char *field_err(const char *key, const char *msg) {
    size_t n = 0;
    for (const char *s = key; *s && n < 60; s++) field_msg[n++] = *s;
    field_msg[n++] = ':'; field_msg[n++] = ' ';
    for (const char *s = msg; *s && n < sizeof field_msg - 1; s++) field_msg[n++] = *s;
    field_msg[n] = 0;
    return field_msg;
}
#define missing(key) field_err((key), "missing field")

#define NEED(cond, msg) do { if (!(cond)) { cp->err = (msg); return -1; } } while (0)

static int get_str(cfg_parse *cp, const json_node *obj, const char *key, str_t *out, int required) {
    const json_node *v = json_get(cp->nodes, obj, key);
    if (!v) { if (required) { cp->err = missing(key); return -1; } out->p = ""; out->n = 0; return 0; }
    NEED(v->type == J_STR, field_err(key, "expected a string"));
    out->p = v->str; out->n = v->len;
    return 0;
}

static int get_header_name(cfg_parse *cp, const json_node *obj, const char *key, str_t *out) {
    if (get_str(cp, obj, key, out, 1) < 0) return -1;
    NEED(is_header_name(*out), field_err(key, "header name must be a lower-case RFC 7230 token"));
    return 0;
}

/* A list of strings; header names (optionally with a trailing '*') when `names`. */
static int get_str_list(cfg_parse *cp, const json_node *obj, const char *key, str_t *out, int *count, int max,
                        int names, int required) {
    const json_node *v = json_get(cp->nodes, obj, key);
    *count = 0;
    if (!v) { NEED(!required, missing(key)); return 0; }
    NEED(v->type == J_ARR, field_err(key, "expected a list"));
    NEED((int)v->len <= max, field_err(key, "list too long"));
    for (const json_node *e = JSON_CHILD(cp->nodes, v); e; e = JSON_NEXT(cp->nodes, e)) {
        NEED(e->type == J_STR && e->len > 0, field_err(key, "expected a non-empty string in list"));
        str_t s = {e->str, e->len};
        if (names) {
            str_t base = s;
            if (base.n > 1 && base.p[base.n - 1] == '*') base.n--;
            NEED(is_header_name(base), field_err(key, "header name must be a lower-case RFC 7230 token"));
        }
        out[(*count)++] = s;
    }
    return 0;
}

static int class_index(const config_t *c, const char *p, size_t n) {
    for (int i = 0; i < c->n_classes; i++) if (str_eq(c->classes[i].name, p, n)) return i;
    return -1;
}

static int get_class(cfg_parse *cp, const config_t *c, const json_node *obj, const char *key, int *out) {
    str_t s;
    if (get_str(cp, obj, key, &s, 1) < 0) return -1;
    *out = class_index(c, s.p, s.n);
    NEED(*out >= 0, field_err(key, "unknown QoS class"));
    return 0;
}

/* {"value": "class", ...} */
static int get_class_map(cfg_parse *cp, const config_t *c, const json_node *obj, const char *key, class_pair *out,
                         int *count) {
    const json_node *m = json_get(cp->nodes, obj, key);
    *count = 0;
    if (!m) return 0;
    NEED(m->type == J_OBJ && m->len <= MAX_PAIRS, field_err(key, "expected an object of at most 16 entries"));
    for (const json_node *k = JSON_CHILD(cp->nodes, m); k; ) {
        const json_node *v = JSON_NEXT(cp->nodes, k);
        NEED(v->type == J_STR, field_err(key, "expected a QoS class name"));
        int ci = class_index(c, v->str, v->len);
        NEED(ci >= 0, field_err(key, "unknown QoS class"));
        out[*count].key.p = k->str; out[*count].key.n = k->len; out[*count].cls = ci;
        (*count)++;
        k = JSON_NEXT(cp->nodes, v);
    }
    return 0;
}

static int unhex(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    return -1;
}

static int parse_config_in(config_t *c, cfg_parse *cp) {
    const json_node *nodes = cp->nodes, *root = &nodes[0], *sec, *v;
#define TRY(x) do { if ((x) < 0) return -1; } while (0)
    NEED(root->type == J_OBJ, "configuration must be a JSON object");
    v = json_get(nodes, root, "v");
    NEED(v && v->type == J_NUM && v->is_int && v->num == 1, "unsupported configuration version (want v: 1)");

    TRY(get_str_list(cp, root, "strip", c->strip, &c->n_strip, MAX_STRIP, 1, 1));
    TRY(get_str_list(cp, root, "payload", c->payload, &c->n_payload, MAX_PATH - 1, 0, 1));

    v = json_get(nodes, root, "claims");
    NEED(v && v->type == J_ARR && v->len <= MAX_CLAIMS, "claims: expected a list of at most 16");
    for (const json_node *e = JSON_CHILD(nodes, v); e; e = JSON_NEXT(nodes, e)) {
        claim_map *m = &c->claims[c->n_claims++];
        TRY(get_str(cp, e, "claim", &m->claim, 1));
        NEED(m->claim.n > 0, "claims: empty claim name");
        TRY(get_header_name(cp, e, "header", &m->header));
        NEED(in_list(c->strip, c->n_strip, m->header.p, m->header.n), "claims: a claim header must also be stripped");
    }

    sec = json_get(nodes, root, "tenant");
    NEED(sec && sec->type == J_OBJ, "tenant: expected an object");
    TRY(get_header_name(cp, sec, "header", &c->tenant_header));
    TRY(get_str_list(cp, sec, "scoped_prefixes", c->prefixes, &c->n_prefixes, MAX_PREFIXES, 1, 1));
    TRY(get_str_list(cp, sec, "common", c->common, &c->n_common, MAX_COMMON, 1, 0));
    v = json_get(nodes, sec, "tenants");
    NEED(v && v->type == J_ARR && v->len <= MAX_TENANTS, "tenant.tenants: expected a list of at most 64");
    for (const json_node *e = JSON_CHILD(nodes, v); e; e = JSON_NEXT(nodes, e)) {
        tenant_t *t = &c->tenants[c->n_tenants++];
        TRY(get_str(cp, e, "name", &t->name, 1));
        NEED(t->name.n > 0, "tenant.tenants: empty name");
        TRY(get_str_list(cp, e, "allowed", t->allowed, &t->n_allowed, MAX_ALLOWED, 1, 1));
        const json_node *s = json_get(nodes, e, "strict");
        NEED(!s || s->type == J_BOOL, "tenant.tenants.strict: expected a boolean");
        t->strict = s ? (int)s->num : 0;
    }

    sec = json_get(nodes, root, "session");
    NEED(sec && sec->type == J_OBJ, "session: expected an object");
    TRY(get_header_name(cp, sec, "header", &c->sig_header));
    NEED(in_list(c->strip, c->n_strip, c->sig_header.p, c->sig_header.n), "session.header must also be stripped");
    TRY(get_str_list(cp, sec, "signed", c->signed_hdrs, &c->n_signed, MAX_SIGNED, 1, 1));
    str_t key, key_env;
    TRY(get_str(cp, sec, "key_env", &key_env, 0));
    if (key_env.n) {
        /* The key stays out of the configuration (Envoy's config dump shows that):
         * Envoy hands the named variable of its own environment to the VM
         * (vm_config.environment_variables.host_env_keys), read here through WASI. */
        char env_name[65];
        NEED(key_env.n < sizeof env_name, "session.key_env: name too long");
        for (uint32_t i = 0; i < key_env.n; i++) {
            char ch = key_env.p[i];
            NEED(ch == '_' || (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (i && ch >= '0' && ch <= '9'),
                 "session.key_env: expected an environment variable name");
            env_name[i] = ch;
        }
        env_name[key_env.n] = 0;
        key.p = getenv(env_name);
        NEED(key.p, "session.key_env: the variable is not set in the VM's environment (host_env_keys)");
        key.n = (uint32_t)strlen(key.p);
    } else {
        TRY(get_str(cp, sec, "key", &key, 1));
    }
    NEED(key.n >= 32 && key.n <= 128 && key.n % 2 == 0, "session.key: expected 16..64 bytes as lower-case hex");
    for (uint32_t i = 0; i < key.n; i += 2) {
        int hi = unhex(key.p[i]), lo = unhex(key.p[i + 1]);
        NEED(hi >= 0 && lo >= 0, "session.key: not lower-case hex");
        c->key[i / 2] = (uint8_t)(hi << 4 | lo);
    }
    c->key_len = (int)key.n / 2;
    hmac_sha256_init(&c->hmac, c->key, (size_t)c->key_len);

    sec = json_get(nodes, root, "qos");
    NEED(sec && sec->type == J_OBJ, "qos: expected an object");
    TRY(get_header_name(cp, sec, "header", &c->qos_header));
    TRY(get_header_name(cp, sec, "priority_header", &c->priority_header));
    TRY(get_str(cp, sec, "tier_claim", &c->tier_claim, 0));
    v = json_get(nodes, sec, "classes");
    NEED(v && v->type == J_ARR && v->len > 0 && v->len <= MAX_CLASSES, "qos.classes: expected 1..8 classes");
    for (const json_node *e = JSON_CHILD(nodes, v); e; e = JSON_NEXT(nodes, e)) {
        qos_class *q = &c->classes[c->n_classes];
        TRY(get_str(cp, e, "name", &q->name, 1));
        NEED(is_token(q->name.p, q->name.n), "qos.classes.name: expected a token");
        const json_node *lv = json_get(nodes, e, "level");
        NEED(lv && lv->type == J_NUM && lv->is_int && lv->num >= 1 && lv->num <= 64, "qos.classes.level: expected 1..64");
        q->level = lv->num;
        NEED(class_index(c, q->name.p, q->name.n) < 0, "qos.classes: duplicate class");
        c->n_classes++;
    }
    TRY(get_class_map(cp, c, sec, "priority", c->priority, &c->n_priority));
    TRY(get_class_map(cp, c, sec, "protocol", c->protocol_map, &c->n_protocol));
    if (json_get(nodes, sec, "alpn_header")) {
        TRY(get_header_name(cp, sec, "alpn_header", &c->alpn_header));
        /* a client's own copy must never pass upstream */
        NEED(in_list(c->strip, c->n_strip, c->alpn_header.p, c->alpn_header.n), "qos.alpn_header must also be stripped");
    }
    TRY(get_class_map(cp, c, sec, "alpn", c->alpn_map, &c->n_alpn));
    TRY(get_class_map(cp, c, sec, "tiers", c->tiers, &c->n_tiers));
    TRY(get_str_list(cp, sec, "protocol_property", c->protocol_path, &c->n_protocol_path, MAX_PATH, 0, 0));
    TRY(get_str_list(cp, sec, "route_class_property", c->route_class_path, &c->n_route_class_path, MAX_PATH, 0, 0));
    TRY(get_class(cp, c, sec, "default", &c->default_class));
    TRY(get_class(cp, c, sec, "ceiling", &c->ceiling_class));
    /* [{"from","to","until_ns"}]: the decision loop's remaps (optional) */
    v = json_get(nodes, sec, "remap");
    if (v) {
        NEED(v->type == J_ARR && v->len <= MAX_REMAPS, "qos.remap: expected at most 8 entries");
        for (const json_node *e = JSON_CHILD(nodes, v); e; e = JSON_NEXT(nodes, e)) {
            class_remap *r = &c->remaps[c->n_remaps];
            NEED(e->type == J_OBJ, "qos.remap: expected objects");
            TRY(get_class(cp, c, e, "from", &r->from));
            TRY(get_class(cp, c, e, "to", &r->to));
            const json_node *u = json_get(nodes, e, "until_ns");
            NEED(u && u->type == J_NUM && u->is_int && u->num > 0, "qos.remap.until_ns: expected a positive integer");
            r->until_ns = u->num;
            c->n_remaps++;
        }
    }

    sec = json_get(nodes, root, "identity");
    if (sec) {
        NEED(sec->type == J_OBJ, "identity: expected an object");
        TRY(get_header_name(cp, sec, "header", &c->identity_header));
        NEED(in_list(c->strip, c->n_strip, c->identity_header.p, c->identity_header.n),
             "identity.header must also be stripped");
        TRY(get_str_list(cp, sec, "property", c->identity_path, &c->n_identity_path, MAX_PATH, 0, 1));
    }

    sec = json_get(nodes, root, "errors");
    NEED(sec && sec->type == J_OBJ, "errors: expected an object");
    TRY(get_header_name(cp, sec, "header", &c->error_header));
    TRY(get_str(cp, sec, "grpc_default", &c->grpc_default, 1));
    TRY(get_str(cp, sec, "http_ok", &c->http_ok, 1));
    TRY(get_str(cp, sec, "http_4xx", &c->http_4xx, 1));
    TRY(get_str(cp, sec, "http_5xx", &c->http_5xx, 1));
    v = json_get(nodes, sec, "grpc");
    NEED(v && v->type == J_OBJ, "errors.grpc: expected an object");
    for (const json_node *k = JSON_CHILD(nodes, v); k; ) {
        const json_node *val = JSON_NEXT(nodes, k);
        int code = 0;
        NEED(k->len >= 1 && k->len <= 2, "errors.grpc: keys are gRPC status codes 0..16");
        for (uint32_t i = 0; i < k->len; i++) {
            NEED(k->str[i] >= '0' && k->str[i] <= '9', "errors.grpc: keys are gRPC status codes 0..16");
            code = code * 10 + (k->str[i] - '0');
        }
        NEED(code < MAX_ERR_CODES, "errors.grpc: keys are gRPC status codes 0..16");
        NEED(val->type == J_STR && is_token(val->str, val->len), "errors.grpc: expected an error class token");
        c->grpc_class[code].p = val->str; c->grpc_class[code].n = val->len;
        k = JSON_NEXT(nodes, val);
    }
    v = json_get(nodes, sec, "http");
    if (v) {
        NEED(v->type == J_OBJ && v->len <= MAX_HTTP_ERR, "errors.http: expected an object of at most 16");
        for (const json_node *k = JSON_CHILD(nodes, v); k; ) {
            const json_node *val = JSON_NEXT(nodes, k);
            int code = 0;
            NEED(k->len == 3, "errors.http: keys are HTTP status codes");
            for (int i = 0; i < 3; i++) {
                NEED(k->str[i] >= '0' && k->str[i] <= '9', "errors.http: keys are HTTP status codes");
                code = code * 10 + (k->str[i] - '0');
            }
            NEED(val->type == J_STR && is_token(val->str, val->len), "errors.http: expected an error class token");
            c->http_code[c->n_http] = code;
            c->http_class[c->n_http].p = val->str; c->http_class[c->n_http].n = val->len;
            c->n_http++;
            k = JSON_NEXT(nodes, val);
        }
    }
    NEED(is_token(c->grpc_default.p, c->grpc_default.n) && is_token(c->http_ok.p, c->http_ok.n) &&
         is_token(c->http_4xx.p, c->http_4xx.n) && is_token(c->http_5xx.p, c->http_5xx.n),
         "errors: class names must be tokens");
#undef TRY
    return 0;
}

static int parse_config(config_t *c, const json_node *nodes, const char **err) {
    cfg_parse st = {nodes, NULL};
    int rc = parse_config_in(c, &st);
    *err = st.err;
    return rc;
}

/* ------------------------------------------------ contexts and roots */
typedef struct { uint32_t id; config_t *cfg; } root_t;
static root_t roots[MAX_ROOTS];
static int n_roots;
static json_node nodes[MAX_NODES];   /* scratch, used only while configuring */

/* Stream context -> root context, in a small open-addressing table that grows. */
typedef struct { uint32_t ctx, root; } ctx_slot;
static ctx_slot *slots;
static uint32_t n_slots, n_used;

static uint32_t hash32(uint32_t x) { x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; return x ^ (x >> 16); }

static int slot_put(uint32_t ctx, uint32_t root);

static int slots_grow(void) {
    ctx_slot *old = slots;
    uint32_t old_n = n_slots;
    uint32_t n = old_n ? old_n * 2 : 256;
    ctx_slot *fresh = calloc(n, sizeof *fresh);
    if (!fresh) return -1;
    slots = fresh; n_slots = n; n_used = 0;
    for (uint32_t i = 0; i < old_n; i++) if (old[i].ctx) slot_put(old[i].ctx, old[i].root);
    free(old);
    return 0;
}

static int slot_put(uint32_t ctx, uint32_t root) {
    if ((n_used + 1) * 2 > n_slots && slots_grow() < 0) return -1;
    for (uint32_t i = hash32(ctx) & (n_slots - 1);; i = (i + 1) & (n_slots - 1)) {
        if (slots[i].ctx == 0 || slots[i].ctx == ctx) {
            if (slots[i].ctx == 0) n_used++;
            slots[i].ctx = ctx; slots[i].root = root;
            return 0;
        }
    }
}

static uint32_t slot_get(uint32_t ctx) {
    if (!n_slots) return 0;
    for (uint32_t i = hash32(ctx) & (n_slots - 1);; i = (i + 1) & (n_slots - 1)) {
        if (slots[i].ctx == ctx) return slots[i].root;
        if (slots[i].ctx == 0) return 0;
    }
}

/* Backward-shift deletion keeps probe chains intact without tombstones. */
static void slot_del(uint32_t ctx) {
    if (!n_slots) return;
    uint32_t mask = n_slots - 1, i = hash32(ctx) & mask, j;
    while (slots[i].ctx != ctx) { if (slots[i].ctx == 0) return; i = (i + 1) & mask; }
    n_used--;
    for (j = i;;) {
        slots[i].ctx = 0;
        for (;;) {
            j = (j + 1) & mask;
            if (slots[j].ctx == 0) return;
            uint32_t home = hash32(slots[j].ctx) & mask;
            int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
            if (!stays) break;   /* j's probe chain passes through the hole at i */
        }
        slots[i] = slots[j];
        i = j;
    }
}

static root_t *find_root(uint32_t id) {
    for (int i = 0; i < n_roots; i++) if (roots[i].id == id) return &roots[i];
    return NULL;
}

static config_t *config_for(uint32_t ctx) {
    root_t *r = find_root(slot_get(ctx));
    return r ? r->cfg : NULL;
}

static void free_config(config_t *c) {
    if (!c) return;
    free(c->buf);
    free(c);
}

/* ------------------------------------------------------------ exports */
EXPORT(proxy_abi_version_0_2_1) void proxy_abi_version_0_2_1(void) {}

EXPORT(proxy_on_memory_allocate) void *proxy_on_memory_allocate(size_t size) { return malloc(size ? size : 1); }

EXPORT(proxy_on_vm_start) int32_t proxy_on_vm_start(uint32_t root_id, size_t vm_config_size) {
    (void)root_id; (void)vm_config_size;
    return 1;
}

EXPORT(proxy_on_context_create) void proxy_on_context_create(uint32_t ctx, uint32_t root) {
    if (root == 0) {   /* a root context (one per plugin) */
        if (!find_root(ctx) && n_roots < MAX_ROOTS) { roots[n_roots].id = ctx; roots[n_roots].cfg = NULL; n_roots++; }
        return;
    }
    slot_put(ctx, root);   /* on failure the stream finds no config and fails closed */
}

EXPORT(proxy_on_configure) int32_t proxy_on_configure(uint32_t root_id, size_t size) {
    root_t *r = find_root(root_id);
    if (!r) { logmsg(LOG_ERROR, "mcp header contract: unknown root context"); return 0; }
    char *raw = NULL;
    size_t got = 0;
    if (size == 0 || proxy_get_buffer_bytes(BUFFER_PLUGIN_CONFIGURATION, 0, size, &raw, &got) != WASM_OK || !raw) {
        logmsg(LOG_ERROR, "mcp header contract: no plugin configuration (fail closed)");
        return 0;
    }
    config_t *c = calloc(1, sizeof *c);
    const char *err = NULL;
    if (!c || json_parse(raw, got, nodes, MAX_NODES, &err) < 0 || parse_config(c, nodes, &err) < 0) {
        char msg[200];
        size_t n = 0;
        const char *pre = "mcp header contract: invalid configuration: ";
        for (const char *s = pre; *s && n < sizeof msg - 1; s++) msg[n++] = *s;
        for (const char *s = err ? err : "out of memory"; *s && n < sizeof msg - 1; s++) msg[n++] = *s;
        proxy_log(LOG_ERROR, msg, n);
        free(raw);
        free(c);
        free_config(r->cfg);   /* fail closed: no stale configuration keeps serving */
        r->cfg = NULL;
        return 0;
    }
    c->buf = raw;   /* strings in *c point into raw */
    free_config(r->cfg);
    r->cfg = c;
    return 1;
}

/* ------------------------------------------------------ request path */
typedef struct { const char *k; size_t kn; const char *v; size_t vn; } pair_t;

/* Parses the ABI's serialised header map in place; returns the count or -1. */
static int parse_pairs(const char *buf, size_t size, pair_t *out, int max) {
    if (size < 4) return -1;
    uint32_t n;
    memcpy(&n, buf, 4);
    if (n > (uint32_t)max || (size_t)n * 8 + 4 > size) return -1;
    const char *data = buf + 4 + (size_t)n * 8, *end = buf + size;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t kl, vl;
        memcpy(&kl, buf + 4 + 8 * i, 4);
        memcpy(&vl, buf + 8 + 8 * i, 4);
        if ((size_t)(end - data) < (size_t)kl + vl + 2) return -1;
        out[i].k = data; out[i].kn = kl; data += kl + 1;
        out[i].v = data; out[i].vn = vl; data += vl + 1;
    }
    return (int)n;
}

/* proxy_get_property over prefix + one more segment; the caller frees *out. */
static int get_property(const str_t *prefix, int n_prefix, const str_t *last, char **out, size_t *out_n) {
    char path[512];
    size_t n = 0;
    for (int i = 0; i <= n_prefix; i++) {
        const str_t *s = i < n_prefix ? &prefix[i] : last;
        if (!s) break;
        if (n + s->n + 1 > sizeof path) return -1;
        if (n) path[n++] = '\0';
        memcpy(path + n, s->p, s->n);
        n += s->n;
    }
    *out = NULL; *out_n = 0;
    if (proxy_get_property(path, n, out, out_n) != WASM_OK || !*out) { free(*out); *out = NULL; return -1; }
    return 0;
}

static void local_reply(uint32_t status, const char *details, const char *body) {
    proxy_send_local_response(status, details, strlen(details), body, strlen(body), NULL, 0, -1);
}

static int tenant_allows(const tenant_t *t, const config_t *c, const char *k, size_t kn) {
    return (t && in_list(t->allowed, t->n_allowed, k, kn)) || in_list(c->common, c->n_common, k, kn);
}

#define MAX_HEADERS 256

/* A header the filter sets on the request. */
typedef struct { const char *k; size_t kn; const char *v; size_t vn; } out_pair;

/* A top-level string claim of the payload map (Envoy serialises a map
 * property as header-map pairs; non-string values come as binary). Scans the
 * serialised buffer itself, so a token with any number of claims is fine.
 * -> 1 found, 0 absent, -1 present but not carriable in a header. */
static int find_claim(const char *buf, size_t size, str_t name, const char **v, size_t *vn) {
    uint32_t n;
    if (!buf || size < 4) return 0;
    memcpy(&n, buf, 4);
    if ((size - 4) / 8 < n) return 0;
    const char *data = buf + 4 + (size_t)n * 8, *end = buf + size;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t kl, vl;
        memcpy(&kl, buf + 4 + 8 * i, 4);
        memcpy(&vl, buf + 8 + 8 * i, 4);
        if ((size_t)(end - data) < (size_t)kl + vl + 2) return 0;
        if (str_eq(name, data, kl)) {
            if (!is_header_value(data + kl + 1, vl)) return -1;
            *v = data + kl + 1; *vn = vl;
            return 1;
        }
        data += (size_t)kl + vl + 2;
    }
    return 0;
}


EXPORT(proxy_on_request_headers) int32_t proxy_on_request_headers(uint32_t ctx, uint32_t num_headers, int32_t eos) {
    (void)num_headers; (void)eos;
    config_t *c = config_for(ctx);
    if (!c) { local_reply(500, "mcp_header_contract_unconfigured", "header contract not configured\n"); return ACTION_PAUSE; }

    static pair_t hs[MAX_HEADERS];
    out_pair out[MAX_CLAIMS + 4];   /* the headers this filter sets */
    char *raw = NULL, *payload = NULL, *proto = NULL, *id = NULL, *routed = NULL;
    size_t raw_n = 0, payload_n = 0, pn = 0, idn = 0, rn = 0;
    int n = -1, no = 0, n_dropped = 0;
    static int dropped[MAX_HEADERS];
    int32_t action = ACTION_CONTINUE;
    if (proxy_get_header_map_pairs(MAP_REQUEST_HEADERS, &raw, &raw_n) == WASM_OK && raw)
        n = parse_pairs(raw, raw_n, hs, MAX_HEADERS);
    if (n < 0) {
        local_reply(431, "mcp_header_contract_headers", "too many or malformed request headers\n");
        action = ACTION_PAUSE;
        goto done;
    }

    /* 1. The claims jwt_authn verified, in one call (absent: no token). */
    get_property(c->payload, c->n_payload, NULL, &payload, &payload_n);   /* not a map: no claims */
    const char *claim_val[MAX_CLAIMS] = {0};
    size_t claim_n[MAX_CLAIMS] = {0};
    const char *tenant = NULL;
    size_t tenant_n = 0;
    for (int i = 0; i < c->n_claims; i++) {
        int found = find_claim(payload, payload_n, c->claims[i].claim, &claim_val[i], &claim_n[i]);
        if (found < 0)   /* never written, never signed: the request goes on without it */
            logmsg(LOG_WARN, "mcp header contract: a claim value is not carried (empty, control or non-ASCII "
                             "bytes, whitespace at an end, or over 1 KiB)");
        if (found <= 0) { claim_val[i] = NULL; continue; }
        if (str_eq(c->claims[i].header, c->tenant_header.p, c->tenant_header.n)) { tenant = claim_val[i]; tenant_n = claim_n[i]; }
    }
    const tenant_t *t = NULL;
    if (tenant)
        for (int i = 0; i < c->n_tenants; i++)
            if (str_eq(c->tenants[i].name, tenant, tenant_n)) { t = &c->tenants[i]; break; }

    /* 2. Which client headers go; remember the priority asked for. */
    int requested = -1, alpn_class = -1, have_alpn = 0;
    str_t method = {"", 0}, request_id = {"", 0};   /* what the signature binds */
    int n_request_id = 0;
    for (int i = 0; i < n; i++) {
        const char *k = hs[i].k;
        size_t kn = hs[i].kn;
        int drop = 0;
        if (kn == 7 && memcmp(k, ":method", 7) == 0) { method.p = hs[i].v; method.n = (uint32_t)hs[i].vn; }
        if (kn == 12 && memcmp(k, "x-request-id", 12) == 0 && n_request_id++ == 0) {
            request_id.p = hs[i].v; request_id.n = (uint32_t)hs[i].vn;
        }
        if (!(kn && k[0] == ':')) {                      /* pseudo-headers are the codec's */
            if (!is_token(k, kn)) {
                local_reply(400, "mcp_header_contract_bad_header_name", "header name is not an RFC 7230 token\n");
                action = ACTION_PAUSE;
                goto done;
            }
            if (in_list(c->strip, c->n_strip, k, kn)) drop = 1;
            else if (in_list(c->prefixes, c->n_prefixes, k, kn)) drop = !(t && in_list(t->allowed, t->n_allowed, k, kn));
            else if (t && t->strict) drop = !tenant_allows(t, c, k, kn) && !str_eq(c->priority_header, k, kn);
            if (requested < 0 && str_eq(c->priority_header, k, kn))
                for (int j = 0; j < c->n_priority; j++)
                    if (str_ieq(c->priority[j].key, hs[i].v, hs[i].vn)) { requested = c->priority[j].cls; break; }
            if (!have_alpn && c->alpn_header.n && str_eq(c->alpn_header, k, kn)) {
                have_alpn = 1;   /* Envoy's, never the client's: the listener removed and set it */
                for (int j = 0; j < c->n_alpn; j++)
                    if (str_eq(c->alpn_map[j].key, hs[i].v, hs[i].vn)) { alpn_class = c->alpn_map[j].cls; break; }
            }
        }
        if (drop) dropped[n_dropped++] = i;
    }
    if (n_request_id > 1) {   /* the backend could not tell which one was signed */
        local_reply(400, "mcp_header_contract_request_id", "x-request-id appears more than once\n");
        action = ACTION_PAUSE;
        goto done;
    }


    /* 3. QoS: asked (the route's, else the priority header, else the TLS ALPN, else the
     * protocol: plaintext, h2c) capped by the tier's ceiling. A route an L7SchedulingPolicy
     * made carries its class in the route's metadata: the operator's word, over the client's. */
    if (c->n_route_class_path &&
        get_property(c->route_class_path, c->n_route_class_path, NULL, &routed, &rn) == 0) {
        int k = class_index(c, routed, rn);
        if (k >= 0) requested = k;
    }
    if (requested < 0 && have_alpn) requested = alpn_class;
    else if (requested < 0 && c->n_protocol_path &&
        get_property(c->protocol_path, c->n_protocol_path, NULL, &proto, &pn) == 0)
        for (int j = 0; j < c->n_protocol; j++)
            if (str_eq(c->protocol_map[j].key, proto, pn)) { requested = c->protocol_map[j].cls; break; }
    if (requested < 0) requested = c->default_class;
    int ceiling = c->ceiling_class;
    const char *tier;
    size_t tn;
    if (c->tier_claim.n && find_claim(payload, payload_n, c->tier_claim, &tier, &tn) > 0)
        for (int j = 0; j < c->n_tiers; j++)
            if (str_eq(c->tiers[j].key, tier, tn)) { ceiling = c->tiers[j].cls; break; }
    /* a larger level is a lower priority: take the lower of asked and allowed */
    int cls = c->classes[requested].level >= c->classes[ceiling].level ? requested : ceiling;
    uint64_t now_ns = 0;
    proxy_get_current_time_nanoseconds(&now_ns);
    /* the decision loop's remap, until it expires; the remapped class is the one signed */
    for (int j = 0; j < c->n_remaps; j++)
        if (c->remaps[j].from == cls && (int64_t)now_ns < c->remaps[j].until_ns) { cls = c->remaps[j].to; break; }
    str_t qos = c->classes[cls].name;

    /* 4. The session headers, the class and the verified identity. */
    for (int i = 0; i < c->n_claims; i++) {
        if (!claim_val[i]) continue;
        int dup = 0;   /* two claims mapped to one header: the first wins */
        for (int j = 0; j < i; j++) if (claim_val[j] && str_eq(c->claims[j].header, c->claims[i].header.p, c->claims[i].header.n)) dup = 1;
        if (dup) { claim_val[i] = NULL; continue; }
        out[no].k = c->claims[i].header.p; out[no].kn = c->claims[i].header.n;
        out[no].v = claim_val[i]; out[no].vn = claim_n[i]; no++;
    }
    out[no].k = c->qos_header.p; out[no].kn = c->qos_header.n; out[no].v = qos.p; out[no].vn = qos.n; no++;
    if (c->identity_header.n && get_property(c->identity_path, c->n_identity_path, NULL, &id, &idn) == 0 &&
        idn && is_header_value(id, idn)) {
        out[no].k = c->identity_header.p; out[no].kn = c->identity_header.n; out[no].v = id; out[no].vn = idn; no++;
    }

    /* 5. Sign what was set (mesh.session's v2 canonical form), bound to this
     * request: issue time, method, x-request-id. Always, so that even an
     * anonymous request's QoS class cannot be upgraded by L7 or replayed. */
    char issued[21];   /* decimal unix seconds */
    size_t in = sizeof issued;
    uint64_t secs = now_ns / 1000000000ull;
    do { issued[--in] = (char)('0' + secs % 10); secs /= 10; } while (secs);
    const char *ip = issued + in;
    size_t il = sizeof issued - in;
    hmac_sha256_ctx m = c->hmac;   /* key pads hashed once, at configure */
    static const char V2[] = "mcp-session-v2\nt:", METHOD[] = "\n:method:", RID[] = "\nx-request-id:";
    hmac_sha256_update(&m, V2, sizeof V2 - 1);
    hmac_sha256_update(&m, ip, il);
    hmac_sha256_update(&m, METHOD, sizeof METHOD - 1);
    hmac_sha256_update(&m, method.p, method.n);
    hmac_sha256_update(&m, RID, sizeof RID - 1);
    hmac_sha256_update(&m, request_id.p, request_id.n);
    hmac_sha256_update(&m, "\n", 1);
    char sig[32 + MAX_SIGNED * (MAX_NAME + 1) + 72];   /* names are <= MAX_NAME (configure checks) */
    size_t sn = 5;
    memcpy(sig, "v2;t=", 5);
    memcpy(sig + sn, ip, il); sn += il;
    memcpy(sig + sn, ";h=", 3); sn += 3;
    for (int s = 0; s < c->n_signed; s++) {
        const str_t *h = &c->signed_hdrs[s];
        const char *val = NULL;
        size_t vn = 0;
        if (str_eq(*h, c->qos_header.p, c->qos_header.n)) { val = qos.p; vn = qos.n; }
        else for (int i = 0; i < c->n_claims; i++)
            if (claim_val[i] && str_eq(c->claims[i].header, h->p, h->n)) { val = claim_val[i]; vn = claim_n[i]; break; }
        if (!val) continue;
        if (sig[sn - 1] != '=') sig[sn++] = ',';
        memcpy(sig + sn, h->p, h->n); sn += h->n;
        hmac_sha256_update(&m, h->p, h->n);
        hmac_sha256_update(&m, ":", 1);
        hmac_sha256_update(&m, val, vn);
        hmac_sha256_update(&m, "\n", 1);
    }
    uint8_t mac[32];
    hmac_sha256_final(&m, mac);
    memcpy(sig + sn, ";s=", 3); sn += 3;
    for (int i = 0; i < 32; i++) { sig[sn++] = "0123456789abcdef"[mac[i] >> 4]; sig[sn++] = "0123456789abcdef"[mac[i] & 15]; }
    out[no].k = c->sig_header.p; out[no].kn = c->sig_header.n; out[no].v = sig; out[no].vn = sn; no++;

    /* Only what changes: one remove per dropped name, one replace per header set.
     * (Measured cheaper in Envoy than proxy_set_header_map_pairs, which removes
     * and re-adds every header.) Envoy clears the route cache on each, so the
     * router re-selects the route on the session headers. */
    for (int i = 0; i < n_dropped; i++) {
        const pair_t *d = &hs[dropped[i]];
        int dup = 0;
        for (int j = 0; j < i; j++) if (hs[dropped[j]].kn == d->kn && memcmp(hs[dropped[j]].k, d->k, d->kn) == 0) { dup = 1; break; }
        if (!dup) proxy_remove_header_map_value(MAP_REQUEST_HEADERS, d->k, d->kn);
    }
    for (int i = 0; i < no; i++)
        if (proxy_replace_header_map_value(MAP_REQUEST_HEADERS, out[i].k, out[i].kn, out[i].v, out[i].vn) != WASM_OK) {
            local_reply(500, "mcp_header_contract_internal", "header contract could not set headers\n");
            action = ACTION_PAUSE;
            break;
        }

done:
    free(id); free(proto); free(payload); free(raw); free(routed);
    return action;
}

/* ----------------------------------------------------- response path */
static int parse_status(const char *p, size_t n, int *out) {
    if (!n || n > 4) return -1;
    int v = 0;
    for (size_t i = 0; i < n; i++) { if (p[i] < '0' || p[i] > '9') return -1; v = v * 10 + (p[i] - '0'); }
    *out = v;
    return 0;
}

static str_t grpc_error_class(const config_t *c, int code) {
    if (code >= 0 && code < MAX_ERR_CODES && c->grpc_class[code].n) return c->grpc_class[code];
    return c->grpc_default;
}

static int map_value(int32_t map, const str_t *name, char **out, size_t *n) {
    *out = NULL; *n = 0;
    if (proxy_get_header_map_value(map, name->p, name->n, out, n) != WASM_OK || !*out) { free(*out); *out = NULL; return -1; }
    return 0;
}

static const str_t GRPC_STATUS = {"grpc-status", 11};

EXPORT(proxy_on_response_headers) int32_t proxy_on_response_headers(uint32_t ctx, uint32_t num_headers, int32_t eos) {
    (void)num_headers;
    config_t *c = config_for(ctx);
    if (!c) return ACTION_CONTINUE;
    static pair_t hs[MAX_HEADERS];
    char *raw = NULL;
    size_t raw_n = 0;
    int n = -1, code, status = -1, grpc = -1, is_grpc = 0;
    if (proxy_get_header_map_pairs(MAP_RESPONSE_HEADERS, &raw, &raw_n) == WASM_OK && raw)
        n = parse_pairs(raw, raw_n, hs, MAX_HEADERS);
    for (int i = 0; i < n; i++) {
        str_t k = {hs[i].k, (uint32_t)hs[i].kn};
        if (str_eq(k, ":status", 7)) { if (parse_status(hs[i].v, hs[i].vn, &code) == 0) status = code; }
        else if (str_eq(k, "grpc-status", 11)) grpc = parse_status(hs[i].v, hs[i].vn, &code) == 0 ? code : 99;
        else if (str_eq(k, "content-type", 12)) is_grpc = hs[i].vn >= 16 && memcmp(hs[i].v, "application/grpc", 16) == 0;
    }
    free(raw);
    str_t cls = {0, 0};
    if (grpc >= 0) {                          /* trailers-only gRPC response */
        cls = grpc_error_class(c, grpc);
    } else if (is_grpc && !eos) {
        /* the class comes with the trailers; an upstream's own copy never passes */
    } else if (status >= 0) {
        cls = status < 400 ? c->http_ok : status < 500 ? c->http_4xx : c->http_5xx;
        for (int i = 0; i < c->n_http; i++) if (c->http_code[i] == status) { cls = c->http_class[i]; break; }
    }
    if (cls.n) proxy_replace_header_map_value(MAP_RESPONSE_HEADERS, c->error_header.p, c->error_header.n, cls.p, cls.n);
    else proxy_remove_header_map_value(MAP_RESPONSE_HEADERS, c->error_header.p, c->error_header.n);
    return ACTION_CONTINUE;
}

EXPORT(proxy_on_response_trailers) int32_t proxy_on_response_trailers(uint32_t ctx, uint32_t num_trailers) {
    (void)num_trailers;
    config_t *c = config_for(ctx);
    if (!c) return ACTION_CONTINUE;
    char *v = NULL;
    size_t vn = 0;
    int code;
    if (map_value(MAP_RESPONSE_TRAILERS, &GRPC_STATUS, &v, &vn) == 0) {
        str_t cls = parse_status(v, vn, &code) == 0 ? grpc_error_class(c, code) : c->grpc_default;
        proxy_replace_header_map_value(MAP_RESPONSE_TRAILERS, c->error_header.p, c->error_header.n, cls.p, cls.n);
    }
    free(v);
    return ACTION_CONTINUE;
}

EXPORT(proxy_on_done) int32_t proxy_on_done(uint32_t ctx) { (void)ctx; return 1; }

EXPORT(proxy_on_delete) void proxy_on_delete(uint32_t ctx) {
    root_t *r = find_root(ctx);
    if (r) {   /* a plugin went away */
        free_config(r->cfg);
        *r = roots[--n_roots];
        return;
    }
    slot_del(ctx);
}
