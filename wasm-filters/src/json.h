#ifndef MCP_JSON_H
#define MCP_JSON_H
/* A small JSON parser for the filter's configuration: parses in place
 * (strings are unescaped inside the caller's buffer) into a caller-given
 * node array, so a configuration costs one buffer and one node table. */
#include <stddef.h>
#include <stdint.h>

enum json_type { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

typedef struct {
    uint8_t type;
    uint8_t is_int;      /* J_NUM: an integer without fraction or exponent */
    uint32_t len;        /* J_STR: bytes; J_ARR/J_OBJ: children (objects: key+value pairs count once) */
    const char *str;     /* J_STR */
    int64_t num;         /* J_NUM (integers) / J_BOOL */
    int32_t first;       /* J_ARR/J_OBJ: first child; objects alternate key, value */
    int32_t next;        /* next sibling (the value after a key, or the next key) */
} json_node;

/* 0 on success (nodes[0] is the root); else -1 with *err set. */
int json_parse(char *buf, size_t len, json_node *nodes, int max_nodes, const char **err);

/* Object member by key, or NULL. */
const json_node *json_get(const json_node *nodes, const json_node *obj, const char *key);
#define JSON_CHILD(nodes, n) ((n)->first >= 0 ? &(nodes)[(n)->first] : NULL)
#define JSON_NEXT(nodes, n) ((n)->next >= 0 ? &(nodes)[(n)->next] : NULL)

#endif
