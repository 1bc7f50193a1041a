/* In-place JSON parser (RFC 8259), iterative over a bounded depth. */
#include "json.h"

#include <string.h>

#define MAX_DEPTH 16

typedef struct {
    char *p, *end;
    json_node *n;
    int used, max;
    const char *err;
} parser;

static int fail(parser *ps, const char *msg) { if (!ps->err) ps->err = msg; return -1; }

static void ws(parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

static int new_node(parser *ps, uint8_t type) {
    if (ps->used >= ps->max) return fail(ps, "configuration too large (JSON nodes)");
    json_node *n = &ps->n[ps->used];
    memset(n, 0, sizeof *n);
    n->type = type; n->first = -1; n->next = -1;
    return ps->used++;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Unescapes in place: the output never outgrows the escaped input. */
static int parse_string(parser *ps) {
    int id = new_node(ps, J_STR);
    if (id < 0) return -1;
    char *out = ++ps->p, *start = out;   /* skip the opening quote */
    while (1) {
        if (ps->p >= ps->end) return fail(ps, "unterminated string");
        unsigned char c = (unsigned char)*ps->p++;
        if (c == '"') break;
        if (c < 0x20) return fail(ps, "control character in string");
        if (c != '\\') { *out++ = (char)c; continue; }
        if (ps->p >= ps->end) return fail(ps, "unterminated escape");
        char e = *ps->p++;
        switch (e) {
        case '"': *out++ = '"'; break;
        case '\\': *out++ = '\\'; break;
        case '/': *out++ = '/'; break;
        case 'b': *out++ = '\b'; break;
        case 'f': *out++ = '\f'; break;
        case 'n': *out++ = '\n'; break;
        case 'r': *out++ = '\r'; break;
        case 't': *out++ = '\t'; break;
        case 'u': {
            if (ps->end - ps->p < 4) return fail(ps, "short \\u escape");
            int v = 0;
            for (int i = 0; i < 4; i++) {
                int h = hexval(ps->p[i]);
                if (h < 0) return fail(ps, "bad \\u escape");
                v = v * 16 + h;
            }
            ps->p += 4;
            if (v >= 0xd800 && v <= 0xdfff) return fail(ps, "surrogate \\u escapes are not supported");
            if (v < 0x80) *out++ = (char)v;
            else if (v < 0x800) { *out++ = (char)(0xc0 | v >> 6); *out++ = (char)(0x80 | (v & 0x3f)); }
            else { *out++ = (char)(0xe0 | v >> 12); *out++ = (char)(0x80 | ((v >> 6) & 0x3f)); *out++ = (char)(0x80 | (v & 0x3f)); }
            break;
        }
        default: return fail(ps, "bad escape");
        }
    }
    ps->n[id].str = start;
    ps->n[id].len = (uint32_t)(out - start);
    return id;
}

static int parse_number(parser *ps) {
    int id = new_node(ps, J_NUM);
    if (id < 0) return -1;
    char *s = ps->p;
    int neg = 0, digits = 0, is_int = 1;
    int64_t v = 0;
    if (ps->p < ps->end && *ps->p == '-') { neg = 1; ps->p++; }
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        if (v > (INT64_MAX - 9) / 10) is_int = 0; else v = v * 10 + (*ps->p - '0');
        ps->p++; digits++;
    }
    if (!digits) return fail(ps, "bad number");
    if (digits > 1 && s[neg] == '0') return fail(ps, "leading zero in number");
    if (ps->p < ps->end && *ps->p == '.') {
        is_int = 0; ps->p++;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail(ps, "bad number");
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') ps->p++;
    }
    if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
        is_int = 0; ps->p++;
        if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-')) ps->p++;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail(ps, "bad number");
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') ps->p++;
    }
    ps->n[id].num = neg ? -v : v;
    ps->n[id].is_int = (uint8_t)is_int;
    return id;
}

static int literal(parser *ps, const char *word, uint8_t type, int64_t v) {
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0) return fail(ps, "unexpected token");
    ps->p += n;
    int id = new_node(ps, type);
    if (id >= 0) ps->n[id].num = v;
    return id;
}

static int parse_value(parser *ps, int depth);

static int parse_container(parser *ps, int depth, int is_obj) {
    if (depth >= MAX_DEPTH) return fail(ps, "configuration nested too deeply");
    int id = new_node(ps, is_obj ? J_OBJ : J_ARR);
    if (id < 0) return -1;
    char close = is_obj ? '}' : ']';
    ps->p++;
    ws(ps);
    if (ps->p < ps->end && *ps->p == close) { ps->p++; return id; }
    int prev = -1;
    while (1) {
        ws(ps);
        int child;
        if (is_obj) {
            if (ps->p >= ps->end || *ps->p != '"') return fail(ps, "expected a string key");
            int key = parse_string(ps);
            if (key < 0) return -1;
            ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') return fail(ps, "expected ':'");
            ps->p++;
            ws(ps);
            int val = parse_value(ps, depth + 1);
            if (val < 0) return -1;
            ps->n[key].next = val;
            child = key;
            if (prev >= 0) ps->n[prev].next = key; else ps->n[id].first = key;
            prev = val;
        } else {
            child = parse_value(ps, depth + 1);
            if (child < 0) return -1;
            if (prev >= 0) ps->n[prev].next = child; else ps->n[id].first = child;
            prev = child;
        }
        ps->n[id].len++;
        ws(ps);
        if (ps->p >= ps->end) return fail(ps, "unterminated container");
        if (*ps->p == ',') { ps->p++; continue; }
        if (*ps->p == close) { ps->p++; return id; }
        return fail(ps, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int parse_value(parser *ps, int depth) {
    ws(ps);
    if (ps->p >= ps->end) return fail(ps, "unexpected end of input");
    switch (*ps->p) {
    case '{': return parse_container(ps, depth, 1);
    case '[': return parse_container(ps, depth, 0);
    case '"': return parse_string(ps);
    case 't': return literal(ps, "true", J_BOOL, 1);
    case 'f': return literal(ps, "false", J_BOOL, 0);
    case 'n': return literal(ps, "null", J_NULL, 0);
    default: return parse_number(ps);
    }
}

int json_parse(char *buf, size_t len, json_node *nodes, int max_nodes, const char **err) {
    parser ps = {buf, buf + len, nodes, 0, max_nodes, NULL};
    int root = parse_value(&ps, 0);
    if (root >= 0) {
        ws(&ps);
        if (ps.p != ps.end) root = fail(&ps, "trailing data after JSON value");
    }
    *err = ps.err;
    return root < 0 ? -1 : 0;
}

const json_node *json_get(const json_node *nodes, const json_node *obj, const char *key) {
    if (!obj || obj->type != J_OBJ) return NULL;
    size_t kl = strlen(key);
    for (const json_node *k = JSON_CHILD(nodes, obj); k; ) {
        const json_node *v = JSON_NEXT(nodes, k);
        if (k->len == kl && memcmp(k->str, key, kl) == 0) return v;
        k = v ? JSON_NEXT(nodes, v) : NULL;
    }
    return NULL;
}
