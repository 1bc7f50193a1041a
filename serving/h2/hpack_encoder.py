"""HPACK (RFC 7541) encoding as both ends here use it: literals never added to the table.

What the server and mcp-bench's client send is never indexed, so neither keeps an
encoder table and the peer's SETTINGS_HEADER_TABLE_SIZE does not matter; a block
is bytes put together once (a status, a content-type) and reused. No Huffman:
the blocks are short and mostly the same bytes each call.
"""
from __future__ import annotations


def hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """RFC 7541 5.1: `value` in a prefix of `prefix_bits`, `first` holding the byte's other bits."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal never added to the table (RFC 7541 6.2.2), no Huffman."""
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


def named_literal(index: int, value: bytes) -> bytes:
    """A field, not indexed, whose name is static-table entry `index` (RFC 7541 6.2.2)."""
    return hpack_int(index, 4) + hpack_int(len(value), 7) + value


STATUS_200 = b"\x88"            # :status 200, static table entry 8


def http_status_block(code: int) -> bytes:
    return named_literal(8, str(code).encode())     # :status, name from the static table (8)
