#ifndef MCP_PROXY_WASM_H
#define MCP_PROXY_WASM_H
/* The host functions of Proxy-Wasm ABI 0.2.1 this filter imports
 * (github.com/proxy-wasm/spec, abi-versions/v0.2.1). */
#include <stddef.h>
#include <stdint.h>

#define IMPORT(name) __attribute__((import_module("env"), import_name(#name)))

typedef int32_t wasm_result;   /* 0 Ok, 1 NotFound, 2 BadArgument, ... */
enum { WASM_OK = 0, WASM_NOT_FOUND = 1 };

enum { LOG_TRACE, LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_CRITICAL };
enum { MAP_REQUEST_HEADERS = 0, MAP_REQUEST_TRAILERS = 1, MAP_RESPONSE_HEADERS = 2, MAP_RESPONSE_TRAILERS = 3 };
enum { BUFFER_VM_CONFIGURATION = 6, BUFFER_PLUGIN_CONFIGURATION = 7 };
enum { ACTION_CONTINUE = 0, ACTION_PAUSE = 1 };

IMPORT(proxy_log) wasm_result proxy_log(int32_t level, const char *msg, size_t size);
IMPORT(proxy_get_buffer_bytes) wasm_result proxy_get_buffer_bytes(int32_t type, size_t start, size_t max,
                                                                  char **ret, size_t *ret_size);
IMPORT(proxy_get_header_map_pairs) wasm_result proxy_get_header_map_pairs(int32_t map, char **ret, size_t *ret_size);
IMPORT(proxy_get_header_map_value) wasm_result proxy_get_header_map_value(int32_t map, const char *key, size_t key_size,
                                                                          char **ret, size_t *ret_size);
IMPORT(proxy_add_header_map_value) wasm_result proxy_add_header_map_value(int32_t map, const char *key, size_t key_size,
                                                                          const char *val, size_t val_size);
IMPORT(proxy_replace_header_map_value) wasm_result proxy_replace_header_map_value(int32_t map, const char *key,
                                                                                  size_t key_size, const char *val,
                                                                                  size_t val_size);
IMPORT(proxy_remove_header_map_value) wasm_result proxy_remove_header_map_value(int32_t map, const char *key,
                                                                                size_t key_size);
IMPORT(proxy_get_property) wasm_result proxy_get_property(const char *path, size_t path_size, char **ret,
                                                          size_t *ret_size);
IMPORT(proxy_send_local_response) wasm_result proxy_send_local_response(uint32_t status, const char *details,
                                                                        size_t details_size, const char *body,
                                                                        size_t body_size, const char *headers,
                                                                        size_t headers_size, int32_t grpc_status);
IMPORT(proxy_get_current_time_nanoseconds) wasm_result proxy_get_current_time_nanoseconds(uint64_t *ret);

#endif
