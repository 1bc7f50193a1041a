"""HPACK (RFC 7541) header-block decoding for the HTTP/2 connection, raw bytes in and out.

Why not hpack.Decoder: the gRPC lane decodes one block per call, and the
package's decoder (HeaderTuple objects, str checks, per-field size bookkeeping)
was ~10 % of the server's CPU at relu gRPC c=64. This one keeps the package's
static table and Huffman decoder and does the rest in a single loop.
"""
from __future__ import annotations

import collections

from hpack.exceptions import HPACKDecodingError, InvalidTableIndex
from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

STATIC = HeaderTable.STATIC_TABLE       # 61 (name, value) pairs, index 1..61
ENTRY_OVERHEAD = 32                     # RFC 7541 4.1
SEEN_BLOCKS = 16                        # blocks remembered per connection (Decoder.seen): 8 KiB at most
SEEN_BLOCK_BYTES = 512                  # the largest remembered (a repeated call's block is ~20-200)


class BlockTooLarge(Exception):
    """A block past the decoder's hard caps (`what`: "header_fields" or "header_decoded"):
    decoding stopped there, so the table is no longer the peer's and the connection must end."""

    def __init__(self, what: str, why: str):
        super().__init__(why)
        self.what = what


class Decoder:
    """One connection's decoding context: its dynamic table, at most `max_table` bytes
    (our SETTINGS_HEADER_TABLE_SIZE, the default 4,096), and a cap on a block's
    decoded size (`max_list`, as SETTINGS_MAX_HEADER_LIST_SIZE counts it).

    A block over the cap is still read to its end, so that the table stays the
    peer's (the connection lives on; only that request is refused), but the fields
    past the cap are not kept: `oversized` is set and the list is cut there. (Small
    indexes naming large table entries would otherwise inflate a 64 KiB block to
    hundreds of MB.)

    Reading a block whole costs Python time per field (~0.5 µs a one-byte reference), so a
    block is read whole only up to `max_fields` fields and `max_decoded` decoded bytes:
    past either, BlockTooLarge (an HPACK bomb: 60 KB of one-byte references took 48 ms
    of the loop when every field was walked)."""

    def __init__(self, max_list: int, max_table: int = 4096, max_fields: int = 1000,
                 max_decoded: int = 256 << 10):
        self.max_list = max_list
        self.max_fields, self.max_decoded = max_fields, max_decoded
        self.max_table = self.table_limit = max_table
        self.table: collections.deque = collections.deque()    # newest first
        self.table_size = 0
        self.oversized = False              # the last block went over max_list
        self.changes = 0                    # table changes so far (an insertion, a size update)
        # Blocks that changed nothing, by their bytes: (changes then, fields, oversized). A client
        # repeating a call sends the same bytes once its fields are indexed (or never are), and
        # while the table is as it was they decode to the same fields.
        self.seen: dict[bytes, tuple[int, list, bool]] = {}

    def decode(self, data: bytes) -> list[tuple[bytes, bytes]]:
        """The block's fields; callers must not change the list (it may be handed out again)."""
        hit = self.seen.get(data)
        if hit is not None and hit[0] == self.changes:
            self.oversized = hit[2]
            return hit[1]
        before = self.changes
        out = self._decode(data)
        if self.changes == before and len(data) <= SEEN_BLOCK_BYTES:
            if len(self.seen) >= SEEN_BLOCKS:
                self.seen.clear()
            self.seen[data] = (before, out, self.oversized)
        return out

    def _decode(self, data: bytes) -> list[tuple[bytes, bytes]]:
        self.oversized = False
        out = []
        i, n, total, fields = 0, len(data), 0, 0
        while i < n:
            b = data[i]
            if b & 0x80:                            # indexed field
                index, i = _int(data, i, 7)
                name, value = self._get(index)
            elif b & 0x40:                          # literal, added to the table
                index, i = _int(data, i, 6)
                name, i = (self._get(index)[0], i) if index else _str(data, i)
                value, i = _str(data, i)
                self._add(name, value)
            elif b & 0x20:                          # dynamic table size update
                if fields:          # RFC 7541 4.2: only at the start of a block
                    raise HPACKDecodingError("dynamic table size update after a field")
                size, i = _int(data, i, 5)
                if size > self.max_table:
                    raise HPACKDecodingError(f"table size update to {size} over {self.max_table}")
                self.table_limit = size
                self.changes += 1
                self._shrink()
                continue
            else:                                   # literal without indexing / never indexed
                index, i = _int(data, i, 4)
                name, i = (self._get(index)[0], i) if index else _str(data, i)
                value, i = _str(data, i)
            fields += 1
            total += len(name) + len(value) + ENTRY_OVERHEAD
            if total > self.max_list:
                self.oversized = True
                if fields > self.max_fields:
                    raise BlockTooLarge("header_fields", f"over {self.max_fields} fields in one header block")
                if total > self.max_decoded:
                    raise BlockTooLarge("header_decoded", f"over {self.max_decoded} decoded bytes in one header block")
            else:
                out.append((name, value))
        return out

    def _get(self, index: int) -> tuple[bytes, bytes]:
        if 0 < index <= 61:
            return STATIC[index - 1]
        if 61 < index <= 61 + len(self.table):
            return self.table[index - 62]
        raise InvalidTableIndex(f"index {index} not in the table")

    def _add(self, name: bytes, value: bytes) -> None:
        self.changes += 1
        size = len(name) + len(value) + ENTRY_OVERHEAD
        if size > self.table_limit:     # an entry too large empties the table (RFC 7541 4.4)
            self.table.clear()
            self.table_size = 0
            return
        self.table.appendleft((name, value))
        self.table_size += size
        self._shrink()

    def _shrink(self) -> None:
        while self.table_size > self.table_limit:
            name, value = self.table.pop()
            self.table_size -= len(name) + len(value) + ENTRY_OVERHEAD


def _int(data: bytes, i: int, prefix: int) -> tuple[int, int]:
    """RFC 7541 5.1: the integer at data[i] in a `prefix`-bit prefix, and the index after it."""
    mask = (1 << prefix) - 1
    value = data[i] & mask
    i += 1
    if value < mask:
        return value, i
    shift = 0
    while True:
        if i >= len(data) or shift > 28:
            raise HPACKDecodingError("integer truncated or too large")
        b = data[i]
        i += 1
        value += (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def _str(data: bytes, i: int) -> tuple[bytes, int]:
    """RFC 7541 5.2: a string literal (Huffman-coded when its H bit is set)."""
    if i >= len(data):
        raise HPACKDecodingError("string truncated")
    huffman = data[i] & 0x80
    length, i = _int(data, i, 7)
    end = i + length
    if end > len(data):
        raise HPACKDecodingError("string truncated")
    raw = data[i:end]
    return (decode_huffman(raw) if huffman else raw), end
