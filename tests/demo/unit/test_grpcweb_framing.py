"""gRPC-Web framing logic of the test client (demo/stack/grpcweb.py)."""
import base64

import pytest
from hypothesis import given, strategies as st

from mcp26.demo.stack.grpcweb import (FrameDecoder, FramingError, TextDecoder, encode_frame, encode_trailers,
                             parse_trailers)


def test_frame_header_is_flags_then_big_endian_length():
    assert encode_frame(b"abc") == b"\x00\x00\x00\x00\x03abc"
    assert encode_frame(b"", 0x80) == b"\x80\x00\x00\x00\x00"


@given(st.lists(st.binary(max_size=300), max_size=6), st.lists(st.integers(1, 50), min_size=1, max_size=20))
def test_decoder_reassembles_frames_split_anywhere(payloads, cuts):
    body = b"".join(encode_frame(p) for p in payloads) + encode_trailers({"grpc-status": "0"})
    dec, frames, i, k = FrameDecoder(), [], 0, 0
    while i < len(body):
        step = cuts[k % len(cuts)]
        frames += dec.feed(body[i:i + step])
        i, k = i + step, k + 1
    dec.close()
    assert [f.payload for f in frames if not f.is_trailers] == payloads
    assert frames[-1].is_trailers and parse_trailers(frames[-1].payload) == {"grpc-status": "0"}


def test_truncated_frame_is_an_error_at_end_of_body():
    dec = FrameDecoder()
    assert dec.feed(b"\x00\x00\x00\x00\x64abc") == []  # says 100 bytes, has 3
    with pytest.raises(FramingError, match="ends inside a frame"):
        dec.close()


def test_reserved_flag_bits_are_rejected():
    with pytest.raises(FramingError, match="reserved flag"):
        FrameDecoder().feed(b"\x42\x00\x00\x00\x00")


def test_trailer_block_names_are_lower_cased_and_values_trimmed():
    block = b"Grpc-Status: 5\r\ngrpc-message: model%20not%20found\r\n"
    assert parse_trailers(block) == {"grpc-status": "5", "grpc-message": "model%20not%20found"}
    with pytest.raises(FramingError):
        parse_trailers(b"no colon here\r\n")


@given(st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=5), st.integers(1, 7))
def test_text_decoder_accepts_separately_padded_chunks(chunks, step):
    # As Envoy's grpc_web filter sends -text replies: each body chunk base64'd on its own.
    wire = b"".join(base64.b64encode(c) for c in chunks)
    dec, out = TextDecoder(), b""
    for i in range(0, len(wire), step):
        out += dec.feed(wire[i:i + step])
    dec.close()
    assert out == b"".join(chunks)


def test_text_decoder_rejects_non_base64():
    with pytest.raises(FramingError, match="invalid base64"):
        TextDecoder().feed(b"!!!!")
