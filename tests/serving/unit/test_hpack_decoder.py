"""serving.h2.hpack_decoder: RFC 7541's own examples, the hpack package's
decoder on the same encoded blocks, and the errors h2_server turns into GOAWAY."""
import random

import pytest
from hpack import Decoder as PackageDecoder, Encoder, NeverIndexedHeaderTuple
from hpack.exceptions import HPACKError

from mcp26.serving.h2.hpack_decoder import Decoder


def test_rfc7541_appendix_c3_and_c4_requests_decode_with_the_shared_table():
    d = Decoder(1 << 16)
    assert d.decode(bytes.fromhex("828684410f7777772e6578616d706c652e636f6d")) == [
        (b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"), (b":authority", b"www.example.com")]
    assert d.decode(bytes.fromhex("828684be58086e6f2d6361636865")) == [
        (b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"), (b":authority", b"www.example.com"),
        (b"cache-control", b"no-cache")]
    assert d.decode(bytes.fromhex("828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565")) == [
        (b":method", b"GET"), (b":scheme", b"https"), (b":path", b"/index.html"),
        (b":authority", b"www.example.com"), (b"custom-key", b"custom-value")]
    assert d.table_size == 164        # C.3.3's table: 3 entries, 164 octets
    huffman = Decoder(1 << 16)        # C.4.1: the authority Huffman-coded
    assert huffman.decode(bytes.fromhex("828684418cf1e3c2e5f23a6ba0ab90f4ff"))[-1] == (b":authority", b"www.example.com")


def test_same_headers_as_the_hpack_package_over_3000_random_blocks():
    rnd = random.Random(7)
    enc, ref, ours = Encoder(), PackageDecoder(), Decoder(1 << 20)
    for i in range(3000):
        if i % 400 == 0:     # table size updates, down to 0 and back
            enc.header_table_size = rnd.choice([0, 64, 2000, 4096])
        headers = [(":method", "POST"), (":path", f"/s/M{rnd.randint(0, 40)}"),
                   ("grpc-timeout", f"{rnd.randint(1, 99999999)}u"), (f"x-{rnd.randint(0, 300)}", "v" * rnd.randint(0, 300))]
        if rnd.random() < 0.3:
            headers.append(NeverIndexedHeaderTuple("authorization", "s" * rnd.randint(1, 40)))
        block = enc.encode(headers, huffman=rnd.random() < 0.5)
        assert ours.decode(block) == [(bytes(k), bytes(v)) for k, v in ref.decode(block, raw=True)], i


@pytest.mark.parametrize("block", [
    bytes([0x80]),                      # index 0
    bytes([0xBE]),                      # index 62: the dynamic table is empty
    bytes([0x40, 0x05, 0x61]),          # a name shorter than its length
    bytes([0x3F, 0xE2, 0x1F]),          # a table size update to 4,097: over our 4,096
    bytes([0x82, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]),   # an integer that never ends
])
def test_malformed_blocks_raise_an_hpack_error(block):
    with pytest.raises(HPACKError):
        Decoder(1 << 16).decode(block)


def test_a_header_list_over_the_limit_is_cut_and_flagged_and_the_table_stays_in_sync():
    enc = Encoder()
    first = enc.encode([("x-big", "v" * 2000), ("x-after", "a")], huffman=False)   # both added to the table
    second = enc.encode([("x-big", "v" * 2000), ("x-after", "a")], huffman=False)  # two indexes into it
    assert len(second) == 2
    d = Decoder(1024)
    assert d.decode(first) == [] and d.oversized
    assert d.decode(b"\x82") == [(b":method", b"GET")] and not d.oversized
    d.max_list = 4096
    assert d.decode(second) == [(b"x-big", b"v" * 2000), (b"x-after", b"a")]


def test_a_repeated_block_decodes_against_the_table_as_it_is_now():
    """Decoder.seen hands a block that changed nothing its earlier fields only while the table is
    unchanged: an index names another entry once something is inserted or the size shrinks."""
    d = Decoder(1 << 16)
    d.decode(b"\x40\x03x-a\x011")                          # x-a: 1, inserted (index 62)
    again = b"\x82\xbe"                                     # :method GET, index 62
    assert d.decode(again) == [(b":method", b"GET"), (b"x-a", b"1")]
    assert d.decode(again) == [(b":method", b"GET"), (b"x-a", b"1")]    # the remembered fields
    d.decode(b"\x40\x03x-b\x012")                          # x-b: 2 now at 62, x-a at 63
    assert d.decode(again) == [(b":method", b"GET"), (b"x-b", b"2")]
    d.decode(b"\x20")                                       # a size update to 0 empties the table
    with pytest.raises(HPACKError):
        d.decode(again)
    over = Decoder(50)                                      # a block over the list cap, remembered
    big = b"\x00\x05x-big\x14" + b"v" * 20                 # literal, not indexed: 57 bytes as counted
    assert over.decode(big) == [] and over.oversized
    assert over.decode(b"\x82") and not over.oversized
    assert over.decode(big) == [] and over.oversized       # flagged again when handed out again
